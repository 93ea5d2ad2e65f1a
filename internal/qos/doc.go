// Package qos limits the I/O of one volume, that is of one whole VM: a single
// budget across all its disks (rw_iops, rw_mbytes, and optional read/write
// splits). Limits are token buckets (golang.org/x/time/rate) that change
// live. It imports nothing from quiver.
//
// Imports from quiver: nothing.
package qos
