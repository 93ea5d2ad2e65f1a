package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
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
	return &cobra.Command{
		Use:     "list VOLUME",
		Aliases: []string{"ls"},
		Short:   "List the snapshots of a volume",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			snaps, err := c.ListSnapshots(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), api.List[api.Snapshot]{Items: nonNil(snaps)}, a.snapshotTable(snaps...))
		},
	}
}

func (a *app) snapshotGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get VOLUME NAME",
		Short: "Show a snapshot with its disks",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.GetSnapshot(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), s, a.snapshotDetail(s))
		},
	}
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
		t := newTable(w, "NAME", "VOLUME", "DISKS", "METHOD", "GATE-HELD", "AGE")
		for _, s := range snaps {
			t.row(s.Name, s.Volume, formatDisks(s.Disks), s.Method, gateHeld(s.GateHeld), age(now, s.CreatedAt))
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
