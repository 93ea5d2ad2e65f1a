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
		Short:   "List, add, drain, undrain, remove and replace the storage nodes of the cluster (docs/cluster.md)",
	}
	cmd.AddCommand(a.nodeListCommand(), a.nodeAddCommand(), a.nodeDrainCommand(), a.nodeUndrainCommand(),
		a.nodeRemoveCommand(), a.nodeReplaceCommand())
	return cmd
}

func (a *app) nodeDrainCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "drain NODE",
		Short: "Move every copy away from a node, as a job with progress, and keep new copies off it",
		Long: `Moves each copy on NODE to another eligible node (up, not drained, with the free bytes, another
failure domain first), rebuilt there before the copy on NODE is removed, and hands the volumes NODE is the
primary of over to an in-sync copy elsewhere (the next term; clients are sent to the new primary). The node
stays marked drained, skipped by placement, until ` + "`quiver node undrain NODE`" + `. The drain runs on NODE
itself: point --server at NODE's API. Refused, with nothing changed, when a copy has nowhere to go.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			job, err := c.StartDrain(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			final, err := a.wait(cmd.Context(), c, job)
			if err != nil {
				return err
			}
			if a.forPeople() {
				return a.printDone(cmd.OutOrStdout(), "node %s drained: %d volume(s) moved", args[0], final.ItemsDone)
			}
			return a.printObject(cmd.OutOrStdout(), final)
		},
	}
}

func (a *app) nodeUndrainCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "undrain NODE",
		Short:             "Clear a node's drain mark: new copies may be placed on it again",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			n, err := c.Undrain(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.forPeople() {
				return a.printDone(cmd.OutOrStdout(), "node %s undrained: placement may use it again", args[0])
			}
			return a.printObject(cmd.OutOrStdout(), n)
		},
	}
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
			state := n.State
			if n.Drain != "" {
				state += ", " + n.Drain
			}
			t.row(name, addr, state, domain, capacity, free, fmt.Sprint(n.Volumes))
		}
		return t.flush()
	}
}

// formatCopies says where a volume's copies are: "n1 (primary, in-sync),
// n2 (resyncing 45% of 12Mi); term 2".
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
			// The total is what the resync copies: the changed regions,
			// or the whole copy.
			state += fmt.Sprintf(" %.0f%% of %s", *c.Progress, quantity.Format(c.TotalBytes))
		}
		if c.Reason != "" {
			state += ": " + c.Reason
		}
		tags = append(tags, state)
		parts = append(parts, fmt.Sprintf("%s (%s)", c.Node, strings.Join(tags, ", ")))
	}
	return fmt.Sprintf("%s; term %d", strings.Join(parts, ", "), v.Term)
}
