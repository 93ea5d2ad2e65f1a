package storage

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// MutateEnv names the environment variable of the mutation check: when it
// holds a sync label (SyncLabel), every sync at that call site does nothing
// and returns nil, in the OS FS and in the twins alike, as if the call had
// been deleted from the code. internal/storage/mutatesyncs runs the
// durability tests once per label.
const MutateEnv = "QUIVER_MUTATE_SYNC"

// SyncLogEnv names the environment variable that lists sync points: when it
// holds a file name, the label of every sync is appended to that file (the
// mutation check collects the sync points its tests reach this way).
const SyncLogEnv = "QUIVER_SYNC_LOG"

var (
	mutated = os.Getenv(MutateEnv)
	syncLog = os.Getenv(SyncLogEnv)
	logMu   sync.Mutex
)

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

// SkipSync is called by every sync of this layer and its twins before it
// does anything: it logs the sync point when SyncLogEnv is set, and reports
// whether the mutation check switches it off. The label is only computed
// when either is set.
func SkipSync() bool {
	if mutated == "" && syncLog == "" {
		return false
	}
	label := SyncLabel()
	if syncLog != "" {
		logSync(label)
	}
	return label == mutated
}

func logSync(label string) {
	logMu.Lock()
	defer logMu.Unlock()
	f, err := os.OpenFile(syncLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(label + "\n")
}

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
