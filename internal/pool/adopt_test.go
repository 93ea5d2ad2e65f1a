package pool

import (
	"errors"
	"sync"
	"testing"
)

// TestAttachmentsMoveWithTheVolume: the primary's pool publishes each
// attachment change before it takes effect (a refused publish changes
// nothing), and a copy's pool that adopts the published state accepts the
// same tokens, keeps the same writer and fences the same attachments, ends
// its own attachments, and keeps the state across a restart.
func TestAttachmentsMoveWithTheVolume(t *testing.T) {
	primary := openTestPool(t, t.TempDir())
	var mu sync.Mutex
	var published []byte
	var refuse error
	primary.SetAttachmentsHook(func(volume string, state []byte) error {
		mu.Lock()
		defer mu.Unlock()
		if volume != "vm" {
			t.Errorf("published for volume %q", volume)
		}
		if refuse != nil {
			return refuse
		}
		published = append([]byte(nil), state...)
		return nil
	})
	v := attachVM(t, primary)
	src := mustAttach(t, v, "src", "rw")
	if err := mustOpen(t, src, "root").WriteAt(pattern(1, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	dst := mustAttach(t, v, "dst", "rw")
	if err := mustOpen(t, dst, "root").WriteAt(pattern(2, 4096), 0, false); err != nil {
		t.Fatal(err) // claims the role: src is fenced
	}
	mu.Lock()
	refuse = errors.New("etcd out of reach")
	mu.Unlock()
	if _, _, err := v.Attach("late", "rw"); err == nil {
		t.Fatal("an attachment the hook refused was made")
	}
	if n := len(v.Attachments()); n != 2 {
		t.Fatalf("%d attachments after a refused attach, want 2", n)
	}
	mu.Lock()
	state := published
	mu.Unlock()

	dir := t.TempDir()
	copyPool := openTestPool(t, dir)
	cv := attachVM(t, copyPool)
	own := mustAttach(t, cv, "replica-n1-term-1", "rw")
	ownRoot := mustOpen(t, own, "root")
	if err := cv.AdoptAttachments([]byte("{not json")); err == nil {
		t.Fatal("bad state adopted")
	}
	if err := ownRoot.WriteAt(pattern(3, 4096), 0, false); err != nil {
		t.Fatalf("own attachment after a refused adopt: %v", err)
	}
	if err := cv.AdoptAttachments(state); err != nil {
		t.Fatal(err)
	}
	select {
	case <-own.Done():
	default:
		t.Fatal("the copy's own attachment did not end")
	}
	if err := ownRoot.WriteAt(pattern(4, 4096), 0, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("own attachment after the adopt: %v, want ErrFenced", err)
	}
	check := func(cv *Volume) {
		t.Helper()
		if w, pw := cv.Writer(), v.Writer(); w != pw {
			t.Fatalf("writer %+v, the primary's %+v", w, pw)
		}
		for _, tc := range []struct {
			a    *Attachment
			want error
		}{{src, ErrFenced}, {dst, nil}} {
			info, _ := v.Attachment(tc.a.ID())
			got, err := cv.AttachmentByToken(tokenOf(t, v, tc.a))
			if err != nil || got.ID() != info.ID {
				t.Fatalf("token of %s on the copy: %v", info.ID, err)
			}
			if err := mustOpen(t, got, "data").WriteAt(pattern(5, 512), 0, false); !errors.Is(err, tc.want) {
				t.Fatalf("write by %s on the copy: %v, want %v", info.Node, err, tc.want)
			}
		}
	}
	check(cv)
	if err := copyPool.Close(); err != nil {
		t.Fatal(err)
	}
	reopened := openTestPool(t, dir)
	rv, err := reopened.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	check(rv)
}

// tokenOf is attachment a's token on the primary.
func tokenOf(t *testing.T, v *Volume, a *Attachment) string {
	t.Helper()
	v.amu.Lock()
	defer v.amu.Unlock()
	return v.att.byID[a.ID()].token
}
