package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quiverstorage/quiver/internal/pool"
)

// poolCollector reads capacities and allocation from the pool at scrape
// time, so the numbers are never stale and cost nothing between scrapes.
type poolCollector struct {
	p *pool.Pool
}

var (
	descCapacity = prometheus.NewDesc("quiver_volume_capacity_bytes", "Capacity (storage budget) of a volume.", []string{"volume"}, nil)
	descVirtual  = prometheus.NewDesc("quiver_disk_virtual_bytes", "Virtual size of a disk.", []string{"volume", "disk"}, nil)
	descAlloc    = prometheus.NewDesc("quiver_disk_allocated_bytes", "Bytes a disk image occupies in the pool.", []string{"volume", "disk"}, nil)
	descSnaps    = prometheus.NewDesc("quiver_volume_snapshots", "Snapshots of a volume.", []string{"volume"}, nil)
	descEpoch    = prometheus.NewDesc("quiver_volume_writer_epoch", "Writer epoch of a volume: grows by one each time the writer role moves.", []string{"volume"}, nil)
	descTotal    = prometheus.NewDesc("quiver_pool_size_bytes", "Size of the pool's filesystem.", nil, nil)
	descFree     = prometheus.NewDesc("quiver_pool_free_bytes", "Free space in the pool's filesystem.", nil, nil)
	descVolumes  = prometheus.NewDesc("quiver_pool_volumes", "Volumes in the pool.", nil, nil)
	descProv     = prometheus.NewDesc("quiver_pool_provisioned_bytes", "Sum of the virtual sizes of every disk; above quiver_pool_size_bytes the pool is overcommitted.", nil, nil)
	descSyncFail = prometheus.NewDesc("quiver_sync_failures_total", "fdatasync calls on disk images that failed (each fails its disk's flushes until it is reopened).", nil, nil)
)

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCapacity, descVirtual, descAlloc, descSnaps, descEpoch, descTotal, descFree, descVolumes, descProv, descSyncFail} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	vols := c.p.List(nil)
	var provisioned int64
	for _, v := range vols {
		ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, float64(v.Capacity), v.Name)
		ch <- prometheus.MustNewConstMetric(descSnaps, prometheus.GaugeValue, float64(v.Snapshots), v.Name)
		ch <- prometheus.MustNewConstMetric(descEpoch, prometheus.GaugeValue, float64(v.Writer.Epoch), v.Name)
		for _, d := range v.Disks {
			ch <- prometheus.MustNewConstMetric(descVirtual, prometheus.GaugeValue, float64(d.Size), v.Name, d.Name)
			provisioned += d.Size
			ch <- prometheus.MustNewConstMetric(descAlloc, prometheus.GaugeValue, float64(d.Allocated), v.Name, d.Name)
		}
	}
	ch <- prometheus.MustNewConstMetric(descVolumes, prometheus.GaugeValue, float64(len(vols)))
	ch <- prometheus.MustNewConstMetric(descProv, prometheus.GaugeValue, float64(provisioned))
	ch <- prometheus.MustNewConstMetric(descSyncFail, prometheus.CounterValue, float64(c.p.SyncFailures()))
	if info, err := c.p.Info(); err == nil {
		ch <- prometheus.MustNewConstMetric(descTotal, prometheus.GaugeValue, float64(info.TotalBytes))
		ch <- prometheus.MustNewConstMetric(descFree, prometheus.GaugeValue, float64(info.FreeBytes))
	}
}
