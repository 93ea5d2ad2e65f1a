package cli

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/quantity"
	"github.com/quiverstorage/quiver/internal/server"
)

func (a *app) poolCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "Show the storage pool of the server, or make a new one",
	}
	cmd.AddCommand(a.poolInitCommand())
	cmd.AddCommand(&cobra.Command{
		Use:   "info",
		Short: "Show the pool's filesystem, capabilities and free space (on a cluster, the cluster's first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			info, err := c.Pool(cmd.Context())
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), info, a.poolDetail(info))
		},
	})
	return cmd
}

// poolInitCommand makes a new pool in a local directory, without a server.
func (a *app) poolInitCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "init DIR",
		Short: "Make a new, empty pool in DIR (absent or empty) for 'quiver server --pool DIR'",
		Long: `Make a new, empty pool in DIR, which must be absent or empty, and print its ID.
It works on the directory itself, not through a server, and refuses a
directory that already holds a pool or anything else.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			log := slog.New(slog.NewTextHandler(a.env.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
			id, dir, err := server.InitPool(cmd.Context(), args[0], log)
			if err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "pool %s created in %s", id, dir)
		},
	}
}

// poolDetail prints the pool's facts: on a cluster the cluster's totals
// and a line per node first, then the answering node's own pool.
func (a *app) poolDetail(p api.PoolInfo) func(io.Writer) error {
	return func(w io.Writer) error {
		if p.ClusterPool != nil {
			if err := clusterPoolDetail(w, p.Cluster, *p.ClusterPool); err != nil {
				return err
			}
			if _, err := fmt.Fprintf(w, "\nThis node's pool:\n"); err != nil {
				return err
			}
		}
		f := newFields(w)
		f.add("ID", p.ID)
		f.add("Path", p.Path)
		f.add("Filesystem", p.Filesystem)
		f.add("Capabilities", capabilities(p.Capabilities))
		if p.ChunkSize > 0 || p.Capabilities.Reflink {
			f.add("Chunk ownership", chunkOwnership(p.ChunkSize))
		} else {
			f.add("Chunk ownership", "off (the filesystem has no reflink)")
		}
		f.add("Total", quantity.Format(p.TotalBytes))
		free := quantity.Format(p.FreeBytes)
		if p.TotalBytes > 0 {
			free += fmt.Sprintf(" (%d%%)", p.FreeBytes*100/p.TotalBytes)
		}
		f.add("Free", free)
		if p.TotalBytes > 0 {
			f.add("Provisioned", fmt.Sprintf("%s (%.2fx the pool's size)", quantity.Format(p.ProvisionedBytes),
				float64(p.ProvisionedBytes)/float64(p.TotalBytes)))
		}
		vols := fmt.Sprint(p.Volumes)
		if p.Broken > 0 {
			vols += fmt.Sprintf(" (%d broken: see `quiver volume list`)", p.Broken)
		}
		f.add("Volumes", vols)
		if p.ReadOnly {
			f.add("Mode", "read-only (every change is refused)")
		}
		f.add("Created", timestamp(a.env.Now(), p.CreatedAt))
		return f.flush()
	}
}

// clusterPoolDetail prints the pool of cluster c: its totals, then a line
// per node.
func clusterPoolDetail(w io.Writer, name string, c api.ClusterPool) error {
	f := newFields(w)
	f.add("Cluster", name)
	if c.Unavailable != "" {
		f.add("Totals", "unavailable: "+c.Unavailable)
		return f.flush()
	}
	up := 0
	for _, n := range c.Nodes {
		if n.State == api.NodeUp {
			up++
		}
	}
	f.add("Nodes", fmt.Sprintf("%d (%d up)", len(c.Nodes), up))
	f.add("Total", quantity.Format(c.TotalBytes)+" (the nodes' pools, as each reports it)")
	free := quantity.Format(c.FreeBytes)
	if c.TotalBytes > 0 {
		free += fmt.Sprintf(" (%d%%)", c.FreeBytes*100/c.TotalBytes)
	}
	f.add("Free", free)
	prov := quantity.Format(c.ProvisionedBytes) + " (each volume once, whatever its copies)"
	if c.TotalBytes > 0 {
		prov = fmt.Sprintf("%s (each volume once, whatever its copies; %.2fx the cluster's size)",
			quantity.Format(c.ProvisionedBytes), float64(c.ProvisionedBytes)/float64(c.TotalBytes))
	}
	f.add("Provisioned", prov)
	f.add("Volumes", fmt.Sprint(c.Volumes))
	if err := f.flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	t := newTable(w, "NODE", "STATE", "CAPACITY", "FREE", "COPIES")
	for _, n := range c.Nodes {
		name := n.Name
		if n.Self {
			name += " (this)"
		}
		state, capacity, free := n.State, quantity.Format(n.CapacityBytes), quantity.Format(n.FreeBytes)
		if n.Drain != "" {
			state += ", " + n.Drain
		}
		if n.State != api.NodeUp {
			capacity, free = "-", "-"
		}
		t.row(name, state, capacity, free, fmt.Sprint(n.Copies))
	}
	return t.flush()
}

// capabilities names the capabilities the pool has.
func capabilities(c api.Capabilities) string {
	var have []string
	for _, k := range []struct {
		name string
		ok   bool
	}{
		{"reflink", c.Reflink},
		{"copy_file_range", c.CopyFileRange},
		{"seek_hole", c.SeekHole},
		{"btrfs_subvolumes", c.BtrfsSubvolumes},
		{"extent_size_hint", c.ExtentSizeHint},
	} {
		if k.ok {
			have = append(have, k.name)
		}
	}
	if len(have) == 0 {
		return none
	}
	return strings.Join(have, ", ")
}

func chunkOwnership(size int64) string {
	if size == 0 {
		return "off"
	}
	return quantity.Format(size) + " (the first write to a chunk after a snapshot rewrites it whole)"
}
