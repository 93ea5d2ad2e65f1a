package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/quantity"
)

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots", "snap"},
		Short:   "Take, list and delete whole-VM snapshots of a volume",
	}
	cmd.AddCommand(a.snapshotCreateCommand(), a.snapshotListCommand(),
		a.snapshotGetCommand(), a.snapshotDeleteCommand(), a.snapshotDiffCommand())
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

func (a *app) snapshotDiffCommand() *cobra.Command {
	return a.getter(&cobra.Command{
		Use:   "diff VOLUME@FROM [VOLUME@TO]",
		Short: "Show what changed in each disk since a snapshot (up to another, or now)",
		Long: `Show, disk by disk, the ranges that changed between two snapshots of a volume,
or between a snapshot and the live disks. Every byte that differs is in a
range; a few more may be (changes are tracked per 64 KiB, and per 1 MiB for
writes made just before a crash). -o json lists every range.

Snapshots taken before change tracking existed cannot be a base.`,
		Args: cobra.RangeArgs(1, 2),
	}, func(ctx context.Context, c *client.Client, args []string) (any, func(io.Writer) error, error) {
		vol, from, err := parseSnapshotRef(args[0])
		if err != nil {
			return nil, nil, err
		}
		to := ""
		if len(args) == 2 {
			vol2, snap, err := parseSnapshotRef(args[1])
			if err != nil {
				return nil, nil, err
			}
			if vol2 != vol {
				return nil, nil, fmt.Errorf("%s and %s: a diff is between snapshots of one volume", args[0], args[1])
			}
			to = snap
		}
		ch, err := c.SnapshotChanges(ctx, vol, from, to)
		return ch, changesTable(ch), err
	})
}

// parseSnapshotRef reads VOLUME@SNAPSHOT.
func parseSnapshotRef(s string) (string, string, error) {
	vol, snap, ok := strings.Cut(s, "@")
	if vol == "" || !ok || snap == "" || strings.Contains(snap, "@") {
		return "", "", fmt.Errorf("%q: want VOLUME@SNAPSHOT", s)
	}
	return vol, snap, nil
}

// changesTable prints a diff, one row per disk.
func changesTable(ch api.SnapshotChanges) func(io.Writer) error {
	return func(w io.Writer) error {
		t := newTable(w, "DISK", "SIZE", "CHANGED", "PERCENT", "RANGES", "NOTE")
		for _, d := range ch.Disks {
			note := ""
			switch {
			case d.BaseSize == 0:
				note = "new since " + ch.From
			case d.Whole:
				note = "replaced whole (rollback)"
			case d.BaseSize < d.Size:
				note = "grown from " + quantity.Format(d.BaseSize)
			}
			pct := "0%"
			if d.Size > 0 {
				pct = fmt.Sprintf("%.1f%%", 100*float64(d.Changed)/float64(d.Size))
			}
			t.row(d.Disk, quantity.Format(d.Size), quantity.Format(d.Changed), pct, fmt.Sprint(len(d.Ranges)), note)
		}
		return t.flush()
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
