// Package durable writes files so that a crash leaves either the old or the
// new content, never a mix: every metadata write in quiver goes through it.
//
// The contract of each function is stated in its doc comment. The package
// imports only the standard library and x/sys; nothing in quiver is below it.
//
// Imports from quiver: nothing.
package durable
