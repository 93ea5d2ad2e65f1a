package crash

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKilledFirstStart kills the server during the very first start of fresh
// pools, at random points or as soon as a temporary file appears (while it
// writes the pool's identity), and checks that the next start opens a clean,
// empty pool.
func TestKilledFirstStart(t *testing.T) {
	runs := 20
	if testing.Short() {
		runs = 6
	}
	seed := seedFromEnv(t)
	rng := rand.New(rand.NewPCG(seed, 1<<32))
	bin := buildServer(t)
	ctx := t.Context()
	leftTemp := 0
	for i := range runs {
		dir := filepath.Join(t.TempDir(), "pool")
		first, err := spawn(bin, dir)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(30 * time.Millisecond))))
		} else {
			waitForTemp(dir, time.Second)
		}
		first.Kill()
		if err := first.EndedByItself(); err != nil {
			t.Fatalf("run %d (seed %d): killed during first start: %v\n%s", i, seed, err, first.Log.String())
		}
		if es, _ := os.ReadDir(dir); len(es) > 0 && strings.HasPrefix(es[0].Name(), ".tmp-") {
			leftTemp++
		}
		srv, err := startServer(ctx, bin, dir)
		if err != nil {
			t.Fatalf("run %d (seed %d): start after a killed first start: %v", i, seed, err)
		}
		_, _, probs := verify(ctx, srv.API, dir, model{}, nil)
		srv.Kill()
		if len(probs) > 0 {
			t.Fatalf("run %d (seed %d): after a killed first start:\n%s\n%s", i, seed, strings.Join(probs, "\n"), srv.Log.String())
		}
	}
	t.Logf("%d first starts killed; %d left a temporary pool identity behind", runs, leftTemp)
}

// waitForTemp returns once dir holds a temporary file, or after timeout.
func waitForTemp(dir string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		es, _ := os.ReadDir(dir)
		for _, e := range es {
			if strings.HasPrefix(e.Name(), ".tmp-") {
				return
			}
		}
		time.Sleep(20 * time.Microsecond)
	}
}
