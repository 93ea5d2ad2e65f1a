package testguest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"
)

// QMP is a client of the QEMU Machine Protocol over a unix socket: one JSON
// object per line each way. After the server's greeting the client sends
// qmp_capabilities to leave negotiation mode; then each command gets exactly
// one reply, {"return": ...} or {"error": {"class", "desc"}}, carrying the
// command's "id". Asynchronous events ({"event": ...}) may arrive at any
// time between replies; they are kept for the failure log.
type QMP struct {
	mu     sync.Mutex // one command at a time
	conn   net.Conn
	r      *bufio.Reader
	nextID int
	events []string
}

type qmpMessage struct {
	QMP    json.RawMessage `json:"QMP"`
	Event  string          `json:"event"`
	Data   json.RawMessage `json:"data"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	ID json.RawMessage `json:"id"`
}

// QMPError is a command's {"error": ...} reply.
type QMPError struct {
	Command, Class, Desc string
}

func (e *QMPError) Error() string { return fmt.Sprintf("QMP %s: %s: %s", e.Command, e.Class, e.Desc) }

// DialQMP connects to QEMU's QMP socket, retrying until QEMU has created it
// or ctx ends, reads the greeting and negotiates capabilities.
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
	q := &QMP{conn: conn, r: bufio.NewReaderSize(conn, 1<<16)}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
	}
	greeting, err := q.read()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	if greeting.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("QMP greeting: unexpected message")
	}
	if err := q.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

func (q *QMP) read() (*qmpMessage, error) {
	line, err := q.r.ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	m := &qmpMessage{}
	if err := json.Unmarshal(line, m); err != nil {
		return nil, fmt.Errorf("bad QMP message %q: %w", line, err)
	}
	return m, nil
}

// Execute runs one command with args (nil for none) and decodes its return
// value into out (nil to discard it). The deadline is ctx's, at most 30 s.
func (q *QMP) Execute(ctx context.Context, command string, args, out any) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dl, _ := ctx.Deadline()
	if err := q.conn.SetDeadline(dl); err != nil {
		return err
	}
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
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("QMP %s: %w", command, err)
	}
	for {
		m, err := q.read()
		if err != nil {
			return fmt.Errorf("QMP %s: %w", command, err)
		}
		if m.Event != "" {
			q.events = append(q.events, m.Event+" "+string(m.Data))
			continue
		}
		if string(m.ID) != `"`+id+`"` {
			return fmt.Errorf("QMP %s: reply for id %s, want %s", command, m.ID, id)
		}
		if m.Error != nil {
			return &QMPError{Command: command, Class: m.Error.Class, Desc: m.Error.Desc}
		}
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(m.Return, out); err != nil {
			return fmt.Errorf("QMP %s: decode %s: %w", command, m.Return, err)
		}
		return nil
	}
}

// Events returns the events seen so far, one per line.
func (q *QMP) Events() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]string(nil), q.events...)
}

// Close closes the connection (QEMU goes on running).
func (q *QMP) Close() error { return q.conn.Close() }
