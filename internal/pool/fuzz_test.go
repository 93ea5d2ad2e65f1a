package pool

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// The manifest loaders read bytes anyone who can write the pool controls.
// Each fuzz target checks that a loader never panics, and that whatever it
// accepts is safe to act on: every name is a DNS label that stays in its
// directory, and encoding then loading it again gives the same manifest.
// Seeds are in testdata/fuzz/<target>/: real manifests and the hostile
// ones of hostile_test.go.

func checkNameStaysIn(t *testing.T, field, name string) {
	t.Helper()
	if err := ValidateName(field, name); err != nil {
		t.Fatalf("accepted %s %q: %v", field, name, err)
	}
	if p := filepath.Join("disks", name+".img"); filepath.Dir(p) != "disks" || strings.Contains(name, "/") {
		t.Fatalf("accepted %s %q leaves its directory: %s", field, name, p)
	}
}

func roundTrip[T any](t *testing.T, v T, decode func([]byte) (T, error)) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode accepted manifest: %v", err)
	}
	again, err := decode(b)
	if err != nil {
		t.Fatalf("an accepted manifest, encoded, is refused: %v\n%s", err, b)
	}
	if !reflect.DeepEqual(normalize(v), normalize(again)) {
		t.Fatalf("round trip changed the manifest:\n%+v\n%+v", v, again)
	}
}

// normalize compares manifests by their JSON (time zones and nil versus
// empty collections aside).
func normalize(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func FuzzVolumeManifest(f *testing.F) {
	f.Add([]byte(`{"kind":"Volume","version":1,"name":"v2","uid":"u","capacity":16777216,"disks":[{"name":"root","size":8388608}],"createdAt":"2026-01-01T00:00:00Z"}`), "v2")
	f.Fuzz(func(t *testing.T, data []byte, dir string) {
		m, err := decodeVolumeManifest(data, dir)
		if err != nil {
			return
		}
		checkNameStaysIn(t, "name", m.Name)
		if m.Name != dir {
			t.Fatalf("accepted manifest %q in directory %q", m.Name, dir)
		}
		var total int64
		for _, d := range m.Disks {
			checkNameStaysIn(t, "disk", d.Name)
			total += d.Size
		}
		if total > m.Capacity || m.Capacity > MaxSize {
			t.Fatalf("accepted disks of %d bytes in a capacity of %d", total, m.Capacity)
		}
		if m.Source != nil {
			checkNameStaysIn(t, "source.volume", m.Source.Volume)
		}
		roundTrip(t, m, func(b []byte) (volumeManifest, error) { return decodeVolumeManifest(b, dir) })
	})
}

func FuzzSnapshotManifest(f *testing.F) {
	f.Add([]byte(`{"kind":"Snapshot","version":1,"name":"s1","uid":"u","volume":"v2","volumeUID":"w","capacity":16777216,"disks":[{"name":"root","size":8388608}],"method":"reflink","gateHeldNs":1000,"createdAt":"2026-01-01T00:00:00Z"}`), "v2", "s1")
	f.Fuzz(func(t *testing.T, data []byte, vol, dir string) {
		s, err := decodeSnapshotManifest(data, vol, dir)
		if err != nil {
			return
		}
		checkNameStaysIn(t, "name", s.Name)
		for _, d := range s.Disks {
			checkNameStaysIn(t, "disk", d.Name)
		}
		roundTrip(t, s, func(b []byte) (snapshotManifest, error) { return decodeSnapshotManifest(b, vol, dir) })
	})
}

func FuzzAttachments(f *testing.F) {
	f.Add([]byte(`{"kind":"Attachments","version":1,"epoch":1,"writer":"att-1","writerSeq":1,"nextSeq":2,"attachments":[{"id":"att-1","node":"node-a","mode":"rw","token":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","seq":1,"createdAt":"2026-01-01T00:00:00Z"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := decodeAttachments(data)
		if err != nil {
			return
		}
		for _, r := range st.Attachments {
			if ValidateNodeName(r.Node) != nil || (r.Mode != ModeReadWrite && r.Mode != ModeReadOnly) {
				t.Fatalf("accepted attachment %+v", r)
			}
		}
		roundTrip(t, st, decodeAttachments)
	})
}

func FuzzRollbackRecord(f *testing.F) {
	f.Add([]byte(`{"snapshot":"s1","staging":"rb-0123456789abcdef01234567"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRollbackRecord(data)
		if err != nil {
			return
		}
		checkNameStaysIn(t, "snapshot", r.Snapshot)
		if p := filepath.Join("staging", r.Staging); filepath.Dir(p) != "staging" || r.Staging == "" {
			t.Fatalf("accepted staging %q leaves staging/: %s", r.Staging, p)
		}
		roundTrip(t, r, decodeRollbackRecord)
	})
}

// TestFuzzValidSeedsAreAccepted: each target's "valid" seed loads, so the
// fuzzers start from a manifest that reaches their checks; every other seed
// is refused.
func TestFuzzValidSeedsAreAccepted(t *testing.T) {
	decoders := map[string]func(args []string) error{
		"FuzzVolumeManifest": func(a []string) error { _, err := decodeVolumeManifest([]byte(a[0]), a[1]); return err },
		"FuzzSnapshotManifest": func(a []string) error {
			_, err := decodeSnapshotManifest([]byte(a[0]), a[1], a[2])
			return err
		},
		"FuzzAttachments":    func(a []string) error { _, err := decodeAttachments([]byte(a[0])); return err },
		"FuzzRollbackRecord": func(a []string) error { _, err := decodeRollbackRecord([]byte(a[0])); return err },
	}
	for target, decode := range decoders {
		files, err := filepath.Glob(filepath.Join("testdata", "fuzz", target, "*"))
		if err != nil || len(files) < 5 {
			t.Fatalf("%s: %d seeds, %v", target, len(files), err)
		}
		for _, file := range files {
			args := readSeed(t, file)
			err := decode(args)
			if valid := filepath.Base(file) == "valid"; valid != (err == nil) {
				t.Errorf("%s: valid=%v, decode: %v", file, valid, err)
			}
		}
	}
}

// readSeed parses a corpus file of []byte and string values.
func readSeed(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var args []string
	for _, l := range lines[1:] {
		l = strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(l, "[]byte("), "string("), ")")
		s, err := strconv.Unquote(l)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		args = append(args, s)
	}
	return args
}
