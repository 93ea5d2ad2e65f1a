package testguest

import "context"

// The queries of a guest's run state and disks that the tests read. QEMU
// names each disk by the node name of its -blockdev.

// Status is query-status's run state: "running", "paused", "io-error",
// "postmigrate", "inmigrate", ...
func (q *QMP) Status(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	if err := q.Execute(ctx, "query-status", nil, &st); err != nil {
		return "", err
	}
	return st.Status, nil
}

// IOStatus is query-block's io-status per node name: "ok", "failed",
// "nospace", or "" for a device that does not track it. Devices without a
// medium are left out.
func (q *QMP) IOStatus(ctx context.Context) (map[string]string, error) {
	var list []struct {
		IOStatus string `json:"io-status"`
		Inserted *struct {
			NodeName string `json:"node-name"`
		} `json:"inserted"`
	}
	if err := q.Execute(ctx, "query-block", nil, &list); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range list {
		if e.Inserted != nil {
			out[e.Inserted.NodeName] = e.IOStatus
		}
	}
	return out, nil
}

// BlockStats are the counters of query-blockstats that tests read: an
// operation is one completed guest request.
type BlockStats struct {
	WrOperations          int64 `json:"wr_operations"`
	WrBytes               int64 `json:"wr_bytes"`
	FailedWrOperations    int64 `json:"failed_wr_operations"`
	FlushOperations       int64 `json:"flush_operations"`
	FailedFlushOperations int64 `json:"failed_flush_operations"`
	RdOperations          int64 `json:"rd_operations"`
	FailedRdOperations    int64 `json:"failed_rd_operations"`
}

// Failed is the number of failed requests of every kind.
func (s BlockStats) Failed() int64 {
	return s.FailedWrOperations + s.FailedFlushOperations + s.FailedRdOperations
}

// BlockStats is query-blockstats per node name; entries without one are
// left out.
func (q *QMP) BlockStats(ctx context.Context) (map[string]BlockStats, error) {
	var list []struct {
		NodeName string     `json:"node-name"`
		Stats    BlockStats `json:"stats"`
	}
	if err := q.Execute(ctx, "query-blockstats", nil, &list); err != nil {
		return nil, err
	}
	out := map[string]BlockStats{}
	for _, e := range list {
		if e.NodeName != "" {
			out[e.NodeName] = e.Stats
		}
	}
	return out, nil
}
