package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/quantity"
)

func (a *app) volumeDuCommand() *cobra.Command {
	var selector string
	var disks bool
	cmd := &cobra.Command{
		Use:   "du [VOLUME] [-l KEY=VALUE,...] [--disks]",
		Short: "Show the space of volumes and snapshots: provisioned, allocated, and unique to each",
		Long: `Show how the pool's space divides among volumes and their snapshots, as rbd du
and zfs list -o space do: PROVISIONED is the disks' virtual sizes, ALLOCATED
what their images occupy (data shared by a reflink counts in full for each),
UNIQUE what no other volume or snapshot references: what deleting it frees.
Data held by several objects (a snapshot and its volume, the clones of a
golden image) is counted once, in the SHARED line, so UNIQUE and SHARED add up
to the data in the pool. Computed from the filesystem's extent maps; where
there are none (tmpfs, NFS) each image's data counts as its own (unique
marked ~).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && selector != "" {
				return fmt.Errorf("give a VOLUME or a --selector, not both")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			u, err := c.SpaceUsage(cmd.Context(), selector)
			if err != nil {
				return err
			}
			if len(args) == 1 {
				items := u.Items[:0]
				for _, o := range u.Items {
					if o.Volume == args[0] {
						items = append(items, o)
					}
				}
				if len(items) == 0 {
					return fmt.Errorf("volume %q: not found: `quiver volume list` shows the volumes", args[0])
				}
				u.Items = items
			}
			return a.show(cmd.OutOrStdout(), u, func(w io.Writer) error { return duTable(w, u, disks) })
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "only volumes matching KEY=VALUE[,KEY=VALUE...]")
	cmd.Flags().BoolVar(&disks, "disks", false, "a line for each disk too")
	return cmd
}

// duTable prints the space usage: a line per object (and disk), then the
// shared data and the pool.
func duTable(w io.Writer, u api.SpaceUsage, disks bool) error {
	unique := func(n int64) string {
		if !u.Exact {
			return "~" + quantity.Format(n)
		}
		return quantity.Format(n)
	}
	t := newTable(w, "NAME", "PROVISIONED", "ALLOCATED", "UNIQUE")
	var prov, alloc, uniq int64
	for _, o := range u.Items {
		name := o.Volume
		if o.Snapshot != "" {
			name += "@" + o.Snapshot
		} else {
			prov += o.ProvisionedBytes
		}
		alloc += o.AllocatedBytes
		uniq += o.UniqueBytes
		t.row(name, quantity.Format(o.ProvisionedBytes), quantity.Format(o.AllocatedBytes), unique(o.UniqueBytes))
		if disks {
			for _, d := range o.Disks {
				t.row("  "+name+"/"+d.Name, quantity.Format(d.ProvisionedBytes), quantity.Format(d.AllocatedBytes), unique(d.UniqueBytes))
			}
		}
	}
	t.row("<shared>", "-", "-", unique(u.SharedBytes))
	t.row("<total>", quantity.Format(prov), quantity.Format(alloc), unique(uniq+u.SharedBytes))
	if err := t.flush(); err != nil {
		return err
	}
	if u.PoolSizeBytes > 0 {
		_, err := fmt.Fprintf(w, "\nPool: %s used of %s (df); %s provisioned, %.2fx its size.\n",
			quantity.Format(u.PoolUsedBytes), quantity.Format(u.PoolSizeBytes), quantity.Format(prov),
			float64(prov)/float64(u.PoolSizeBytes))
		return err
	}
	return nil
}
