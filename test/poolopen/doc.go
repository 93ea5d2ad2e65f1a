// Package poolopen tests, with the real quiver binary, what `quiver server`
// does when it opens a pool: one server per pool (a second is refused before
// it touches anything, on the same ports or others), a pool that is not
// mounted or lost its identity is refused, a volume with hostile or damaged
// files is quarantined while the others are served, and a pool that cannot
// be written is served read-only.
package poolopen
