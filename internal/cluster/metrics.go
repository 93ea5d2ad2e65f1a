package cluster

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descNodes = prometheus.NewDesc("quiver_cluster_nodes", "Members of the cluster by state (up: holds its etcd lease).",
		[]string{"state"}, nil)
	descUp = prometheus.NewDesc("quiver_cluster_node_up",
		"1 while this node holds its etcd session (registered as up), else 0.", nil, nil)
	descPlacements = prometheus.NewDesc("quiver_cluster_placements_total",
		"Volume creations placed by this node, by result (ok: every copy in sync).", []string{"result"}, nil)
	descCopyState = prometheus.NewDesc("quiver_cluster_copy_state",
		"1 for the state each copy of a volume this node is the primary of is in (in-sync, degraded, resyncing, failed).",
		[]string{"volume", "copy", "state"}, nil)
	descResyncProgress = prometheus.NewDesc("quiver_cluster_copy_resync_progress_ratio",
		"Share of the dirty bytes a running resync has copied, per copy of a volume this node is the primary of.",
		[]string{"volume", "copy"}, nil)
	descFailovers = prometheus.NewDesc("quiver_cluster_failovers_total",
		"Promotions this node won: it became a volume's primary at term+1 after the primary went down.", nil, nil)
	descStaleDeleted = prometheus.NewDesc("quiver_cluster_stale_copies_deleted_total",
		"Stale copies this node deleted: its copies of volumes placed on other nodes while it was gone.", nil, nil)
	descLeaseValid = prometheus.NewDesc("quiver_cluster_lease_valid_seconds",
		"How long this node's etcd lease is surely held still, on its own clock (docs/cluster.md, lease fencing): "+
			"as a primary it answers requests only while this is above 0.", nil, nil)
)

// Collector returns the cluster's metrics, read at scrape time. The member
// counts are absent from a scrape while etcd does not answer within a second.
func (n *Node) Collector() prometheus.Collector { return collector{n} }

type collector struct{ n *Node }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descNodes
	ch <- descUp
	ch <- descPlacements
	ch <- descCopyState
	ch <- descResyncProgress
	ch <- descFailovers
	ch <- descStaleDeleted
	ch <- descLeaseValid
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	up := 0.0
	if c.n.Up() {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(descPlacements, prometheus.CounterValue, float64(c.n.placeOK.Load()), "ok")
	ch <- prometheus.MustNewConstMetric(descPlacements, prometheus.CounterValue, float64(c.n.placeFail.Load()), "failed")
	ch <- prometheus.MustNewConstMetric(descFailovers, prometheus.CounterValue, float64(c.n.failovers.Load()))
	ch <- prometheus.MustNewConstMetric(descStaleDeleted, prometheus.CounterValue, float64(c.n.staleDeleted.Load()))
	ch <- prometheus.MustNewConstMetric(descLeaseValid, prometheus.GaugeValue, c.n.LeaseValidFor().Seconds())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	nodes, err := c.n.Nodes(ctx)
	if err != nil {
		return
	}
	var upN, downN float64
	for _, ni := range nodes {
		if ni.Up {
			upN++
		} else {
			downN++
		}
	}
	ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, upN, "up")
	ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, downN, "down")
	pls, err := c.n.Volumes().Placements(ctx)
	if err != nil {
		return
	}
	for name, p := range pls {
		if p.Primary != c.n.Name() {
			continue
		}
		for _, cp := range p.Copies {
			if cp.State != "" {
				ch <- prometheus.MustNewConstMetric(descCopyState, prometheus.GaugeValue, 1, name, cp.Node, cp.State)
			}
			if cp.Progress != nil {
				ch <- prometheus.MustNewConstMetric(descResyncProgress, prometheus.GaugeValue, cp.Progress.Percent()/100, name, cp.Node)
			}
		}
	}
}
