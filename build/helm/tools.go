//go:build tools

// Package helm pins the Helm CLI that scripts/helm builds: helm.sh/helm/v4's
// cmd/helm at the version of this module's go.mod. It is a module of its own
// so that Helm's dependencies (client-go and the rest of its tree) stay out
// of quiver's go.mod; nothing imports it.
package helm

import _ "helm.sh/helm/v4/cmd/helm"
