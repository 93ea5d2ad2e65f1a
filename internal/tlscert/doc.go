// Package tlscert owns quiver's TLS material: a server's certificate and
// key read from files and reloaded in place (Pair, for certificate
// rotation without dropping established connections), the server-side
// tls.Config built on it (with optional or required client certificates),
// the client-side tls.Config that trusts a CA file and may present a
// client certificate, and Authority, the CA that issues the certificates
// of a cluster's etcd (quiver cluster certs). The transports (nbd through
// server, the API server, the client and the CSI driver) and the cluster's
// etcd client use it; it knows nothing of them.
//
// Imports from quiver: nothing.
package tlscert
