package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/raft/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// One policy for every etcd transaction that changes cluster state
// (STYLE.md, "One policy per kind of call"): commit runs it within the
// node's timeout, tries again only what etcd surely did not apply, and
// says ErrUnknownOutcome when the transaction may have been applied. The
// caller decides what an unknown outcome means for its change (read etcd
// until it knows, or act as if it had been applied); it never takes it for
// a refusal. Read-only Txns (only OpGets, no compares) change nothing
// and stay plain Commits.

// txnSpec is one etcd transaction: If the compares hold, Then, else Else.
type txnSpec struct {
	If   []clientv3.Cmp
	Then []clientv3.Op
	Else []clientv3.Op
}

// txnOutcome is what an error of a Commit says of the transaction.
type txnOutcome int

const (
	// txnDone: etcd answered; the response says whether the compares
	// held.
	txnDone txnOutcome = iota
	// txnRetry: etcd did not apply it, and another try may go through
	// (no leader yet, a proposal dropped while etcd elects one, too many
	// requests, no connection to send it on).
	txnRetry
	// txnRefused: etcd did not apply it, and would refuse another try the
	// same way (a lease not found, a request too large, no space, auth).
	txnRefused
	// txnUnknown: it may have been applied: the request may have reached
	// etcd and its answer was lost (a deadline, a cancel, a connection
	// closed, etcd timing out or stopping with the proposal in its log).
	txnUnknown
)

func (o txnOutcome) String() string {
	return [...]string{"done", "retry", "refused", "unknown"}[o]
}

// notSentMessages are the gRPC Unavailable messages of a request the
// client had no connection to send on (clientv3's isSafeRetryMutableRPC).
var notSentMessages = map[string]bool{
	"there is no address available":    true,
	"there is no connection available": true,
}

// classifyTxn says what err, from a Commit, says of the transaction. Only
// errors that etcd returns before the request enters its log (or the
// client before sending it) are known not applied; any other is unknown.
func classifyTxn(err error) txnOutcome {
	if err == nil {
		return txnDone
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		switch ee {
		case rpctypes.ErrNoLeader, rpctypes.ErrNotLeader, rpctypes.ErrLeaderChanged, rpctypes.ErrTooManyRequests:
			// Answered before a proposal (the interceptor without a
			// leader, the read path, the applied index far behind).
			return txnRetry
		}
		switch ee.Code() {
		case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.PermissionDenied,
			codes.Unauthenticated, codes.NotFound, codes.ResourceExhausted:
			// Checked before the proposal, or by the apply, which
			// then changes nothing (a lease not found, no space).
			return txnRefused
		}
		// Timeouts, a stop, a cancel or a deadline on etcd's side: the
		// proposal may be in the log.
		return txnUnknown
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return txnUnknown
	}
	if s, ok := status.FromError(err); ok {
		switch {
		case s.Code() == codes.Unavailable && notSentMessages[s.Message()]:
			return txnRetry
		case s.Code() == codes.Unknown && s.Message() == raft.ErrProposalDropped.Error():
			// raft dropped the proposal before it entered the log.
			return txnRetry
		}
	}
	return txnUnknown
}

// txnRetryPause is the pause before another try of a transaction that
// etcd did not apply.
const txnRetryPause = 50 * time.Millisecond

// commit runs t, within ctx and the node's timeout (its lease TTL). A try
// that etcd surely did not apply is made again while time allows; what
// commit returns then is that try's error. An error that leaves the outcome
// unknown is ErrUnknownOutcome (wrapping it): the transaction may have been
// applied, and may even be applied after commit returns (a proposal in
// etcd's log). Any other error means nothing was applied.
func (n *Node) commit(ctx context.Context, t txnSpec) (*clientv3.TxnResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, n.leaseTTL())
	defer cancel()
	var last error
	for {
		if err := ctx.Err(); err != nil {
			// Not sent: nothing was applied.
			if last != nil {
				return nil, last
			}
			return nil, err
		}
		resp, err := n.cli.Txn(ctx).If(t.If...).Then(t.Then...).Else(t.Else...).Commit()
		switch classifyTxn(err) {
		case txnDone:
			return resp, nil
		case txnUnknown:
			return nil, fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
		case txnRefused:
			return nil, err
		}
		last = err
		select {
		case <-ctx.Done():
		case <-time.After(txnRetryPause):
		}
	}
}

// commitLearning is commit for a write whose unknown outcome the same
// transaction again settles (BeginIntentAs's rule): a write, so etcd orders
// the next try after the first, which by then has been applied or dropped
// for good, and the caller recognizes its own write, by a value it wrote,
// in what that try reads (its Else). After an unknown outcome it tries t
// again, on a context of its own bounded by twice the lease TTL whatever
// ctx does, until a try is answered; tried then says the first try's
// outcome was unknown, so a failed compare may be the caller's own write.
// When no try is answered the error is ErrUnknownOutcome: a later try that
// fails, however it fails, says nothing of the first.
func (n *Node) commitLearning(ctx context.Context, op string, t txnSpec) (resp *clientv3.TxnResponse, tried bool, err error) {
	resp, err = n.commit(ctx, t)
	if !errors.Is(err, ErrUnknownOutcome) {
		return resp, false, err
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*n.leaseTTL())
	defer cancel()
	for err != nil && lctx.Err() == nil {
		n.log.Warn("etcd transaction: outcome unknown; trying it again to learn it", "op", op, "err", err)
		sleep(lctx, 100*time.Millisecond)
		resp, err = n.commit(lctx, t)
	}
	if err != nil && !errors.Is(err, ErrUnknownOutcome) {
		err = fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
	return resp, true, err
}
