package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/quantity"
)

func (a *app) nodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "node",
		Aliases: []string{"nodes"},
		Short:   "List the storage nodes of the cluster (docs/cluster.md)",
	}
	cmd.AddCommand(a.nodeListCommand())
	return cmd
}

func (a *app) nodeListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the storage nodes: address, state, capacity, volumes (a single node lists itself)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			nodes, err := c.ListNodes(cmd.Context())
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), api.List[api.Node]{Items: nonNil(nodes)}, nodeTable(nodes))
		},
	}
}

func nodeTable(nodes []api.Node) func(io.Writer) error {
	return func(w io.Writer) error {
		t := newTable(w, "NAME", "ADDRESS", "STATE", "DOMAIN", "CAPACITY", "FREE", "VOLUMES")
		for _, n := range nodes {
			name := n.Name
			if n.Self {
				name += " (this)"
			}
			addr, domain, capacity, free := n.Address, n.FailureDomain, quantity.Format(n.CapacityBytes), quantity.Format(n.FreeBytes)
			if addr == "" {
				addr = "-"
			}
			if domain == "" {
				domain = "-"
			}
			if n.State != api.NodeUp {
				capacity, free = "-", "-"
			}
			t.row(name, addr, n.State, domain, capacity, free, fmt.Sprint(n.Volumes))
		}
		return t.flush()
	}
}

// formatCopies says where a volume's copies are: "n1 (primary, in-sync),
// n2 (in-sync); term 1".
func formatCopies(v api.Volume) string {
	parts := make([]string, 0, len(v.Copies))
	for _, c := range v.Copies {
		var tags []string
		if c.Node == v.Primary {
			tags = append(tags, "primary")
		}
		state := c.State
		if state == "" {
			state = "being made"
		}
		if c.Progress != nil {
			state += fmt.Sprintf(" %.0f%%", *c.Progress)
		}
		if c.Reason != "" {
			state += ": " + c.Reason
		}
		tags = append(tags, state)
		parts = append(parts, fmt.Sprintf("%s (%s)", c.Node, strings.Join(tags, ", ")))
	}
	return fmt.Sprintf("%s; term %d", strings.Join(parts, ", "), v.Term)
}
