package metrics

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/quiverstorage/quiver/internal/pool"
)

// TestErrorKind: errors are filed by the classes the storage layer gives
// them (pool's sentinels are those classes), not by raw errno.
func TestErrorKind(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("write: %w: %w", pool.ErrNoSpace, syscall.ENOSPC), "no_space"},
		{fmt.Errorf("write: %w: %w", pool.ErrNoSpace, syscall.EDQUOT), "no_space"},
		{fmt.Errorf("write: %w: %w", pool.ErrReadOnly, syscall.EROFS), "read_only"},
		{fmt.Errorf("flush: %w: %w: %w", pool.ErrSyncFailed, pool.ErrIO, syscall.EIO), "sync"},
		{fmt.Errorf("flush: %w: %w: %w", pool.ErrSyncFailed, pool.ErrNoSpace, syscall.ENOSPC), "sync"},
		{fmt.Errorf("read: %w: %w", pool.ErrIO, syscall.EIO), "io"},
		{pool.ErrFenced, "fenced"},
		{pool.ErrOutOfRange, "invalid"},
		{pool.ErrDiskRemoved, "gone"},
	} {
		if got := errorKind(tc.err); got != tc.want {
			t.Errorf("errorKind(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
