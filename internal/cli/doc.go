// Package cli is the quiver command line: `quiver server` runs a storage
// node, every other command talks to one through internal/client.
//
// It parses arguments and prints results; it holds no storage logic. It may
// import internal/api, internal/client, internal/quantity and, for `quiver
// server` and `quiver pool init` only, internal/server, and for `quiver csi` only, internal/csi;
// nothing imports it but cmd/quiver.
package cli
