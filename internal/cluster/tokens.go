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
