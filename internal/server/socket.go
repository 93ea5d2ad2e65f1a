package server

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
)

// ListenUnix listens on a unix socket at path that only its owner (mode
// 0600) or, with a group, also that group's members (0660) can connect to:
// connecting takes write permission on the socket file. The socket is made
// in a private directory beside path, given its mode and group there, and
// renamed into place, so it is never reachable with looser permissions. A
// stale socket at path is replaced; anything else there is an error.
func ListenUnix(path, group string) (net.Listener, error) {
	gid := -1
	mode := os.FileMode(0o600)
	if group != "" {
		g, err := lookupGroup(group)
		if err != nil {
			return nil, err
		}
		gid, mode = g, 0o660
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".quiver-sock-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		_ = ln.Close()
		return nil, err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(err)
	}
	if gid >= 0 {
		if err := os.Chown(tmp, -1, gid); err != nil {
			return fail(fmt.Errorf("socket %s: group %s: %w", path, group, err))
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	return &unlinkListener{Listener: ln, path: path}, nil
}

// unlinkListener removes its socket file when closed.
type unlinkListener struct {
	net.Listener
	path string
}

// Addr is the socket's final path, not the one it was made at.
func (l *unlinkListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unlinkListener) Close() error {
	err := l.Listener.Close()
	_ = os.Remove(l.path)
	return err
}

// lookupGroup returns the ID of a group given by name or number.
func lookupGroup(group string) (int, error) {
	if id, err := strconv.Atoi(group); err == nil {
		return id, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("socket group %q: %w", group, err)
	}
	return strconv.Atoi(g.Gid)
}
