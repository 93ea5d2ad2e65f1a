package cluster

import (
	"bytes"
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TokenStore keeps the API tokens and tenants of every node of the cluster
// in etcd, under "auth/tokens" (docs/security.md, "Tenants on a cluster"):
// the JSON document of the pool's tokens.json (hashes only, never a
// secret), replaced whole by compare-and-swap on its mod revision. It is
// the backend of auth.Store.Share; every node follows it with a watch.
type TokenStore struct{ n *Node }

// TokenStore returns the cluster's token store.
func (n *Node) TokenStore() TokenStore { return TokenStore{n} }

func (t TokenStore) key() string { return t.n.key("auth", "tokens") }

// Load returns the stored document and its mod revision; nil when none.
func (t TokenStore) Load(ctx context.Context) ([]byte, int64, error) {
	resp, err := t.n.cli.Get(ctx, t.key())
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", t.key(), err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	return resp.Kvs[0].Value, resp.Kvs[0].ModRevision, nil
}

// Commit stores data if the key's mod revision is still version (0: the
// key is absent), in one Txn; etcd has it durably (a quorum's log) when
// Commit returns ok.
func (t TokenStore) Commit(ctx context.Context, data []byte, version int64) (int64, bool, error) {
	k := t.key()
	cmp := clientv3.Compare(clientv3.ModRevision(k), "=", version)
	if version == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
	}
	// An unknown outcome is learnt (commitLearning): a try again fails
	// its compare if the first applied, and reading data there then is
	// this write (or one storing the very same document), not a change
	// by another node, which the caller would make its change again on
	// (a token added twice). Left unknown, it is ErrUnknownOutcome: the
	// watch brings the document whichever it is.
	resp, tried, err := t.n.commitLearning(ctx, "write "+k, txnSpec{If: []clientv3.Cmp{cmp},
		Then: []clientv3.Op{clientv3.OpPut(k, string(data))}, Else: []clientv3.Op{clientv3.OpGet(k)}})
	if err != nil {
		return 0, false, fmt.Errorf("write %s: %w", k, err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); tried && len(kvs) > 0 && bytes.Equal(kvs[0].Value, data) {
			return kvs[0].ModRevision, true, nil
		}
		return 0, false, nil
	}
	return resp.Header.Revision, true, nil
}

// Watch calls fn with the stored document, then with each new one, until
// ctx ends; it reads the key again whenever the watch breaks.
func (t TokenStore) Watch(ctx context.Context, fn func([]byte, int64)) {
	k := t.key()
	for ctx.Err() == nil {
		resp, err := t.n.cli.Get(ctx, k)
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		if len(resp.Kvs) > 0 {
			fn(resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range t.n.cli.Watch(wctx, k, clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					fn(ev.Kv.Value, ev.Kv.ModRevision)
				}
			}
		}
		cancel()
		sleep(ctx, 200*time.Millisecond)
	}
}

// The cluster's admin credential (docs/cluster.md, "Admin token"): the
// secret of the admin token that the node whose token store became the
// cluster's made at its first start, kept in etcd under "auth/admin",
// sealed (secrets.go), so that every node started without --token-file
// writes the same one to its pool's admin.token. etcd's clients read
// nothing they could use.

func (t TokenStore) adminKey() string { return t.n.key("auth", "admin") }

// AdminSecret returns the cluster's admin secret; "" when none is stored.
func (t TokenStore) AdminSecret(ctx context.Context) (string, error) {
	k := t.adminKey()
	resp, err := t.n.cli.Get(ctx, k)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", k, err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	plain, err := t.n.keys.unseal(k, resp.Kvs[0].Value)
	if err != nil {
		return "", err
	}
	return string(plain), nil
}

// StoreAdminSecret stores secret as the cluster's admin secret unless one
// is stored already, in one Txn; it returns the one stored (this or the
// other), durable in etcd when it returns.
func (t TokenStore) StoreAdminSecret(ctx context.Context, secret string) (string, error) {
	k := t.adminKey()
	sealed, err := t.n.keys.seal(k, []byte(secret))
	if err != nil {
		return "", err
	}
	resp, _, err := t.n.commitLearning(ctx, "write "+k, txnSpec{
		If:   []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)},
		Then: []clientv3.Op{clientv3.OpPut(k, string(sealed))}})
	if err != nil {
		return "", fmt.Errorf("write %s: %w", k, err)
	}
	if resp.Succeeded {
		return secret, nil
	}
	return t.AdminSecret(ctx)
}

// WatchAdminSecret calls fn with the cluster's admin secret as soon as one
// is stored (at once when it is already), reading it each second, until
// ctx ends or fn returns true.
func (t TokenStore) WatchAdminSecret(ctx context.Context, fn func(secret string) bool) {
	for ctx.Err() == nil {
		s, err := t.AdminSecret(ctx)
		if err == nil && s != "" && fn(s) {
			return
		}
		sleep(ctx, time.Second)
	}
}
