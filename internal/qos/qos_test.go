package qos

import (
	"context"
	"testing"
	"time"
)

// fakeClock is not available in x/time/rate, so these tests count tokens
// instead of timing: they check admission decisions, not speed.

func TestUnlimitedAdmitsAtOnce(t *testing.T) {
	q := New(Limits{})
	for range 100000 {
		if d, err := q.Wait(context.Background(), Write, 1<<20); err != nil || d != 0 {
			t.Fatalf("unlimited waited %v, %v", d, err)
		}
	}
}

func TestLimitRefusesWhenContextEndsBeforeTokens(t *testing.T) {
	q := New(Limits{RWIOPS: 10})
	ctx, cancel := context.WithCancel(context.Background())
	// The burst is one operation (10 IOPS * 100 ms): the second request has to
	// wait ~100 ms, so a cancelled context fails it.
	if _, err := q.Wait(ctx, Read, 0); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := q.Wait(ctx, Read, 0); err == nil {
		t.Fatal("second request admitted without tokens")
	}
}

func TestLargeRequestIsAdmittedAndPaid(t *testing.T) {
	q := New(Limits{RWMBytes: 1000}) // burst 100 MB
	// 300 MB is three bursts: admitted, and the bucket is left empty.
	if _, err := q.Wait(context.Background(), Write, 300e6); err != nil {
		t.Fatal(err)
	}
	if tok := q.rwBytes.Tokens(); tok > 50e6 { // a full bucket would hold 100 MB
		t.Fatalf("large request not paid for: %v tokens left", tok)
	}
}

func TestSetChangesLimitsLive(t *testing.T) {
	q := New(Limits{RWIOPS: 100})
	q.Set(Limits{ReadMBytes: 5})
	if got := q.Limits(); got != (Limits{ReadMBytes: 5}) {
		t.Fatalf("limits %+v", got)
	}
	if q.rwOps.Limit() != rateInf() || q.rBytes.Limit() != 5e6 {
		t.Fatalf("buckets not updated: rw %v read bytes %v", q.rwOps.Limit(), q.rBytes.Limit())
	}
	q.Set(Limits{})
	if d, _ := q.Wait(context.Background(), Read, 1<<30); d > time.Second {
		t.Fatalf("unlimited after Set waited %v", d)
	}
}

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		l  Limits
		ok bool
	}{{Limits{}, true}, {Limits{RWIOPS: 500, RWMBytes: 50}, true}, {Limits{RWIOPS: -1}, false}, {Limits{WriteMBytes: MaxLimit + 1}, false}} {
		if err := tt.l.Validate(); (err == nil) != tt.ok {
			t.Errorf("Validate(%+v) = %v", tt.l, err)
		}
	}
}
