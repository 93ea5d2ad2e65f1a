package storage

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// MutateEnv names the environment variable of the mutation check: when it
// holds a sync label (SyncLabel), every sync at that call site does nothing
// and returns nil, in the OS FS and in the twins alike, as if the call had
// been deleted from the code. internal/storage/mutatesyncs runs the
// durability tests once per label.
const MutateEnv = "QUIVER_MUTATE_SYNC"

var mutated = os.Getenv(MutateEnv)

// SyncLabel names the sync point that called into the storage layer: the
// first caller outside the layer and its twins, as "pkg.Func:file.go:line"
// (for example "durable.WriteFile:durable.go:80").
func SyncLabel() string {
	var pcs [24]uintptr
	n := runtime.Callers(2, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	for {
		fr, more := frames.Next()
		if !inLayer(fr.Function) {
			return fmt.Sprintf("%s:%s:%d", shortFunc(fr.Function), filepath.Base(fr.File), fr.Line)
		}
		if !more {
			return "unknown"
		}
	}
}

// Mutated reports whether the sync at label is switched off by the
// mutation check.
func Mutated(label string) bool { return mutated != "" && label == mutated }

// skipSync reports whether the mutation check switches off the caller's
// sync (SyncLabel is only computed when a mutation is set).
func skipSync() bool { return mutated != "" && SyncLabel() == mutated }

const module = "github.com/quiverstorage/quiver/"

func inLayer(fn string) bool {
	for _, p := range []string{"internal/storage.", "internal/storage/", "internal/faultio."} {
		if strings.HasPrefix(fn, module+p) {
			return true
		}
	}
	return false
}

// shortFunc turns "github.com/.../internal/pool.(*Volume).sync" into
// "pool.(*Volume).sync".
func shortFunc(fn string) string {
	if i := strings.LastIndex(fn, "/"); i >= 0 {
		fn = fn[i+1:]
	}
	return fn
}
