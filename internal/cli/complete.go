package cli

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// What a positional argument names, for shell completion.
type argKind int

const (
	argNone       argKind = iota
	argVolume             // a volume
	argSnapshot           // a snapshot of the volume named by the first argument
	argDisk               // a disk of the volume named by the first argument
	argAttachment         // an attachment ID of the volume named by the first argument
	argSource             // a clone source: VOLUME or VOLUME@SNAPSHOT
	argJob                // a job ID
)

// completions says what each positional argument of a command names, by
// the command's path below the root. Shell completion (`quiver completion
// bash|zsh|fish`) asks the server for the names.
var completions = map[string][]argKind{
	"volume get":      {argVolume},
	"volume delete":   {argVolume},
	"volume grow":     {argVolume},
	"volume label":    {argVolume},
	"volume qos":      {argVolume},
	"volume stats":    {argVolume},
	"volume export":   {argVolume},
	"volume du":       {argVolume},
	"disk add":        {argVolume},
	"disk grow":       {argVolume, argDisk},
	"disk remove":     {argVolume, argDisk},
	"snapshot create": {argVolume},
	"snapshot list":   {argVolume},
	"snapshot get":    {argVolume, argSnapshot},
	"snapshot delete": {argVolume, argSnapshot},
	"rollback":        {argVolume, argSnapshot},
	"clone":           {argSource},
	"attach create":   {argVolume},
	"attach list":     {argVolume},
	"attach get":      {argVolume, argAttachment},
	"attach delete":   {argVolume, argAttachment},
	"attach writer":   {argVolume, argAttachment},
	"job get":         {argJob},
	"job cancel":      {argJob},
}

// completeTimeout bounds the server's answer: a shell waits for it.
const completeTimeout = 3 * time.Second

// addCompletions sets the completion of every command in completions.
func (a *app) addCompletions(root *cobra.Command) {
	for path, kinds := range completions {
		cmd, _, err := root.Find(strings.Fields(path))
		if err != nil || cmd == root {
			panic("completions: no command " + path) // a test runs every entry
		}
		cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(args) >= len(kinds) || kinds[len(args)] == argNone {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return a.names(cmd.Context(), kinds[len(args)], args, toComplete), cobra.ShellCompDirectiveNoFileComp
		}
	}
}

// names lists the names of kind that start with prefix; on any error none,
// as a shell cannot show one.
func (a *app) names(ctx context.Context, kind argKind, args []string, prefix string) []string {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completeTimeout)
	defer cancel()
	c, err := a.client()
	if err != nil {
		return nil
	}
	var names []string
	switch kind {
	case argVolume:
		vols, _ := c.ListVolumes(ctx, "")
		for _, v := range vols {
			names = append(names, v.Name)
		}
	case argSnapshot:
		snaps, _ := c.ListSnapshots(ctx, args[0])
		for _, s := range snaps {
			names = append(names, s.Name)
		}
	case argDisk:
		v, err := c.GetVolume(ctx, args[0])
		if err == nil {
			for _, d := range v.Disks {
				names = append(names, d.Name)
			}
		}
	case argAttachment:
		atts, _ := c.ListAttachments(ctx, args[0])
		for _, at := range atts {
			names = append(names, at.ID)
		}
	case argJob:
		jobs, _ := c.ListJobs(ctx)
		for _, j := range jobs {
			names = append(names, j.ID)
		}
	case argSource:
		vols, _ := c.ListVolumes(ctx, "")
		for _, v := range vols {
			names = append(names, v.Name)
		}
		if strings.Contains(prefix, "@") {
			snaps, _ := c.FindSnapshots(ctx, "", "")
			names = names[:0]
			for _, s := range snaps {
				names = append(names, s.Volume+"@"+s.Name)
			}
		}
	}
	out := names[:0]
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}
