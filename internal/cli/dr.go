package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/quantity"
)

func (a *app) drCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dr",
		Short: "Disaster recovery: ship whole VMs, point after point, to another site",
		Long: `Disaster recovery per VM (docs/dr.md). A relationship ships a volume, point after point
(a whole-VM snapshot each), to a volume on another site: the first point in full, then
only what changed. The target site accepts the relationship into a new volume, keeps
its last points, and promotes it when it takes over.`,
	}
	cmd.AddCommand(a.drEnableCommand(), a.drDisableCommand(), a.drStatusCommand(), a.drSyncCommand(), a.drDemoteCommand(),
		a.drSitesCommand(), a.drTargetCommand())
	return cmd
}

func (a *app) drSyncCommand() *cobra.Command {
	var site, rel string
	var replace bool
	cmd := &cobra.Command{
		Use:   "sync VOLUME [--site SITE --relationship NAME]",
		Short: "Ship a new point of a volume to its target on a site now (the delta since the target's last point)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			st, err := c.DRSync(cmd.Context(), args[0], api.DRSync{Site: site, Relationship: rel, Replace: replace})
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), st, func(w io.Writer) error {
				f := newFields(w)
				f.add("Point", fmt.Sprintf("%s (%d)", st.Point.Snapshot, st.Point.Seq))
				if st.Base == "" {
					f.add("Base", "none: every byte shipped")
				} else {
					f.add("Base", st.Base)
				}
				f.add("Changed", quantity.Format(st.Changed))
				f.add("Sent", fmt.Sprintf("%s written, %s zeroed", quantity.Format(st.Sent), quantity.Format(st.Zeroed)))
				f.add("Took", st.Duration.Round(time.Millisecond).String())
				return f.flush()
			})
		},
	}
	cmd.Flags().StringVar(&site, "site", "", "the site to ship to (from the server's --dr-config; default: the volume's DR policy's)")
	cmd.Flags().StringVar(&rel, "relationship", "", "the relationship's name, the same on both sites (default: the policy's)")
	cmd.Flags().BoolVar(&replace, "replace", false, "ship a full copy even where the target holds points this volume does not (another volume's: they are overwritten)")
	return cmd
}

func (a *app) drEnableCommand() *cobra.Command {
	var site, rel string
	var rpo time.Duration
	cmd := &cobra.Command{
		Use:   "enable VOLUME --site SITE --relationship NAME --rpo DURATION",
		Short: "Replicate a volume to its target on a site, often enough that the target's last point is never older than the RPO",
		Long: `Sets the volume's DR policy: the server ships a new point whenever the target's last point is
half the RPO old, and retries a failed cycle a tenth of the RPO later. quiver dr status shows
the lag; the metric quiver_dr_rpo_missed turns 1 when it is beyond the RPO. The target site
accepts the relationship first (quiver dr target accept RELATIONSHIP VOLUME).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if _, err := c.SetDRPolicy(cmd.Context(), args[0], api.DRPolicy{Site: site, Relationship: rel, RPO: rpo.String()}); err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "volume %s replicates to %s as relationship %s, RPO %s; see quiver dr status", args[0], site, rel, rpo)
		},
	}
	cmd.Flags().StringVar(&site, "site", "", "the site to ship to (from the server's --dr-config)")
	cmd.Flags().StringVar(&rel, "relationship", "", "the relationship's name, the same on both sites")
	cmd.Flags().DurationVar(&rpo, "rpo", 5*time.Minute, "the recovery point objective: the oldest the target's last point may be (10s to 24h)")
	_ = cmd.MarkFlagRequired("site")
	_ = cmd.MarkFlagRequired("relationship")
	return cmd
}

func (a *app) drDisableCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "disable VOLUME",
		Short: "Stop replicating a volume (the points on both sites stay; a later enable ships only the delta)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if _, err := c.DeleteDRPolicy(cmd.Context(), args[0]); err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "volume %s no longer replicates", args[0])
		},
	}
}

func (a *app) drStatusCommand() *cobra.Command {
	return a.getter(&cobra.Command{
		Use:   "status",
		Short: "Show each replicated volume's lag against its RPO, its last point and what its cycles sent",
		Args:  cobra.NoArgs,
	}, func(ctx context.Context, c *client.Client, _ []string) (any, func(io.Writer) error, error) {
		list, err := c.DRStatus(ctx)
		return api.List[api.DRStatus]{Items: nonNil(list)}, func(w io.Writer) error {
			t := newTable(w, "VOLUME", "SITE", "RELATIONSHIP", "RPO", "LAG", "LAST-POINT", "STATE", "LAST-SENT", "CYCLES", "FAILURES")
			for _, s := range list {
				state := "ok"
				switch {
				case s.LastError != "":
					state = "failing: " + s.LastError
				case s.Missed:
					state = "rpo missed"
				case s.Running:
					state = "shipping"
				}
				if s.Missed && s.LastError != "" {
					state = "rpo missed, " + state
				}
				t.row(s.Volume, s.Site, s.Relationship, s.RPO, s.Lag.Round(time.Second).String(), orNone(s.LastPoint), state,
					quantity.Format(s.LastSent), fmt.Sprint(s.Cycles), fmt.Sprint(s.Failures))
			}
			return t.flush()
		}, err
	})
}

func (a *app) drDemoteCommand() *cobra.Command {
	var rel string
	cmd := &cobra.Command{
		Use:   "demote VOLUME --relationship NAME",
		Short: "Make this site's volume, the relationship's source until now, its target (failback, planned migration)",
		Long: `Demote turns the volume, which shipped the relationship's points until now, into the
relationship's target on this site. Use it when the other site promoted its copy (a failover)
and this site is back: the other site's next cycle ships only what it changed since the last
point both sides had, and this side's writes since that point are dropped. Or as the first
step of a planned migration, after the last sync with the VM stopped. The volume must not be
attached read-write; its DR policy ends.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := c.DRDemote(cmd.Context(), args[0], rel)
			if err != nil {
				return err
			}
			last := none
			if n := len(t.Points); n > 0 {
				last = t.Points[n-1].Snapshot
			}
			return a.printDone(cmd.OutOrStdout(), "volume %s is now the target of relationship %s (last point %s); the other site ships to it: quiver dr enable VOLUME --site SITE --relationship %s",
				args[0], rel, last, rel)
		},
	}
	cmd.Flags().StringVar(&rel, "relationship", "", "the relationship's name")
	_ = cmd.MarkFlagRequired("relationship")
	return cmd
}

func (a *app) drSitesCommand() *cobra.Command {
	return a.getter(&cobra.Command{
		Use:   "sites",
		Short: "List the sites the server ships to (from its --dr-config)",
		Args:  cobra.NoArgs,
	}, func(ctx context.Context, c *client.Client, _ []string) (any, func(io.Writer) error, error) {
		ss, err := c.DRSites(ctx)
		return api.List[api.DRSite]{Items: nonNil(ss)}, func(w io.Writer) error {
			t := newTable(w, "NAME", "URL")
			for _, s := range ss {
				t.row(s.Name, s.URL)
			}
			return t.flush()
		}, err
	})
}

func (a *app) drTargetCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "target", Aliases: []string{"targets"},
		Short: "On a target site: accept, list and promote the relationships shipped here"}
	list := a.getter(&cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the relationships this site is the target of, with their points",
		Args:    cobra.NoArgs,
	}, func(ctx context.Context, c *client.Client, _ []string) (any, func(io.Writer) error, error) {
		ts, err := c.DRTargets(ctx)
		return api.List[api.DRTarget]{Items: nonNil(ts)}, func(w io.Writer) error {
			t := newTable(w, "RELATIONSHIP", "VOLUME", "POINTS", "LAST")
			for _, x := range ts {
				last := none
				if n := len(x.Points); n > 0 {
					last = x.Points[n-1].Snapshot
				}
				t.row(x.Relationship, x.Volume, fmt.Sprint(len(x.Points)), last)
			}
			return t.flush()
		}, err
	})
	accept := &cobra.Command{
		Use:   "accept RELATIONSHIP VOLUME",
		Short: "Make a new, empty volume the target of a relationship",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if _, err := c.DRAccept(cmd.Context(), api.DRAccept{Relationship: args[0], Volume: args[1]}); err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "volume %s is the target of relationship %s; its source ships with: quiver dr sync VOLUME --site SITE --relationship %s",
				args[1], args[0], args[0])
		},
	}
	promote := &cobra.Command{
		Use:   "promote RELATIONSHIP",
		Short: "Take over: the target volume returns to its last point and becomes an ordinary volume",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.DRPromote(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "volume %s promoted at its last point; relationship %s ends here", v.Name, args[0])
		},
	}
	cmd.AddCommand(list, accept, promote)
	return cmd
}
