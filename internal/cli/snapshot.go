package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots", "snap"},
		Short:   "Take, list and delete whole-VM snapshots of a volume",
	}
	cmd.AddCommand(a.snapshotCreateCommand(), a.snapshotListCommand(),
		a.snapshotGetCommand(), a.snapshotDeleteCommand())
	return cmd
}

func (a *app) snapshotCreateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "create VOLUME NAME",
		Short: "Take a crash-consistent snapshot of every disk of a volume",
		Long: `Take a crash-consistent snapshot of every disk of a volume at one instant.

The command waits for the snapshot, showing its progress on a terminal.
Ctrl-C cancels it on the server.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			vol, name := args[0], args[1]
			c, err := a.client()
			if err != nil {
				return err
			}
			job, err := c.StartSnapshot(cmd.Context(), vol, name)
			if err != nil {
				return err
			}
			if _, err := a.wait(cmd.Context(), c, job); err != nil {
				return err
			}
			s, err := c.GetSnapshot(cmd.Context(), vol, name)
			if err != nil {
				return fmt.Errorf("snapshot %s@%s was taken, but reading it back failed: %w", vol, name, err)
			}
			return a.show(cmd.OutOrStdout(), s, a.snapshotTable(s))
		},
	}
}

func (a *app) snapshotListCommand() *cobra.Command {
	var selector string
	cmd := a.getter(&cobra.Command{
		Use:     "list [VOLUME] [-l KEY=VALUE,...]",
		Aliases: []string{"ls"},
		Short:   "List the snapshots of a volume, or of every volume (matching a label selector)",
		Args:    volumeOrSelector(&selector),
	}, func(ctx context.Context, c *client.Client, args []string) (any, func(io.Writer) error, error) {
		var snaps []api.Snapshot
		var err error
		if len(args) == 1 {
			snaps, err = c.ListSnapshots(ctx, args[0])
		} else {
			snaps, err = c.FindSnapshots(ctx, selector, "")
		}
		return api.List[api.Snapshot]{Items: nonNil(snaps)}, a.snapshotTable(snaps...), err
	})
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "with no VOLUME: only volumes matching KEY=VALUE[,KEY=VALUE...]")
	return cmd
}

func (a *app) snapshotGetCommand() *cobra.Command {
	return a.getter(&cobra.Command{
		Use:   "get VOLUME NAME",
		Short: "Show a snapshot with its disks",
		Args:  cobra.ExactArgs(2),
	}, func(ctx context.Context, c *client.Client, args []string) (any, func(io.Writer) error, error) {
		s, err := c.GetSnapshot(ctx, args[0], args[1])
		return s, a.snapshotDetail(s), err
	})
}

func (a *app) snapshotDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "delete VOLUME NAME",
		Aliases: []string{"rm"},
		Short:   "Delete a snapshot",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.DeleteSnapshot(cmd.Context(), args[0], args[1]); err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "snapshot %s@%s deleted", args[0], args[1])
		},
	}
}

// snapshotTable prints snapshots as a table.
func (a *app) snapshotTable(snaps ...api.Snapshot) func(io.Writer) error {
	return func(w io.Writer) error {
		now := a.env.Now()
		header := []string{"NAME", "VOLUME", "DISKS", "METHOD", "GATE-HELD", "AGE"}
		if a.wide() {
			header = append(header, "UID", "CREATED")
		}
		t := newTable(w, header...)
		for _, s := range snaps {
			row := []string{s.Name, s.Volume, formatDisks(s.Disks), s.Method, gateHeld(s.GateHeld), age(now, s.CreatedAt)}
			if a.wide() {
				row = append(row, s.UID, s.CreatedAt.UTC().Format(time.RFC3339))
			}
			t.row(row...)
		}
		return t.flush()
	}
}

// snapshotDetail prints one snapshot with a table of its disks.
func (a *app) snapshotDetail(s api.Snapshot) func(io.Writer) error {
	return func(w io.Writer) error {
		f := newFields(w)
		f.add("Name", s.Name)
		f.add("UID", s.UID)
		f.add("Volume", s.Volume)
		f.add("Method", s.Method)
		f.add("Gate held", gateHeld(s.GateHeld))
		f.add("Created", timestamp(a.env.Now(), s.CreatedAt))
		return printDisks(w, f, s.Disks)
	}
}

// gateHeld renders how long writes were held, to the microsecond.
func gateHeld(d time.Duration) string {
	return d.Round(time.Microsecond).String()
}
