package cli

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/quantity"
)

func (a *app) backupCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "backup",
		Aliases: []string{"backups"},
		Short:   "Back up whole VMs to object storage, list, restore, verify and delete backups",
		Long: `Back up whole VMs (every disk at one snapshot's cut) to the server's backup targets:
S3 buckets holding an encrypted, deduplicated repository (docs/backup.md). The first
backup of a volume reads every disk; later ones read only what changed since.`,
	}
	var target string
	cmd.PersistentFlags().StringVar(&target, "target", "", "backup target (when the server has more than one)")
	cmd.AddCommand(a.backupCreateCommand(&target), a.backupListCommand(&target), a.backupGetCommand(&target),
		a.backupRestoreCommand(&target), a.backupVerifyCommand(&target), a.backupDeleteCommand(&target),
		a.backupStatusCommand(), a.backupTargetCommand(), a.backupKeyCommand())
	return cmd
}

func (a *app) backupCreateCommand(target *string) *cobra.Command {
	var full bool
	cmd := &cobra.Command{
		Use:   "create VOLUME",
		Short: "Back up a volume: a snapshot of every disk, stored incrementally",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			job, err := c.StartBackup(cmd.Context(), args[0], api.BackupSpec{Target: *target, Full: full})
			if err != nil {
				return err
			}
			final, err := a.wait(cmd.Context(), c, job)
			if err != nil {
				return err
			}
			if len(final.Result) == 0 {
				return fmt.Errorf("backup job %s ended without naming its backup", final.ID)
			}
			b, err := c.GetBackup(cmd.Context(), *target, final.Result[0])
			if err != nil {
				return fmt.Errorf("backup %s was stored, but reading it back failed: %w", final.Result[0], err)
			}
			return a.show(cmd.OutOrStdout(), b, a.backupTable(b))
		},
	}
	cmd.Flags().BoolVar(&full, "full", false, "read every disk whole, even when an earlier backup could be the base")
	return cmd
}

func (a *app) backupListCommand(target *string) *cobra.Command {
	return a.getter(&cobra.Command{
		Use:     "list [VOLUME]",
		Aliases: []string{"ls"},
		Short:   "List the backups in a target (of one volume)",
		Args:    cobra.MaximumNArgs(1),
	}, func(ctx context.Context, c *client.Client, args []string) (any, func(io.Writer) error, error) {
		vol := ""
		if len(args) == 1 {
			vol = args[0]
		}
		list, err := c.ListBackups(ctx, *target, vol)
		return api.List[api.Backup]{Items: nonNil(list)}, a.backupTable(list...), err
	})
}

func (a *app) backupGetCommand(target *string) *cobra.Command {
	return a.getter(&cobra.Command{
		Use:   "get ID",
		Short: "Show a backup",
		Args:  cobra.ExactArgs(1),
	}, func(ctx context.Context, c *client.Client, args []string) (any, func(io.Writer) error, error) {
		b, err := c.GetBackup(ctx, *target, args[0])
		return b, a.backupTable(b), err
	})
}

func (a *app) backupRestoreCommand(target *string) *cobra.Command {
	var disks []string
	var instant, wait bool
	cmd := &cobra.Command{
		Use:   "restore ID NEW-VOLUME",
		Short: "Restore a backup into a new volume (every disk, or those of --disk)",
		Long: `Restore a backup into a new volume (every disk, or those of --disk).

With --instant the volume is made and served at once, and its content is
copied from the store in the background: a VM can attach it and boot right
away; its reads of blocks not copied yet are fetched first, its writes land
in the new volume. 'quiver volume get' shows the copy's progress; snapshots,
clones and backups of the volume wait until it is done. --wait waits for it.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			spec := api.RestoreSpec{Volume: args[1], Disks: disks}
			if instant {
				return a.instantRestore(cmd, c, *target, args[0], spec, wait)
			}
			job, err := c.StartRestore(cmd.Context(), *target, args[0], spec)
			if err != nil {
				return err
			}
			if _, err := a.wait(cmd.Context(), c, job); err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "backup %s restored into volume %s", args[0], args[1])
		},
	}
	cmd.Flags().StringSliceVar(&disks, "disk", nil, "restore only this disk (repeat for more)")
	cmd.Flags().BoolVar(&instant, "instant", false, "serve the new volume at once and copy its content in the background")
	cmd.Flags().BoolVar(&wait, "wait", false, "with --instant: wait until the copy is done, showing its progress")
	return cmd
}

func (a *app) instantRestore(cmd *cobra.Command, c *client.Client, target, id string, spec api.RestoreSpec, wait bool) error {
	ctx := cmd.Context()
	v, err := c.InstantRestore(ctx, target, id, spec)
	if err != nil {
		return err
	}
	if !wait {
		return a.printDone(cmd.OutOrStdout(), "volume %s is served now; backup %s is copied into it in the background (quiver volume get %s shows the progress)",
			v.Name, id, v.Name)
	}
	bar := a.newBar(api.Job{Kind: "restore", Target: id + "->" + v.Name})
	defer bar.finish()
	for v.Restore != nil {
		bar.update(api.Job{BytesDone: v.Restore.CopiedBytes, BytesTotal: v.Restore.TotalBytes})
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: the copy goes on in the server (quiver volume get %s)", errInterrupted, v.Name)
		case <-time.After(a.env.PollInterval):
		}
		if v, err = c.GetVolume(ctx, v.Name); err != nil {
			return err
		}
	}
	bar.finish()
	return a.printDone(cmd.OutOrStdout(), "backup %s restored into volume %s", id, v.Name)
}

func (a *app) backupVerifyCommand(target *string) *cobra.Command {
	return &cobra.Command{
		Use:   "verify ID",
		Short: "Read back every chunk of a backup from the store and check it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			job, err := c.StartVerify(cmd.Context(), *target, args[0])
			if err != nil {
				return err
			}
			if _, err := a.wait(cmd.Context(), c, job); err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "backup %s: every chunk reads back intact", args[0])
		},
	}
}

func (a *app) backupDeleteCommand(target *string) *cobra.Command {
	return &cobra.Command{
		Use:     "delete ID",
		Aliases: []string{"rm"},
		Short:   "Delete a backup (its chunks go with the next `backup target collect`)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.DeleteBackup(cmd.Context(), *target, args[0]); err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "backup %s deleted", args[0])
		},
	}
}

func (a *app) backupTargetCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "target", Aliases: []string{"targets"}, Short: "List, initialise and collect backup targets"}
	list := a.getter(&cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the server's backup targets (from its --backup-config)",
		Args:    cobra.NoArgs,
	}, func(ctx context.Context, c *client.Client, _ []string) (any, func(io.Writer) error, error) {
		ts, err := c.BackupTargets(ctx)
		return api.List[api.BackupTarget]{Items: nonNil(ts)}, func(w io.Writer) error {
			t := newTable(w, "NAME", "STORE", "REPOSITORY", "STATE")
			for _, x := range ts {
				state := "ok"
				if x.Error != "" {
					state = x.Error
				}
				t.row(x.Name, x.Store, orNone(x.Repository), state)
			}
			return t.flush()
		}, err
	})
	initCmd := &cobra.Command{
		Use:   "init TARGET",
		Short: "Make the backup repository of a target (once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := c.InitBackupTarget(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "repository %s made in %s; keep its key file safe: without it no backup can be read", t.Repository, t.Store)
		},
	}
	collect := &cobra.Command{
		Use:   "collect TARGET",
		Short: "Remove the chunks that no backup of a target names any more",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			n, freed, err := c.CollectBackupTarget(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "%d chunks removed, %s freed", n, quantity.Format(freed))
		},
	}
	cmd.AddCommand(list, initCmd, collect)
	return cmd
}

func (a *app) backupKeyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "key", Short: "Make repository keys"}
	gen := &cobra.Command{
		Use:   "generate FILE",
		Short: "Write a new random repository key to FILE (0600; it must not exist)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b := make([]byte, 32)
			if _, err := rand.Read(b); err != nil {
				return err
			}
			f, err := os.OpenFile(args[0], os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("%s exists: a key is never overwritten (the backups it opens would be lost)", args[0])
			}
			if err != nil {
				return err
			}
			_, err = f.WriteString(base64.StdEncoding.EncodeToString(b) + "\n")
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "key written to %s; keep a copy apart from the backups", args[0])
		},
	}
	cmd.AddCommand(gen)
	return cmd
}

// backupTable prints backups as a table.
func (a *app) backupTable(list ...api.Backup) func(io.Writer) error {
	return func(w io.Writer) error {
		now := a.env.Now()
		t := newTable(w, "ID", "VOLUME", "KIND", "DISKS", "READ", "SENT", "DEDUP", "TOOK", "AGE")
		for _, b := range list {
			kind := "full"
			if b.Parent != "" {
				kind = "incremental"
			}
			dedup := "-"
			if n := b.Stats.ChunksNew + b.Stats.ChunksReused; n > 0 {
				dedup = fmt.Sprintf("%.0f%%", 100*float64(b.Stats.ChunksReused)/float64(n))
			}
			t.row(b.ID, b.Volume, kind, formatDisks(b.Disks), quantity.Format(b.Stats.BytesRead), quantity.Format(b.Stats.BytesSent),
				dedup, b.Stats.Duration.Round(time.Millisecond).String(), age(now, b.CreatedAt))
		}
		return t.flush()
	}
}

func orNone(s string) string {
	if strings.TrimSpace(s) == "" {
		return none
	}
	return s
}

func (a *app) volumePolicyCommand() *cobra.Command {
	var (
		p    api.BackupPolicy
		none bool
	)
	cmd := &cobra.Command{
		Use:   "policy VOLUME (--backup-every DURATION [--target T] [--keep-last N] [--keep-daily N] ... | --no-backup)",
		Short: "Set a volume's backup schedule and retention",
		Long: `Set how often the server backs the volume up (a whole-VM snapshot, stored incrementally
in the backup target) and which backups it keeps: the newest N, and the newest of each of
the last N days, weeks and months. Without keep rules every backup is kept.

  quiver volume policy db01 --backup-every 1h --keep-last 24 --keep-daily 7 --keep-weekly 4`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var v api.Volume
			switch {
			case none && p.Every != "":
				return errors.New("--no-backup and --backup-every: pick one")
			case none:
				v, err = c.DeleteBackupPolicy(cmd.Context(), args[0])
			case p.Every == "":
				return errors.New("--backup-every DURATION (e.g. 1h), or --no-backup")
			default:
				v, err = c.SetBackupPolicy(cmd.Context(), args[0], p)
			}
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), v, func(w io.Writer) error {
				if v.BackupPolicy == nil {
					_, err := fmt.Fprintf(w, "volume %s: no scheduled backups\n", v.Name)
					return err
				}
				bp := v.BackupPolicy
				_, err := fmt.Fprintf(w, "volume %s: backed up every %s to %s; keep last %d, daily %d, weekly %d, monthly %d\n",
					v.Name, bp.Every, orDefault(bp.Target, "the server's target"), bp.KeepLast, bp.KeepDaily, bp.KeepWeekly, bp.KeepMonthly)
				return err
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.Every, "backup-every", "", "back up this often (a duration: 30m, 1h, 24h; at least 1m)")
	f.StringVar(&p.Target, "target", "", "backup target (when the server has more than one)")
	f.IntVar(&p.KeepLast, "keep-last", 0, "keep the newest N backups")
	f.IntVar(&p.KeepDaily, "keep-daily", 0, "keep the newest backup of each of the last N days")
	f.IntVar(&p.KeepWeekly, "keep-weekly", 0, "keep the newest backup of each of the last N weeks")
	f.IntVar(&p.KeepMonthly, "keep-monthly", 0, "keep the newest backup of each of the last N months")
	f.BoolVar(&none, "no-backup", false, "remove the volume's schedule (its backups stay)")
	return cmd
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (a *app) backupStatusCommand() *cobra.Command {
	return a.getter(&cobra.Command{
		Use:   "status",
		Short: "Show each volume's newest backup per target, its age against the policy, and what it cost",
		Args:  cobra.NoArgs,
	}, func(ctx context.Context, c *client.Client, _ []string) (any, func(io.Writer) error, error) {
		list, err := c.BackupStatus(ctx)
		return api.List[api.BackupStatus]{Items: nonNil(list)}, func(w io.Writer) error {
			now := a.env.Now()
			t := newTable(w, "VOLUME", "TARGET", "EVERY", "LAST-GOOD", "AGE", "STATE", "SENT", "DEDUP", "FAILURES")
			for _, s := range list {
				last, ago := none, none
				if !s.LastSuccess.IsZero() {
					last, ago = s.LastBackup, age(now, s.LastSuccess)
				}
				state := "ok"
				switch {
				case s.LastError != "":
					state = "failing: " + s.LastError
				case s.Overdue:
					state = "overdue"
				}
				t.row(s.Volume, s.Target, orNone(s.Every), last, ago, state, quantity.Format(s.BytesSent),
					fmt.Sprintf("%.0f%%", 100*s.Dedup), fmt.Sprint(s.Failures))
			}
			return t.flush()
		}, err
	})
}
