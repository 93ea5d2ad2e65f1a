// Package api holds the wire types of quiver's v1 HTTP/JSON API: requests,
// responses, error codes and defaults. It is shared by the server
// (apiserver) and the Go client (client) and imports nothing from quiver, so
// a client never depends on the storage code.
//
// Imports from quiver: nothing.
package api
