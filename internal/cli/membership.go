package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

func (a *app) nodeAddCommand() *cobra.Command {
	var peers []string
	cmd := &cobra.Command{
		Use:   "add NAME --peer-url URL",
		Short: "Add a new node's etcd member to the cluster and print the flags it starts with",
		Long: `Adds an etcd member for the new node NAME, whose embedded member will listen for its peers on
--peer-url, as a learner (it counts for no quorum yet), and prints the --initial-cluster and
--initial-cluster-state existing flags to start the new node with, besides its own (--cluster-name,
--node-name NAME, --cluster-token-file, its etcd certificates). Once started, the node catches up with etcd,
promotes its member to a voting one and registers. Any node with an embedded member takes the request. A node
of a cluster on external etcd (--etcd-endpoints) needs no member: start it and it registers itself.`,
		Example:           `  quiver node add n4 --peer-url https://10.0.0.14:2380`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			added, err := c.AddNode(cmd.Context(), args[0], peers)
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), added, nodeAddedTable(added))
		},
	}
	cmd.Flags().StringSliceVar(&peers, "peer-url", nil, "URL the new node's etcd member listens on for its peers (its --initial-cluster entry)")
	return cmd
}

func nodeAddedTable(n api.NodeAdded) func(io.Writer) error {
	return func(w io.Writer) error {
		t := newTable(w, "NAME", "MEMBER", "PEER-URLS", "STATE")
		t.row(n.Name, n.MemberID, strings.Join(n.PeerURLs, ","), "learner, not started")
		if err := t.flush(); err != nil {
			return err
		}
		// Flags alternate a flag and its value; values are quoted for a
		// shell. Whatever the server sent, nothing here indexes past it.
		args := make([]string, len(n.Flags))
		for i, f := range n.Flags {
			if i%2 == 1 {
				f = strconv.Quote(f)
			}
			args[i] = f
		}
		_, err := fmt.Fprintf(w, "\nStart %s with its own flags and:\n  %s\n", n.Name, strings.Join(args, " "))
		return err
	}
}

func (a *app) nodeRemoveCommand() *cobra.Command {
	var drain bool
	cmd := &cobra.Command{
		Use:   "remove NODE",
		Short: "Remove a drained node from the cluster: its records and its etcd member",
		Long: `Removes NODE from the cluster: it must be drained and hold no copy (with --drain, NODE is drained
first, as quiver node drain does, on NODE's own API). Its records are forgotten, its identity is refused if it
starts again (a machine comes back on a new pool, through quiver node add), and its etcd member is removed,
refused when that would leave fewer than 3 etcd members or fewer members up than their quorum. A removed node
that is running stops. Send the request to another node than NODE.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if drain {
				if err := a.drainFirst(cmd.Context(), c, args[0]); err != nil {
					return err
				}
			}
			rm, err := c.RemoveNode(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), rm, nodeRemovedTable(rm))
		},
	}
	cmd.Flags().BoolVar(&drain, "drain", false, "drain the node first (a job on the node itself), then remove it")
	return cmd
}

// drainFirst drains node through its own API, found in the node list of c,
// unless it is drained already.
func (a *app) drainFirst(ctx context.Context, c *client.Client, node string) error {
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.Name != node {
			continue
		}
		if n.Drain == api.NodeDrained && n.Volumes == 0 {
			return nil
		}
		if n.State != api.NodeUp || n.Address == "" {
			return fmt.Errorf("drain %s before its removal: the node is down, and a drain runs on the node itself; "+
				"wait for --rebuild-after to rebuild its copies elsewhere, or bring it up", node)
		}
		addr := n.Address
		if strings.HasPrefix(serverURL(a.server), "https://") {
			addr = "https://" + addr
		}
		nc, err := a.clientOf(addr)
		if err != nil {
			return err
		}
		job, err := nc.StartDrain(ctx, node)
		if err != nil {
			return err
		}
		final, err := a.wait(ctx, nc, job)
		if err != nil {
			return fmt.Errorf("drain %s before its removal: %w", node, err)
		}
		if a.forPeople() {
			_, _ = fmt.Fprintf(a.env.Stderr, "node %s drained: %d volume(s) moved\n", node, final.ItemsDone)
		}
		return nil
	}
	return fmt.Errorf("node %s: no such node in the cluster (quiver node list)", node)
}

func nodeRemovedTable(n api.NodeRemoved) func(io.Writer) error {
	return func(w io.Writer) error {
		t := newTable(w, "NAME", "NODE-ID", "MEMBER", "ETCD-MEMBERS-LEFT")
		member := n.MemberID
		if member == "" {
			member = none
		}
		id := n.NodeID
		if id == "" {
			id = none
		}
		t.row(n.Name, id, member, fmt.Sprint(n.EtcdMembers))
		return t.flush()
	}
}

func (a *app) nodeReplaceCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "replace OLD NEW",
		Short: "Rebuild the copies of a node that is gone on another node, then remove the node gone",
		Long: `Replaces OLD, a node that is down for good (a dead machine), by NEW, a node of the cluster that is up and
not drained (a new machine: quiver node add NEW --peer-url URL, then start it with the flags printed). Each
volume with a copy on OLD gets a new copy on NEW (or, when NEW holds a copy of it already, on another eligible
node), rebuilt whole by its primary from an in-sync copy, as --rebuild-after does without the wait (a volume OLD
was the primary of has failed over already). Once every such volume is whole again, OLD is removed as quiver node
remove does: its records, its identity (refused if it ever starts again) and its etcd member, refused when that
would leave fewer than 3 etcd members or fewer members up than their quorum.

It runs as a job on the node that takes the request (any node that is up), with progress; Ctrl-C cancels it
(the copies rebuilt so far stay). Refused, with nothing changed, when OLD is up (take a running node out with
quiver node remove OLD --drain) or NEW is not up and undrained. A volume whose only in-sync copy is on OLD is
never touched: the others are rebuilt, and the job fails naming it, OLD still a node; bring OLD back, or delete
that volume, then run the replace again. Run again after an interruption, it carries on.`,
		Example:           `  quiver node replace n2 n4`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			job, err := c.StartReplace(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			final, err := a.wait(cmd.Context(), c, job)
			if err != nil {
				return err
			}
			if a.forPeople() {
				return a.printDone(cmd.OutOrStdout(), "node %s replaced by %s: %d volume(s) rebuilt; %s removed from the cluster",
					args[0], args[1], final.ItemsDone, args[0])
			}
			return a.printObject(cmd.OutOrStdout(), final)
		},
	}
}
