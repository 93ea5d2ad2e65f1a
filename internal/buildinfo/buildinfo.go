// Package buildinfo says which quiver this is: the release version (set at
// link time), the source commit and the Go version, read from what the Go
// toolchain records in the binary.
//
// Imports from quiver: api.
package buildinfo

import (
	"runtime"
	"runtime/debug"

	"github.com/quiverstorage/quiver/internal/api"
)

// Version is the release, set when linking:
//
//	go build -ldflags "-X github.com/quiverstorage/quiver/internal/buildinfo.Version=v0.4.0"
//
// A build without it reports "dev".
var Version = "dev"

// Commit is the source commit, set when linking (`make build` sets both);
// the commit the Go toolchain records, when it does (-buildvcs), wins.
var Commit = ""

// Get returns the version of this binary. Commit is "" when the binary was
// built outside a git checkout (or with -buildvcs=false).
func Get() api.BuildInfo {
	v := api.BuildInfo{Version: Version, Commit: Commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.CommitTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}
