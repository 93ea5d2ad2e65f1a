// Package history is a checker of a block device's content against the
// history of the requests that clients made to it: every write invoked,
// acknowledged or failed, and every FLUSH, in the order the clients saw
// them. It is the oracle of test/history, which writes a replicated volume
// through faults of the cluster and compares every copy with it.
//
// Each block written carries its own identity (Stamp): the disk and offset
// it was written to, the writer and that writer's sequence number, and a
// CRC32C, so a block read back names the write it holds, or shows it is
// torn, zeros, or another block's. The model of a block is a register: the
// content may legally be any write that no acknowledged write is known to
// follow (a write acknowledged before another was invoked is superseded by
// it), the initial zeros while no write was acknowledged, and any write
// still in flight. A write acknowledged before a FLUSH was sent on the same
// handle, the FLUSH then acknowledged, is durable; a block holding content
// older than its last durable write lost a durable write, one older than its
// last acknowledged write lost an acknowledged one (docs/cluster.md, "What a
// failure loses": a replicated volume loses neither).
//
// Imports from quiver: nothing.
package history
