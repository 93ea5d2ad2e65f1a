// Package console serves quiver's web console (docs/console.md): the built
// front end of web/console, embedded in the binary from dist/ (rebuilt by
// `make console`, committed so that `make build` needs no npm).
//
// It serves files only. The page holds no data and no secret: it reads and
// changes everything through the v1 API with the user's own credential, so
// the API's authentication and roles apply to the console unchanged. The
// server wiring mounts Handler at Prefix on the API's listener.
//
// Imports from quiver: nothing.
package console
