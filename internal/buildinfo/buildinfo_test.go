package buildinfo

import (
	"runtime"
	"testing"
)

func TestGet(t *testing.T) {
	v := Get()
	if v.Version == "" {
		t.Error("Version is empty; want dev or the release")
	}
	if v.GoVersion != runtime.Version() {
		t.Errorf("GoVersion = %q, want %q", v.GoVersion, runtime.Version())
	}
	if v.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("Platform = %q", v.Platform)
	}
}
