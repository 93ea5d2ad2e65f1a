package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"

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
marked ~).

On a cluster any node answers for the whole cluster: each volume is
measured on its primary's copy, named in the NODE column, and SHARED is
each measuring node's. A node that does not answer is named with the
volumes left out.`,
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
				if u, err = oneVolumeUsage(u, args[0]); err != nil {
					return err
				}
			}
			return a.show(cmd.OutOrStdout(), u, func(w io.Writer) error { return duTable(w, u, disks) })
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "only volumes matching KEY=VALUE[,KEY=VALUE...]")
	cmd.Flags().BoolVar(&disks, "disks", false, "a line for each disk too")
	return cmd
}

// oneVolumeUsage narrows u to volume's items (and on a cluster to the node
// that measured them); a volume its primary did not measure is an error
// saying why.
func oneVolumeUsage(u api.SpaceUsage, volume string) (api.SpaceUsage, error) {
	items := u.Items[:0]
	for _, o := range u.Items {
		if o.Volume == volume {
			items = append(items, o)
		}
	}
	for _, n := range u.Nodes {
		if slices.Contains(n.Missing, volume) {
			return u, fmt.Errorf("volume %q: not measured: %s", volume, missingReason(n))
		}
	}
	if len(items) == 0 {
		return u, fmt.Errorf("volume %q: not found: `quiver volume list` shows the volumes", volume)
	}
	u.Items = items
	if u.Nodes != nil {
		nodes := u.Nodes[:0]
		for _, n := range u.Nodes {
			if n.Node == items[0].Node {
				nodes = append(nodes, n)
			}
		}
		u.Nodes = nodes
		if len(nodes) == 1 {
			u.SharedBytes, u.Exact, u.PoolSizeBytes, u.PoolUsedBytes = nodes[0].SharedBytes, nodes[0].Exact,
				nodes[0].PoolSizeBytes, nodes[0].PoolUsedBytes
		}
	}
	return u, nil
}

// missingReason says why node n measured none of its volumes in Missing.
func missingReason(n api.NodeSpaceUsage) string {
	if n.Error != "" {
		return fmt.Sprintf("its primary %s did not answer (%s)", n.Node, n.Error)
	}
	return fmt.Sprintf("its primary %s holds no copy of it now (moved or deleted meanwhile: ask again)", n.Node)
}

// duTable prints the space usage: a line per object (and disk), then the
// shared data and the pool. On a cluster (u.Nodes) a NODE column names
// the node whose copy was measured, the shared data is each node's, and
// the pools are listed by node.
func duTable(w io.Writer, u api.SpaceUsage, disks bool) error {
	unique := func(n int64) string {
		if !u.Exact {
			return "~" + quantity.Format(n)
		}
		return quantity.Format(n)
	}
	cluster := u.Nodes != nil
	header := []string{"NAME", "PROVISIONED", "ALLOCATED", "UNIQUE"}
	if cluster {
		header = slices.Insert(header, 1, "NODE")
	}
	t := newTable(w, header...)
	row := func(name, node string, cells ...string) {
		if cluster {
			cells = append([]string{name, node}, cells...)
		} else {
			cells = append([]string{name}, cells...)
		}
		t.row(cells...)
	}
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
		row(name, o.Node, quantity.Format(o.ProvisionedBytes), quantity.Format(o.AllocatedBytes), unique(o.UniqueBytes))
		if disks {
			for _, d := range o.Disks {
				row("  "+name+"/"+d.Name, o.Node, quantity.Format(d.ProvisionedBytes), quantity.Format(d.AllocatedBytes), unique(d.UniqueBytes))
			}
		}
	}
	if cluster {
		for _, n := range u.Nodes {
			if n.Error == "" {
				row("<shared>", n.Node, "-", "-", unique(n.SharedBytes))
			}
		}
	} else {
		row("<shared>", "", "-", "-", unique(u.SharedBytes))
	}
	row("<total>", "-", quantity.Format(prov), quantity.Format(alloc), unique(uniq+u.SharedBytes))
	if err := t.flush(); err != nil {
		return err
	}
	if cluster {
		return duNodes(w, u.Nodes, prov)
	}
	if u.PoolSizeBytes > 0 {
		_, err := fmt.Fprintf(w, "\nPool: %s used of %s (df); %s provisioned, %.2fx its size.\n",
			quantity.Format(u.PoolUsedBytes), quantity.Format(u.PoolSizeBytes), quantity.Format(prov),
			float64(prov)/float64(u.PoolSizeBytes))
		return err
	}
	return nil
}

// duNodes ends a cluster's space usage: each measuring node's pool, and
// the volumes left out with why.
func duNodes(w io.Writer, nodes []api.NodeSpaceUsage, prov int64) error {
	if _, err := fmt.Fprintf(w, "\nEach volume measured on its primary's copy; %s provisioned, each volume once.\n",
		quantity.Format(prov)); err != nil {
		return err
	}
	for _, n := range nodes {
		line := fmt.Sprintf("%s: %s used of %s (df)", n.Node, quantity.Format(n.PoolUsedBytes), quantity.Format(n.PoolSizeBytes))
		if n.Error != "" {
			line = fmt.Sprintf("%s: did not answer (%s)", n.Node, n.Error)
		}
		if len(n.Missing) > 0 {
			line += fmt.Sprintf("; left out: %s", strings.Join(n.Missing, ", "))
			if n.Error == "" {
				line += " (it holds no copy of them now: ask again)"
			}
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}
