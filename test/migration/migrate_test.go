package migration

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// migrationInfo is what the test reads of QMP query-migrate. Times are in
// milliseconds.
type migrationInfo struct {
	Status    string   `json:"status"`
	TotalTime int64    `json:"total-time"`
	Downtime  int64    `json:"downtime"`
	SetupTime int64    `json:"setup-time"`
	ErrorDesc string   `json:"error-desc"`
	RAM       *ramInfo `json:"ram"`
}

type ramInfo struct {
	Transferred int64 `json:"transferred"`
	Total       int64 `json:"total"`
	Duplicate   int64 `json:"duplicate"` // zero pages, sent as a flag
	Normal      int64 `json:"normal"`    // pages sent in full
}

func (r *ramInfo) String() string {
	if r == nil {
		return "no RAM transferred"
	}
	return fmt.Sprintf("%.1f MiB of RAM transferred (%d pages in full, %d zero pages) of %d MiB",
		float64(r.Transferred)/(1<<20), r.Normal, r.Duplicate, r.Total>>20)
}

func (m migrationInfo) finished() bool {
	switch m.Status {
	case "completed", "failed", "cancelled":
		return true
	}
	return false
}

// startMigration has dst listen on uri and src migrate to it at most
// bandwidth bytes per second.
func startMigration(t *testing.T, ctx context.Context, src, dst *vm, uri string, bandwidth int64) {
	t.Helper()
	if err := dst.QMP.Execute(ctx, "migrate-incoming", map[string]any{"uri": uri}, nil); err != nil {
		t.Fatalf("%s: %v", dst.name, err)
	}
	if err := src.QMP.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": bandwidth}, nil); err != nil {
		t.Fatalf("%s: %v", src.name, err)
	}
	if err := src.QMP.Execute(ctx, "migrate", map[string]any{"uri": uri}, nil); err != nil {
		t.Fatalf("%s: %v", src.name, err)
	}
}

// waitMigration polls query-migrate on the source until done says so.
func (v *vm) waitMigration(t *testing.T, ctx context.Context, done func(migrationInfo) bool) migrationInfo {
	t.Helper()
	for {
		var m migrationInfo
		if err := v.QMP.Execute(ctx, "query-migrate", nil, &m); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		if done(m) {
			return m
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: migration still %q: %v", v.name, m.Status, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
