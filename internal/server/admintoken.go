package server

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/durable"
)

// One admin credential for a cluster (docs/cluster.md, "Admin token").
//
// A node started without --token-file makes an admin token at its first
// start (auth.Store.Bootstrap) before it joins; once joined, its tokens
// are the cluster's (auth.Store.Share), so only the first node's admin
// token works. shareAdminToken makes every node's admin.token the
// cluster's: the first node stores its secret in etcd (sealed,
// cluster.TokenStore.StoreAdminSecret); every other node writes that
// secret to its pool's admin.token (0600, replaced atomically and durably:
// durable.WriteFile) when it joins, or, while none is stored yet, removes
// its own dead one at once, says so in its log, and writes the cluster's
// as soon as it is stored. An admin.token is thus the cluster's or absent,
// never a credential that no longer works.
func (n *node) shareAdminToken(ctx context.Context, ts cluster.TokenStore) error {
	if n.token != "" || n.pool.ReadOnly() {
		return nil
	}
	fsys, log := n.pool.FS(), n.log
	file := filepath.Join(n.pool.Dir(), auth.AdminTokenFile)
	local, err := readAdminToken(n)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	secret, err := ts.AdminSecret(cctx)
	if err != nil {
		return err
	}
	if secret == "" && local != "" && n.store.IsAdmin(local) {
		// This node's tokens are the cluster's: its admin token is the
		// cluster's admin credential.
		if secret, err = ts.StoreAdminSecret(cctx, local); err != nil {
			return err
		}
	}
	// Nodes started together: the first stores its secret a moment after
	// its tokens; wait for it (a while) so that admin.token is the
	// cluster's when the node is ready.
	for wait := time.Now(); secret == "" && firstStartAdmin(n.store) && time.Since(wait) < adminWait; {
		time.Sleep(100 * time.Millisecond)
		if secret, err = ts.AdminSecret(cctx); err != nil {
			return err
		}
	}
	write := func(secret string) bool {
		if !n.store.IsAdmin(secret) {
			return false // revoked: not worth writing
		}
		if secret == local {
			return true
		}
		if err := durable.WriteFile(fsys, auth.AdminTokenFile, []byte(secret+"\n"), 0o600); err != nil {
			log.Error("admin token: the cluster's not written", "file", file, "err", err)
			return false
		}
		log.Info("admin token: the cluster's written (tokens are the cluster's, in etcd)", "file", file)
		return true
	}
	if secret != "" && write(secret) {
		return nil
	}
	if local != "" && !n.store.IsAdmin(local) {
		if err := fsys.Remove(auth.AdminTokenFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		log.Warn("admin token: this node's no longer works on a cluster (tokens are the cluster's, in etcd): removed; "+
			"the cluster's is written here once the first node stores it; meanwhile use the admin.token of the first node's pool",
			"file", file)
	}
	go ts.WatchAdminSecret(ctx, write)
	return nil
}

// adminWait bounds the wait at join for the first node's admin secret.
const adminWait = 5 * time.Second

// firstStartAdmin reports whether the store holds an admin token made at a
// node's first start (auth.Store.Bootstrap), whose node stores its secret.
func firstStartAdmin(s *auth.Store) bool {
	for _, t := range s.List() {
		if t.Role == auth.RoleAdmin && strings.HasPrefix(t.Description, "made at first start") {
			return true
		}
	}
	return false
}

// readAdminToken returns the secret in the pool's admin.token; "" when
// there is none.
func readAdminToken(n *node) (string, error) {
	f, err := n.pool.FS().OpenRegular(auth.AdminTokenFile, os.O_RDONLY)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 4096))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
