package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/quantity"
)

func (a *app) volumeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volume",
		Aliases: []string{"volumes", "vol"},
		Short:   "Create, list, grow, label, limit, watch and delete volumes (one per VM)",
	}
	cmd.AddCommand(a.volumeCreateCommand(), a.volumeListCommand(), a.volumeGetCommand(),
		a.volumeDeleteCommand(), a.volumeGrowCommand(), a.volumeLabelCommand(), a.volumeQoSCommand(),
		a.volumeStatsCommand(), a.volumeImportCommand(), a.volumeExportCommand(), a.volumeDuCommand(), a.volumePolicyCommand(),
		a.volumeRekeyCommand())
	return cmd
}

func (a *app) volumeCreateCommand() *cobra.Command {
	var capacity string
	var disks, labels []string
	var limits *qosFlags
	var replicas int
	var tenant string
	var encrypt bool
	cmd := &cobra.Command{
		Use:   "create NAME --capacity SIZE [--disk NAME=SIZE]... [--label KEY=VALUE]... [--replicas N] [--encrypt] [--qos-rw-iops N] [--qos-rw-mbytes N]...",
		Short: "Create a volume with its disks",
		Example: `  quiver volume create web01 --capacity 200Gi --disk root=40Gi --disk data=100Gi --label app=web
  quiver volume create db01 --capacity 100Gi --disk root=20Gi --disk data=80Gi --qos-rw-iops 500 --qos-rw-mbytes 50
  quiver volume create vault --capacity 20Gi --disk root=20Gi --encrypt`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := api.VolumeSpec{Name: args[0]}
			var err error
			if spec.Capacity, err = quantity.Parse(capacity); err != nil {
				return fmt.Errorf("--capacity: %w", err)
			}
			if spec.Disks, err = parseDisks(disks); err != nil {
				return fmt.Errorf("--disk: %w", err)
			}
			if spec.Labels, err = parseLabels(labels); err != nil {
				return fmt.Errorf("--label: %w", err)
			}
			spec.QoS = limits.spec()
			spec.Replicas = replicas
			spec.Tenant = tenant
			spec.Encrypt = encrypt
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), spec)
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), v, a.volumeTable(v))
		},
	}
	cmd.Flags().StringVar(&capacity, "capacity", "", "budget for the sum of the disk sizes, e.g. 200Gi (required)")
	cmd.Flags().StringArrayVar(&disks, "disk", nil, "a disk as NAME=SIZE[,shared], e.g. root=40Gi (repeatable; shared: exempt from the single-writer rule)")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "a label as KEY=VALUE (repeatable)")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "copies on distinct nodes of a cluster (above 1 needs a cluster: docs/cluster.md)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "the tenant that owns the volume (admin tokens only; a tenant's token always makes its own)")
	cmd.Flags().BoolVar(&encrypt, "encrypt", false, "store the disks encrypted under a data key of the volume's own (the server needs a key provider: --key-file; docs/encryption.md)")
	limits = addQoSFlags(cmd, "qos-", "; one budget for all disks")
	cmd.MarkFlagRequired("capacity")
	return cmd
}

func (a *app) volumeListCommand() *cobra.Command {
	var selector string
	cmd := a.getter(&cobra.Command{
		Use:     "list [-l KEY=VALUE,...]",
		Aliases: []string{"ls"},
		Short:   "List volumes, optionally those matching a label selector",
		Args:    cobra.NoArgs,
	}, func(ctx context.Context, c *client.Client, _ []string) (any, func(io.Writer) error, error) {
		vols, err := c.ListVolumes(ctx, selector)
		return api.List[api.Volume]{Items: nonNil(vols)}, a.volumeTable(vols...), err
	})
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector: KEY=VALUE[,KEY=VALUE...]")
	return cmd
}

func (a *app) volumeGetCommand() *cobra.Command {
	return a.getter(&cobra.Command{
		Use:   "get NAME",
		Short: "Show a volume with its disks",
		Args:  cobra.ExactArgs(1),
	}, func(ctx context.Context, c *client.Client, args []string) (any, func(io.Writer) error, error) {
		v, err := c.GetVolume(ctx, args[0])
		return v, a.volumeDetail(v), err
	})
}

func (a *app) volumeDeleteCommand() *cobra.Command {
	var recursive, shred bool
	var selector string
	var force []string
	cmd := &cobra.Command{
		Use:     "delete NAME... | -l KEY=VALUE,... [--recursive] [--shred [--force CLONE,...]]",
		Aliases: []string{"rm"},
		Short:   "Delete volumes with all their disks (and their snapshots with --recursive)",
		Long: `Delete volumes with all their disks: those named (brace patterns such as
'vdi-{001..500}' expand as for clone), or every volume matching a label
selector. A volume with snapshots is refused unless --recursive deletes them
too, as zfs destroy does without -r. A volume with attachments is refused:
detach it first. Each volume is deleted on its own; the command goes on past
a refusal and fails at the end, naming every volume it could not delete.

--shred crypto-shreds an encrypted volume: the key-encryption keys of its
data key are destroyed in the key manager first, then the volume and its
snapshots are deleted. No copy of its data (the pool's freed blocks, a disk
taken away) can be read again. Clones share their source's data key, so a
volume with clones is refused until --force names them all: they are
shredded with it.`,
		Example: `  quiver volume delete web01
  quiver volume delete 'vdi-{001..500}' --recursive
  quiver volume delete -l pool=vdi
  quiver volume delete vault --shred --force vault-test,vault-dev`,
		Args: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 0) == (selector == "") {
				return errors.New("give volume names or a --selector, not both")
			}
			if len(force) > 0 && !shred {
				return errors.New("--force names the clones to shred with --shred; without --shred it means nothing")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			names, err := expandAll(args)
			if err != nil {
				return err
			}
			if selector != "" {
				vols, err := c.ListVolumes(cmd.Context(), selector)
				if err != nil {
					return err
				}
				for _, v := range vols {
					names = append(names, v.Name)
				}
				if len(names) == 0 {
					_, err := fmt.Fprintf(a.env.Stderr, "No volumes match %s.\n", selector)
					return err
				}
			}
			var opts []client.CallOption
			if recursive {
				opts = append(opts, client.Recursive())
			}
			if shred {
				opts = append(opts, client.Shred(force...))
			}
			var failed []string
			var first error
			for _, name := range names {
				pending, err := c.DeleteVolume(cmd.Context(), name, opts...)
				if err != nil {
					if cmd.Context().Err() != nil {
						return errInterrupted
					}
					if len(names) == 1 {
						return err
					}
					fmt.Fprintf(a.env.Stderr, "error: %s: %v\n", name, err)
					failed = append(failed, name)
					if first == nil {
						first = err
					}
					continue
				}
				if pending != nil {
					// Not an error: nothing more for the admin to do, but the
					// volume is not gone yet and the name not free.
					if err := a.printDone(cmd.OutOrStdout(), "volume %s is deleting: %s; its nodes finish the delete when they are back, and the name stays taken until then",
						name, pending.Reason); err != nil {
						return err
					}
					continue
				}
				done := "volume %s deleted"
				if shred {
					done = "volume %s shredded: its keys are destroyed and it is deleted"
					if len(force) > 0 {
						done = "volume %s shredded with " + strings.Join(force, ", ") + ": their keys are destroyed and they are deleted"
					}
				}
				if err := a.printDone(cmd.OutOrStdout(), done, name); err != nil {
					return err
				}
			}
			if len(failed) > 0 {
				return fmt.Errorf("%d of %d volumes were not deleted (%s): %w", len(failed), len(names), strings.Join(failed, ", "), first)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "delete the volumes' snapshots with them")
	cmd.Flags().BoolVar(&shred, "shred", false, "destroy an encrypted volume's keys first, so its data can never be read again (its snapshots go too)")
	cmd.Flags().StringSliceVar(&force, "force", nil, "with --shred: the clones sharing the volume's data key, shredded with it")
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "delete every volume matching KEY=VALUE[,KEY=VALUE...]")
	return cmd
}

func (a *app) volumeGrowCommand() *cobra.Command {
	var capacity string
	cmd := &cobra.Command{
		Use:   "grow NAME --capacity SIZE",
		Short: "Raise the capacity of a volume (it cannot shrink)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := quantity.Parse(capacity)
			if err != nil {
				return fmt.Errorf("--capacity: %w", err)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.UpdateVolume(cmd.Context(), args[0], api.VolumeUpdate{Capacity: &size})
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), v, a.volumeTable(v))
		},
	}
	cmd.Flags().StringVar(&capacity, "capacity", "", "the new capacity, e.g. 300Gi (required)")
	cmd.MarkFlagRequired("capacity")
	return cmd
}

func (a *app) volumeLabelCommand() *cobra.Command {
	var overwrite bool
	cmd := &cobra.Command{
		Use:   "label NAME KEY=VALUE... | KEY-...",
		Short: "Add, change or remove labels of a volume",
		Long: `Add, change or remove labels of a volume, as kubectl label does: KEY=VALUE
adds a label (changing an existing value needs --overwrite), KEY- removes one.
Labels not named are kept.`,
		Example: `  quiver volume label web01 tier=gold app=web
  quiver volume label web01 tier=silver --overwrite
  quiver volume label web01 app-`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, remove, err := parseLabelChanges(args[1:])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			labels, err := mergeLabels(v.Labels, set, remove, overwrite)
			if err != nil {
				return err
			}
			v, err = c.UpdateVolume(cmd.Context(), args[0], api.VolumeUpdate{Labels: labels})
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), v, a.volumeTable(v))
		},
	}
	cmd.Flags().BoolVar(&overwrite, "overwrite", false, "allow changing the value of a label the volume already has")
	return cmd
}

// volumeTable prints volumes as a table; with a cluster's volumes among
// them (placed: Copies), a STATE column (volumeState) after the name.
func (a *app) volumeTable(vols ...api.Volume) func(io.Writer) error {
	return func(w io.Writer) error {
		now := a.env.Now()
		placed := slices.ContainsFunc(vols, func(v api.Volume) bool { return len(v.Copies) > 0 || v.State == api.VolumeDeleting })
		header := []string{"NAME", "CAPACITY", "DISKS", "SNAPSHOTS", "LABELS", "AGE"}
		if placed {
			header = slices.Insert(header, 1, "STATE")
		}
		encrypted := slices.ContainsFunc(vols, func(v api.Volume) bool { return v.Encryption != nil })
		if encrypted {
			header = append(header, "ENCRYPTION")
		}
		if a.wide() {
			header = append(header, "UID", "QOS", "WRITER", "SOURCE")
		}
		t := newTable(w, header...)
		for _, v := range vols {
			if v.State == api.VolumeBroken {
				row := []string{v.Name, "-", "BROKEN: " + v.Reason, "-", "-", "-"}
				if placed {
					row = slices.Insert(row, 1, v.State)
				}
				if encrypted {
					row = append(row, "-")
				}
				if a.wide() {
					row = append(row, "-", "-", "-", "-")
				}
				t.row(row...)
				continue
			}
			row := []string{v.Name, quantity.Format(v.Capacity), formatDisks(v.Disks),
				fmt.Sprint(v.Snapshots), formatLabels(v.Labels), age(now, v.CreatedAt)}
			if placed {
				row = slices.Insert(row, 1, volumeState(v))
			}
			if encrypted {
				row = append(row, encryption(v.Encryption))
			}
			if a.wide() {
				writer := none
				if v.Writer.Epoch > 0 {
					writer = fmt.Sprintf("%s@%d", v.Writer.Attachment, v.Writer.Epoch)
				}
				row = append(row, v.UID, formatQoS(v.QoS), writer, source(v.Source))
			}
			t.row(row...)
		}
		return t.flush()
	}
}

// encryption names the key that wraps a volume's data key, as
// provider:KEK-id (<none> for a volume stored in the clear).
func encryption(e *api.Encryption) string {
	if e == nil {
		return none
	}
	return e.Provider + ":" + e.KeyID
}

// volumeState is a cluster volume's state in a list: "deleting" while
// its copies go (the server's State), "ready" when every copy is in sync,
// else the copies that are not, with their state ("n2 degraded, n3 being
// made"); "-" for a volume that is not placed (the node's own).
func volumeState(v api.Volume) string {
	if v.State != "" {
		return v.State
	}
	if len(v.Copies) == 0 {
		return "-"
	}
	var off []string
	for _, c := range v.Copies {
		if c.State == api.CopyInSync {
			continue
		}
		state := c.State
		switch {
		case state == "":
			state = "being made"
		case c.Progress != nil:
			state += fmt.Sprintf(" %.0f%%", *c.Progress)
		}
		off = append(off, c.Node+" "+state)
	}
	if len(off) == 0 {
		return "ready"
	}
	return strings.Join(off, ", ")
}

// volumeDetail prints one volume with a table of its disks.
func (a *app) volumeDetail(v api.Volume) func(io.Writer) error {
	return func(w io.Writer) error {
		f := newFields(w)
		f.add("Name", v.Name)
		if v.State == api.VolumeBroken {
			f.add("State", "BROKEN (quarantined: not served, every operation refused)")
			f.add("Reason", v.Reason)
			return f.flush()
		}
		f.add("UID", v.UID)
		if v.State == api.VolumeDeleting {
			f.add("State", "deleting (not usable: its copies' nodes finish the delete; the name is taken until the last copy is gone)")
		}
		f.add("Capacity", fmt.Sprintf("%s (%s in disks)", quantity.Format(v.Capacity), quantity.Format(diskTotal(v.Disks))))
		f.add("Labels", formatLabels(v.Labels))
		f.add("QoS", formatQoS(v.QoS))
		if v.Source != nil {
			f.add("Source", source(v.Source))
		}
		f.add("Snapshots", fmt.Sprint(v.Snapshots))
		if p := v.DRPolicy; p != nil {
			f.add("DR", fmt.Sprintf("to %s as relationship %s, RPO %s (quiver dr status)", p.Site, p.Relationship, p.RPO))
		}
		if e := v.Encryption; e != nil {
			f.add("Encryption", fmt.Sprintf("XTS-AES-256, data key wrapped by key provider %s, KEK %s", e.Provider, e.KeyID))
			if r := e.Rekey; r != nil {
				state := "interrupted: run quiver volume rekey --deep " + v.Name + " to finish it; snapshots and clones wait"
				if r.Running {
					state = "running; snapshots and clones wait"
				}
				f.add("Deep rekey", fmt.Sprintf("%s of %s under the new data key (%d%%), started %s, %s",
					quantity.Format(r.DoneBytes), quantity.Format(r.TotalBytes), percent(r.DoneBytes, r.TotalBytes),
					timestamp(a.env.Now(), r.Started), state))
			}
		}
		if r := v.Restore; r != nil {
			f.add("Restore", fmt.Sprintf("copying from %s: %s of %s (%d%%), started %s; served meanwhile, snapshots wait",
				r.Source, quantity.Format(r.CopiedBytes), quantity.Format(r.TotalBytes), percent(r.CopiedBytes, r.TotalBytes),
				timestamp(a.env.Now(), r.Started)))
		}
		if len(v.Copies) > 0 {
			f.add("Primary", fmt.Sprintf("%s (term %d)", v.Primary, v.Term))
			f.add("Copies", formatCopies(v))
		}
		if v.Writer.Epoch > 0 {
			f.add("Writer", fmt.Sprintf("%s (epoch %d)", v.Writer.Attachment, v.Writer.Epoch))
		}
		f.add("Created", timestamp(a.env.Now(), v.CreatedAt))
		f.add("Path", v.Path)
		return printDisks(w, f, v.Disks)
	}
}

// printDisks ends a detail view with the disks of a volume or snapshot.
func printDisks(w io.Writer, f *fields, disks []api.Disk) error {
	if len(disks) == 0 {
		f.add("Disks", none)
		return f.flush()
	}
	if err := f.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "Disks:")
	t := newTable(w, "  NAME", "SIZE", "ALLOCATED", "PATH")
	for _, d := range disks {
		name := d.Name
		if d.Shared {
			name += " (shared)"
		}
		t.row("  "+name, quantity.Format(d.Size), quantity.Format(d.Allocated), d.Path)
	}
	return t.flush()
}

// printDone prints a confirmation for people; the machine formats stay
// empty, as the API's answer (204) is.
func (a *app) printDone(w io.Writer, format string, args ...any) error {
	if !a.forPeople() {
		return nil
	}
	_, err := fmt.Fprintf(w, format+"\n", args...)
	return err
}

// nonNil makes an empty list print as [] rather than null.
func nonNil[T any](items []T) []T {
	if items == nil {
		return []T{}
	}
	return items
}

func percent(part, whole int64) int64 {
	if whole <= 0 {
		return 100
	}
	return part * 100 / whole
}
