//go:build tools

// The commands this module builds, named so that go mod tidy keeps them.
package sidecars

import (
	_ "github.com/kubernetes-csi/external-resizer/cmd/csi-resizer"
)
