package client

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// MetricsPath is where the server exposes its Prometheus metrics, next to
// (not under) the versioned API, behind the same bearer token.
const MetricsPath = "/metrics"

// maxMetricsBody bounds how much of a scrape is read: a node with thousands
// of disks exposes a few MB.
const maxMetricsBody = 64 << 20

// Metrics is one scrape of the server's /metrics, parsed.
type Metrics struct {
	// Families holds every metric family by name, as expfmt parsed it.
	Families map[string]*dto.MetricFamily
}

// Sample is one series of a scrape: its labels (without the metric name)
// and its value.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Metrics scrapes /metrics in the Prometheus text format and parses it.
func (c *Client) Metrics(ctx context.Context) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+MetricsPath, nil)
	if err != nil {
		return Metrics{}, fmt.Errorf("GET %s: %w", MetricsPath, err)
	}
	// Ask for the text format: the server would otherwise be free to pick
	// the protobuf one.
	req.Header.Set("Accept", string(expfmt.FmtText))
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.httpc.Do(req)
	if err != nil {
		return Metrics{}, err
	}
	defer func() {
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
		resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return Metrics{}, decodeError(resp)
	}
	return ParseMetrics(io.LimitReader(resp.Body, maxMetricsBody))
}

// ParseMetrics parses the Prometheus text exposition format.
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Metrics{}, fmt.Errorf("parse metrics: %w", err)
	}
	return Metrics{Families: fams}, nil
}

// Names returns the name of every series the scrape holds, sorted, as a
// query names them: a histogram is its name_bucket, name_sum and
// name_count series, a summary its name, name_sum and name_count.
func (m Metrics) Names() []string {
	set := map[string]bool{}
	for name, f := range m.Families {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			set[name+"_bucket"], set[name+"_sum"], set[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			set[name], set[name+"_sum"], set[name+"_count"] = true, true, true
		default:
			set[name] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// Samples returns the series called name whose labels include every pair
// of match (nil matches all). name is a series name as Names gives it, so
// a histogram's name_sum and name_count are counters, and name_bucket has
// one series per bucket with its "le" label.
func (m Metrics) Samples(name string, match map[string]string) []Sample {
	var out []Sample
	if f, ok := m.Families[name]; ok {
		for _, s := range f.GetMetric() {
			if l := labels(s); matches(l, match) {
				out = append(out, Sample{Labels: l, Value: value(f.GetType(), s)})
			}
		}
		return out
	}
	for _, suffix := range []string{"_sum", "_count", "_bucket"} {
		base, ok := strings.CutSuffix(name, suffix)
		f := m.Families[base]
		if !ok || f == nil {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, d := range derived(suffix, labels(s), s) {
				if matches(d.Labels, match) {
					out = append(out, d)
				}
			}
		}
	}
	return out
}

// Sum adds the values of Samples(name, match); 0 when there are none.
func (m Metrics) Sum(name string, match map[string]string) float64 {
	var sum float64
	for _, s := range m.Samples(name, match) {
		sum += s.Value
	}
	return sum
}

func labels(s *dto.Metric) map[string]string {
	l := make(map[string]string, len(s.GetLabel()))
	for _, p := range s.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

func matches(l, match map[string]string) bool {
	for k, v := range match {
		if l[k] != v {
			return false
		}
	}
	return true
}

// value is the value of a counter, gauge or untyped sample; for a
// histogram or summary, its sample count.
func value(t dto.MetricType, s *dto.Metric) float64 {
	switch t {
	case dto.MetricType_COUNTER:
		return s.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return s.GetGauge().GetValue()
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		return histogramCount(s.GetHistogram())
	case dto.MetricType_SUMMARY:
		return float64(s.GetSummary().GetSampleCount())
	default:
		return s.GetUntyped().GetValue()
	}
}

// derived returns the _sum, _count or _bucket series of one histogram or
// summary sample.
func derived(suffix string, l map[string]string, s *dto.Metric) []Sample {
	h, sum := s.GetHistogram(), s.GetSummary()
	switch {
	case suffix == "_sum" && h != nil:
		return []Sample{{Labels: l, Value: h.GetSampleSum()}}
	case suffix == "_count" && h != nil:
		return []Sample{{Labels: l, Value: histogramCount(h)}}
	case suffix == "_sum" && sum != nil:
		return []Sample{{Labels: l, Value: sum.GetSampleSum()}}
	case suffix == "_count" && sum != nil:
		return []Sample{{Labels: l, Value: float64(sum.GetSampleCount())}}
	case suffix == "_bucket" && h != nil:
		out := make([]Sample, 0, len(h.GetBucket()))
		for _, b := range h.GetBucket() {
			bl := maps.Clone(l)
			bl["le"] = strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
			n := float64(b.GetCumulativeCount())
			if b.CumulativeCountFloat != nil {
				n = b.GetCumulativeCountFloat()
			}
			out = append(out, Sample{Labels: bl, Value: n})
		}
		return out
	}
	return nil
}

// histogramCount is the sample count, which the text parser stores as a
// float when any count of the histogram was written as one.
func histogramCount(h *dto.Histogram) float64 {
	if h.SampleCountFloat != nil {
		return h.GetSampleCountFloat()
	}
	return float64(h.GetSampleCount())
}
