// Package durable writes files so that a crash leaves either the old or the
// new content, never a mix: every metadata write in quiver goes through it.
// Every call it makes to the filesystem goes through the storage layer
// (internal/storage), so a twin of that layer sees its syncs.
//
// The contract of each function is stated in its doc comment.
//
// Imports from quiver: storage.
package durable
