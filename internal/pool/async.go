package pool

// Starter is implemented by disk handles whose requests are served
// elsewhere, over the network (a forwarded disk: forward.Disk), and which
// can start a read or a write without waiting for its end: the caller goes
// on (reading its next request) while the request travels, and its end is
// reported to done, on the goroutine that learns it (the handle's reply
// reader), where the caller answers its client. A server runs each request
// on its reader this way, and none goes through a worker: no hand-off
// between goroutines either way.
//
// The outcome is exactly the one ReadAt or WriteAt would have returned,
// with the same guarantees (a write with fua is durable when done is
// called; without, durable after a later Flush); a handle that sends a
// request again after a failure (a new primary) does so before it calls
// done. done is called exactly once for every request started, maybe
// before Start returns; p belongs to the handle until then.
//
// A server sends a started read's data as data, holes as zeros (no
// Extents look-up, no sendfile): a handle whose holes are worth sending as
// such does not start reads.
//
// A started request may be held until Unplug, so that the requests of one
// burst go out together (one system call): the caller calls Unplug before
// it waits for anything (its client, memory, another request's end), or a
// held request may wait for it forever.
type Starter interface {
	StartRead(p []byte, off int64, done Done)
	StartWrite(p []byte, off int64, fua bool, done Done)
	Unplug()
}

// Done receives the end of a started request (Starter): err as ReadAt or
// WriteAt would have returned it. more says that the goroutine calling it
// has the end of another request at hand and calls Done again at once, so
// that the receiver may hold what it makes of this one (a reply to send)
// to send it with the next; a receiver that holds must still send within a
// short bound of its own, since a run of ends may also stop early (a
// request whose connection broke is sent again, and ends later). Done
// must not wait for the receiver's own client (a reply it cannot send
// now is queued): the goroutine calling it reads the ends of every
// request the handle has in flight.
type Done func(err error, more bool)
