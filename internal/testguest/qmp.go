package testguest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// QMP is a client of the QEMU Machine Protocol over a unix socket: one JSON
// object per line each way. After the server's greeting the client sends
// qmp_capabilities to leave negotiation mode; then each command gets exactly
// one reply, {"return": ...} or {"error": {"class", "desc"}}, carrying the
// command's "id". Asynchronous events ({"event": ...}) may arrive at any
// time. A reader goroutine hands each reply to its command and keeps every
// event, so a test can wait for one while no command runs (BLOCK_IO_ERROR,
// STOP) and print them all when it fails.
type QMP struct {
	conn net.Conn

	cmdMu  sync.Mutex // one command at a time
	nextID int

	mu      sync.Mutex
	replies map[string]chan qmpReply
	events  []Event
	changed chan struct{} // closed and replaced whenever events grow

	done chan struct{} // closed when the reader ends
	rerr error         // why it ended, set before done is closed
}

// Event is one asynchronous QMP event and when the client read it.
type Event struct {
	Name string
	Data json.RawMessage
	At   time.Time
}

type qmpReply struct {
	Return json.RawMessage
	Error  *struct{ Class, Desc string }
}

// QMPError is a command's {"error": ...} reply.
type QMPError struct {
	Command, Class, Desc string
}

func (e *QMPError) Error() string { return fmt.Sprintf("QMP %s: %s: %s", e.Command, e.Class, e.Desc) }

// DialQMP connects to QEMU's QMP socket, retrying until QEMU has created it
// or ctx ends, and leaves negotiation mode.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var conn net.Conn
	for {
		var err error
		var d net.Dialer
		if conn, err = d.DialContext(ctx, "unix", path); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to QMP socket %s: %w", path, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	q := &QMP{conn: conn, replies: map[string]chan qmpReply{}, changed: make(chan struct{}), done: make(chan struct{})}
	go q.read(bufio.NewReaderSize(conn, 1<<16))
	if err := q.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// read dispatches every message until the connection ends; the greeting
// ({"QMP": ...}) is neither a reply nor an event and is dropped.
func (q *QMP) read(r *bufio.Reader) {
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			q.rerr = err
			close(q.done)
			return
		}
		var m struct {
			Event string          `json:"event"`
			Data  json.RawMessage `json:"data"`
			ID    string          `json:"id"`
			qmpReply
		}
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		q.mu.Lock()
		switch {
		case m.Event != "":
			q.events = append(q.events, Event{Name: m.Event, Data: m.Data, At: time.Now()})
			close(q.changed)
			q.changed = make(chan struct{})
		case m.ID != "":
			if ch := q.replies[m.ID]; ch != nil {
				ch <- m.qmpReply
				delete(q.replies, m.ID)
			}
		}
		q.mu.Unlock()
	}
}

// Execute runs one command with args (nil for none) and decodes its return
// value into out (nil to discard it). The deadline is ctx's, at most 30 s.
func (q *QMP) Execute(ctx context.Context, command string, args, out any) error {
	q.cmdMu.Lock()
	defer q.cmdMu.Unlock()
	q.nextID++
	id := fmt.Sprintf("t%d", q.nextID)
	req := map[string]any{"execute": command, "id": id}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	ch := make(chan qmpReply, 1)
	q.mu.Lock()
	q.replies[id] = ch
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		delete(q.replies, id)
		q.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dl, _ := ctx.Deadline()
	_ = q.conn.SetWriteDeadline(dl)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("QMP %s: %w", command, err)
	}
	var r qmpReply
	select {
	case r = <-ch:
	case <-q.done:
		return fmt.Errorf("QMP %s: connection ended: %v", command, q.rerr)
	case <-ctx.Done():
		return fmt.Errorf("QMP %s: %w", command, ctx.Err())
	}
	if r.Error != nil {
		return &QMPError{Command: command, Class: r.Error.Class, Desc: r.Error.Desc}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(r.Return, out); err != nil {
		return fmt.Errorf("QMP %s: decode %s: %w", command, r.Return, err)
	}
	return nil
}

// WaitEvent waits for the first event from index from on (an index into
// every event seen) for which match is true, and returns it with its index.
func (q *QMP) WaitEvent(ctx context.Context, from int, match func(Event) bool) (Event, int, error) {
	for {
		q.mu.Lock()
		for i := from; i < len(q.events); i++ {
			if match(q.events[i]) {
				e := q.events[i]
				q.mu.Unlock()
				return e, i, nil
			}
		}
		from = len(q.events)
		changed := q.changed
		q.mu.Unlock()
		select {
		case <-changed:
		case <-q.done:
			return Event{}, 0, fmt.Errorf("QMP connection ended: %v", q.rerr)
		case <-ctx.Done():
			return Event{}, 0, ctx.Err()
		}
	}
}

// Events returns the events seen so far, one per line: name and data.
func (q *QMP) Events() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]string, len(q.events))
	for i, e := range q.events {
		out[i] = e.Name + " " + string(e.Data)
	}
	return out
}

// EventLog is every event seen so far with the time it was read, one per
// line, for failure messages.
func (q *QMP) EventLog() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var b strings.Builder
	for _, e := range q.events {
		fmt.Fprintf(&b, "%s %s %s\n", e.At.Format("15:04:05.000"), e.Name, e.Data)
	}
	return b.String()
}

// Close closes the connection (QEMU goes on running).
func (q *QMP) Close() error { return q.conn.Close() }
