// Package security holds quiver's abuse and local-user acceptance tests
// (docs/security.md): each starts the real `quiver server` binary and attacks
// it the way the findings of issue 13 did.
//
//   - TestLocalUsers: with --token-file, an unprivileged local user (uid
//     65534, through setpriv) is refused every listing, read, write, delete,
//     attach and fence over the loopback API, loopback NBD (qemu-io,
//     nbdinfo) and the unix sockets, and the pool is unchanged afterwards.
//   - TestAbuse: in a network namespace of its own, 20,000 idle API
//     connections and 2,000 half-open NBD handshakes, then pipelined 32 MiB
//     READs whose replies are never read, then a server short of file
//     descriptors; a client with a token keeps getting its data, the
//     server's RSS stays under a bound and comes back down.
//
// They need root and setpriv, ip, qemu-io and nbdinfo: they skip without
// them, and fail instead when CI is set. The package talks to the server
// through internal/client, the CLI binary and the NBD wire only.
package security
