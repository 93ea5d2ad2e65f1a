// Package interop holds quiver's NBD interoperability acceptance tests: each
// test starts the real `quiver server` binary on a temporary pool, creates
// volumes through the HTTP API (internal/client) and drives real NBD peers
// against it with os/exec: qemu-img (convert, compare, map), qemu-io,
// nbdinfo, nbdcopy and fio's nbd engine. The oracle for allocation is the
// disk image file itself, mapped by qemu-img and by SEEK_DATA/SEEK_HOLE.
//
// Encrypted volumes are driven the same way, with their key-encryption keys
// in a key file or in a PyKMIP server the test starts
// (internal/crypt/kmip/kmiptest) and administers through the KMIP client
// (internal/crypt/kmip).
//
// Run them with `go test ./test/interop/`. A test whose peer is missing
// skips locally and fails when CI is set. -short skips the 1 GiB nbdcopy
// round trip, except under CI. When the tests run with -race the server is
// built with the race detector too, and a race report in its log fails the
// test.
//
// The package is test-only: it talks to the server through internal/client
// and the NBD wire, and must not import the server side (internal/server,
// internal/pool, internal/nbd).
package interop
