// Package job runs long operations (snapshots by copy, rollbacks, bulk
// clones) in the background with progress and cancellation. A Job satisfies
// pool.Progress structurally; the package imports no other quiver package.
//
// Jobs live in memory: a crash loses the job record, and the pool's start-up
// recovery removes whatever the job left unfinished.
//
// Imports from quiver: nothing.
package job
