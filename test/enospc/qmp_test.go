package enospc

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

// qmpEvent is one asynchronous QMP event and when the test read it.
type qmpEvent struct {
	Name string
	Data json.RawMessage
	At   time.Time
}

// qmpClient speaks QMP over a unix socket: one JSON object per line. A
// reader goroutine hands each command's reply (matched by "id") to the
// command and collects every event, so that the test can wait for one
// while no command is running, as it must for BLOCK_IO_ERROR and STOP.
type qmpClient struct {
	conn net.Conn

	cmdMu  sync.Mutex // one command at a time
	nextID int

	mu      sync.Mutex
	replies map[string]chan qmpReply
	events  []qmpEvent
	changed chan struct{} // closed and replaced whenever events grow

	done chan struct{} // closed when the reader ends
	rerr error         // why it ended, set before done is closed
}

type qmpReply struct {
	Return json.RawMessage
	Error  *struct{ Class, Desc string }
}

// dialQMP connects to QEMU's QMP socket, retrying until QEMU has created it,
// and leaves negotiation mode.
func dialQMP(ctx context.Context, path string) (*qmpClient, error) {
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
	q := &qmpClient{conn: conn, replies: map[string]chan qmpReply{}, changed: make(chan struct{}), done: make(chan struct{})}
	go q.read(bufio.NewReaderSize(conn, 1<<16))
	if err := q.execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// read dispatches every message until the connection ends; the greeting
// ({"QMP": ...}) is neither a reply nor an event and is dropped.
func (q *qmpClient) read(r *bufio.Reader) {
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
			q.events = append(q.events, qmpEvent{Name: m.Event, Data: m.Data, At: time.Now()})
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

// execute runs one command and decodes its return value into out (nil to
// drop it).
func (q *qmpClient) execute(ctx context.Context, command string, args, out any) error {
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
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("QMP %s: %w", command, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var r qmpReply
	select {
	case r = <-ch:
	case <-q.done:
		return fmt.Errorf("QMP %s: connection ended: %v", command, q.rerr)
	case <-ctx.Done():
		return fmt.Errorf("QMP %s: %w", command, ctx.Err())
	}
	if r.Error != nil {
		return fmt.Errorf("QMP %s: %s: %s", command, r.Error.Class, r.Error.Desc)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(r.Return, out); err != nil {
		return fmt.Errorf("QMP %s: decode %s: %w", command, r.Return, err)
	}
	return nil
}

// waitEvent waits for the first event from index from on (an index into
// every event seen) for which match is true, and returns it with its index.
func (q *qmpClient) waitEvent(ctx context.Context, from int, match func(qmpEvent) bool) (qmpEvent, int, error) {
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
			return qmpEvent{}, 0, fmt.Errorf("QMP connection ended: %v", q.rerr)
		case <-ctx.Done():
			return qmpEvent{}, 0, ctx.Err()
		}
	}
}

// eventLog is every event seen so far, one per line, for failure messages.
func (q *qmpClient) eventLog() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var b strings.Builder
	for _, e := range q.events {
		fmt.Fprintf(&b, "%s %s %s\n", e.At.Format("15:04:05.000"), e.Name, e.Data)
	}
	return b.String()
}

func (q *qmpClient) close() error { return q.conn.Close() }
