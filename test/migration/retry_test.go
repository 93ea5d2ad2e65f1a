package migration

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testserver"
)

const (
	attemptEnv = "QUIVER_MIGRATION_ATTEMPT" // set in a child attempt
	binEnv     = "QUIVER_MIGRATION_BIN"     // the parent's server binary
)

// guestCrash matches the console of a guest whose kernel died. Under TCG,
// QEMU 7.2's migration now and then corrupts the destination guest's memory
// (list_add corruption, kernel BUG in blk-flush right after resuming), on a
// loaded machine even with single-threaded TCG: a fault of the emulator, not
// of the disks, which the guest only writes (docs/live-migration.md).
var guestCrash = regexp.MustCompile(`kernel BUG at|list_add corruption|list_del corruption|Oops: |general protection fault|Kernel panic`)

const maxAttempts = 3

// retryOnGuestCrash runs the test named child in a child process of this test
// binary, up to maxAttempts times while the only failure is a crash of the
// destination guest's kernel. Any other failure fails at once, with the
// child's output; so does the last crash. Each crash is logged.
func retryOnGuestCrash(t *testing.T, child string) {
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+child+"$", "-test.v", "-test.count=1", "-test.timeout=5m")
		cmd.Env = append(os.Environ(), attemptEnv+"=1", binEnv+"="+quiverBin)
		out, err := cmd.CombinedOutput()
		cancel()
		text := string(out)
		if err == nil && strings.Contains(text, "--- PASS: "+child) {
			for _, line := range strings.Split(text, "\n") {
				if strings.Contains(line, "migration completed") || strings.Contains(line, "booted") {
					t.Log(strings.TrimSpace(line))
				}
			}
			return
		}
		if err == nil && strings.Contains(text, "--- SKIP: "+child) {
			t.Skipf("%s skipped:\n%s", child, testserver.Tail(text, 20)) // a prerequisite is missing (never under CI)
		}
		crash := guestCrash.FindString(text)
		if crash == "" || attempt == maxAttempts {
			t.Fatalf("attempt %d of %d failed (%v):\n%s", attempt, maxAttempts, err, testserver.Tail(text, 300))
		}
		t.Logf("attempt %d: the destination guest's kernel crashed after the migration (%q), a TCG fault; retrying", attempt, crash)
	}
}
