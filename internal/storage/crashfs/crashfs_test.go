package crashfs

import (
	"errors"
	"os"
	"testing"

	"github.com/quiverstorage/quiver/internal/storage"
)

func write(t *testing.T, fsys *FS, rel, data string, sync bool) {
	t.Helper()
	f, err := fsys.OpenFile(rel, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(data), 0); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func read(t *testing.T, fsys *FS, rel string) string {
	t.Helper()
	f, err := fsys.OpenFile(rel, os.O_RDONLY, 0)
	if storage.IsNotExist(err) {
		return "<absent>"
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	b := make([]byte, fi.Size())
	_, _ = f.ReadAt(b, 0)
	return string(b)
}

// TestCutKeepsOnlyWhatWasSynced: the rules of the twin, one by one.
func TestCutKeepsOnlyWhatWasSynced(t *testing.T) {
	fsys := New("/t")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(fsys.Mkdir("d", 0o755))
	must(fsys.Mkdir("e", 0o755))
	must(fsys.SyncDir("."))
	write(t, fsys, "d/synced", "one", true) // data synced, entry synced below
	write(t, fsys, "d/unsynced-data", "two", false)
	must(fsys.SyncDir("d"))
	write(t, fsys, "d/moved", "four", true)
	write(t, fsys, "d/half", "five", true)
	must(fsys.SyncDir("d"))
	must(fsys.Rename("d/half", "e/half")) // both directories synced: done
	must(fsys.SyncDir("e"))
	must(fsys.SyncDir("d"))
	// From here on d is never synced again.
	write(t, fsys, "d/unsynced-entry", "three", true) // data synced, entry not
	write(t, fsys, "d/synced", "ONE", false)          // newer data, not synced
	must(fsys.Rename("d/moved", "e/moved"))           // only the destination synced: undone
	must(fsys.SyncDir("e"))

	fsys.CutPower()
	if _, err := fsys.OpenFile("d/synced", os.O_RDONLY, 0); !errors.Is(err, storage.ErrIO) {
		t.Fatalf("open with the power off: %v, want ErrIO", err)
	}
	fsys.Reboot()
	for rel, want := range map[string]string{
		"d/synced":         "one",
		"d/unsynced-data":  "",
		"d/unsynced-entry": "<absent>",
		"d/moved":          "four",
		"e/moved":          "<absent>",
		"d/half":           "<absent>",
		"e/half":           "five",
	} {
		if got := read(t, fsys, rel); got != want {
			t.Errorf("%s after the cut: %q, want %q", rel, got, want)
		}
	}
}

// TestCutAtSync: the cut lands right before or right after the k-th sync,
// and the sync points carry their call site.
func TestCutAtSync(t *testing.T) {
	for _, late := range []bool{false, true} {
		fsys := New("/t")
		write(t, fsys, "f", "a", true) // sync 1
		fsys.CutAtSync(2, late)
		f, err := fsys.OpenFile("f", os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("b"), 0); err != nil {
			t.Fatal(err)
		}
		err = f.Sync() // sync 2
		if late != (err == nil) {
			t.Errorf("late %v: sync 2 returned %v", late, err)
		}
		if !fsys.Off() {
			t.Fatal("no cut")
		}
		if syncs := fsys.Syncs(); len(syncs) != 2 || syncs[1].N != 2 || syncs[1].Label == "" || syncs[1].Dir {
			t.Errorf("sync points %+v, want two file syncs with labels", syncs)
		}
		fsys.Reboot()
		want := map[bool]string{false: "", true: "b"}[late]
		// The file's entry was never synced (no SyncDir): after the cut it
		// is gone either way; its data was synced by sync 1.
		if got := read(t, fsys, "f"); got != "<absent>" {
			t.Errorf("late %v: f = %q, want absent (its entry was never synced; data %q)", late, got, want)
		}
	}
}
