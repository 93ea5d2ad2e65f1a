// Package info is the generated Go code of KubeVirt's hook sidecar API
// (info/*.proto, transcribed from KubeVirt's published definitions);
// regenerate it with make proto, never edit the *.pb.go files by hand.
//
// Imports from quiver: nothing.
package info
