// Package quantity converts between byte counts and the Kubernetes quantity
// notation people type and read ("40Gi", "500M", "1.5Ti").
//
// It owns the command-line spelling of sizes only: the wire carries integer
// bytes (see internal/api). It must not import any other quiver package.
//
// Imports from quiver: nothing.
package quantity
