// Package cli is the quiver command line: `quiver server` runs a storage
// node, every other command talks to one through internal/client.
//
// It parses arguments and prints results; it holds no storage logic. It may
// import internal/api, internal/client, internal/quantity and, for `quiver
// server` and `quiver pool init` only, internal/server, for `quiver csi`
// only, internal/csi, internal/nbd for the default NBD address only, and
// internal/durable to write the server's ready file; nothing imports it but
// cmd/quiver.
//
// It also imports internal/cluster, for the type of `quiver server`'s cluster
// flags only.
//
// Imports from quiver: api, blockdev, buildinfo, client, cluster, csi, durable, imageconv, kubevirt/hook, kubevirt/webhook, nbd, ova, pluginreg, quantity, server, tlscert.
package cli
