package apiserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/quiverstorage/quiver/internal/api"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/quiverstorage/quiver/internal/pool"
)

// fingerprint describes every entry under root, the root included: its type
// and mode bits, size, owner, inode, link count, modification and change
// times, and the sha256 of a regular file's contents (a symlink's target).
// Only access times are left out, so an entry rewritten with the same bytes,
// or created and removed again in a directory, changes the fingerprint.
func fingerprint(t *testing.T, root string) map[string]string {
	t.Helper()
	fp := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat_t", path)
		}
		entry := fmt.Sprintf("mode=%v size=%d uid=%d gid=%d ino=%d nlink=%d mtime=%d.%09d ctime=%d.%09d",
			fi.Mode(), fi.Size(), st.Uid, st.Gid, st.Ino, st.Nlink, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
		switch {
		case fi.Mode().IsRegular():
			sum, err := fileSHA256(path)
			if err != nil {
				return err
			}
			entry += " sha256=" + sum
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			entry += " target=" + target
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		fp[rel] = entry
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// diffFingerprints lists what changed between two fingerprints.
func diffFingerprints(before, after map[string]string) []string {
	var out []string
	for p, b := range before {
		switch a, ok := after[p]; {
		case !ok:
			out = append(out, "removed "+p)
		case a != b:
			out = append(out, fmt.Sprintf("changed %s:\n\t%s\n\t%s", p, b, a))
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			out = append(out, "added "+p)
		}
	}
	slices.Sort(out)
	return out
}

// payload is a request body with its Content-Type.
type payload struct {
	ctype string
	data  string
}

// js is a body sent as application/json.
func js(data string) payload { return payload{"application/json", data} }

// noBody is a request without a body.
var noBody payload

func volBody(name string) payload {
	return js(fmt.Sprintf(`{"name":%q,"capacity":1048576}`, name))
}

func capBody(capacity string) payload {
	return js(fmt.Sprintf(`{"name":"new","capacity":%s}`, capacity))
}

func disksBody(capacity int64, disks string) payload {
	return js(fmt.Sprintf(`{"name":"new","capacity":%d,"disks":[%s]}`, capacity, disks))
}

func labelsJSON(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"k%d":"v"`, i)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func namesJSON(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("vm-%05d", i)
	}
	b, _ := json.Marshal(names)
	return string(b)
}

// setupBadInputPool makes a pool with a volume "web" (capacity 8 MiB, disks
// root 2 MiB and data 1 MiB, both holding data), a snapshot "web@base", and
// a second, unrelated volume "db".
func setupBadInputPool(t *testing.T) (*Server, *pool.Pool) {
	t.Helper()
	s, p := newTestAPI(t, "")
	ctx := context.Background()
	if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: "web", Capacity: 8 * mib, Labels: map[string]string{"app": "web"},
		Disks: []pool.DiskSpec{{Name: "root", Size: 2 * mib}, {Name: "data", Size: mib}}}); err != nil {
		t.Fatal(err)
	}
	writeDisk(t, p, "web", "root", 0, []byte(strings.Repeat("boot sector ", 100)))
	writeDisk(t, p, "web", "root", mib+4096, []byte("root data"))
	writeDisk(t, p, "web", "data", 4096, []byte(strings.Repeat("table rows ", 500)))
	v, err := p.Volume("web")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.CreateSnapshot(ctx, "base", nil); err != nil {
		t.Fatal(err)
	}
	// Data written after the snapshot, so that a rollback would show.
	writeDisk(t, p, "web", "root", 8192, []byte("after the snapshot"))
	if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: "db", Capacity: mib,
		Disks: []pool.DiskSpec{{Name: "root", Size: mib}}}); err != nil {
		t.Fatal(err)
	}
	return s, p
}

// TestBadInput sends malformed requests: each must get the expected 4xx with
// a JSON error whose message names the offending field or object, and must
// leave the pool directory exactly as it was.
func TestBadInput(t *testing.T) {
	s, p := setupBadInputPool(t)
	oversize := js(`{"name":"` + strings.Repeat("a", maxBody) + `","capacity":1048576}`)
	long := strings.Repeat("a", 64)

	tests := []struct {
		name   string
		method string
		target string
		body   payload
		status int
		code   string
		msg    string // substring of the message naming the field or object
		field  string // expected error field, when not empty
	}{
		// Names in a body.
		{"volume name upper-case", "POST", "/v1/volumes", volBody("Web"), 400, api.CodeInvalid, `name "Web": must be a DNS label`, "name"},
		{"volume name dot-dot", "POST", "/v1/volumes", volBody(".."), 400, api.CodeInvalid, `name ".."`, "name"},
		{"volume name with slash", "POST", "/v1/volumes", volBody("a/b"), 400, api.CodeInvalid, `name "a/b"`, "name"},
		{"volume name dot", "POST", "/v1/volumes", volBody("."), 400, api.CodeInvalid, `name "."`, "name"},
		{"volume name leading dash", "POST", "/v1/volumes", volBody("-web"), 400, api.CodeInvalid, `name "-web"`, "name"},
		{"volume name trailing dash", "POST", "/v1/volumes", volBody("web-"), 400, api.CodeInvalid, `name "web-"`, "name"},
		{"volume name 64 chars", "POST", "/v1/volumes", volBody(long), 400, api.CodeInvalid, `name "` + long + `"`, "name"},
		{"volume name empty", "POST", "/v1/volumes", volBody(""), 400, api.CodeInvalid, "name: is required", "name"},
		{"volume name missing", "POST", "/v1/volumes", js(`{"capacity":1048576}`), 400, api.CodeInvalid, "name: is required", "name"},
		{"volume name unicode", "POST", "/v1/volumes", volBody("wéb"), 400, api.CodeInvalid, `name "wéb"`, "name"},
		{"volume name NUL", "POST", "/v1/volumes", js(`{"name":"a\u0000b","capacity":1048576}`), 400, api.CodeInvalid, `name "a\x00b"`, "name"},
		{"volume name not a string", "POST", "/v1/volumes", js(`{"name":7,"capacity":1048576}`), 400, api.CodeInvalid, "name", "name"},

		// Names in the path.
		{"path volume upper-case", "GET", "/v1/volumes/Web", noBody, 400, api.CodeInvalid, `volume "Web"`, "volume"},
		{"path volume encoded slash", "GET", "/v1/volumes/a%2Fb", noBody, 400, api.CodeInvalid, `volume "a/b"`, "volume"},
		{"path volume encoded traversal", "DELETE", "/v1/volumes/web%2F..%2Fdb", noBody, 400, api.CodeInvalid, `volume "web/../db"`, "volume"},
		{"path volume encoded dot-dot", "DELETE", "/v1/volumes/%2E%2E", noBody, 400, api.CodeInvalid, `volume ".."`, "volume"},
		{"path volume leading dash", "DELETE", "/v1/volumes/-web", noBody, 400, api.CodeInvalid, `volume "-web"`, "volume"},
		{"path volume 64 chars", "DELETE", "/v1/volumes/" + long, noBody, 400, api.CodeInvalid, `volume "` + long + `"`, "volume"},
		{"path snapshot dot-dot", "DELETE", "/v1/volumes/web/snapshots/..", noBody, 400, api.CodeInvalid, `"/v1/volumes/web/snapshots/.."`, "path"},
		{"path disk dot", "DELETE", "/v1/volumes/web/disks/.", noBody, 400, api.CodeInvalid, `"/v1/volumes/web/disks/."`, "path"},
		{"path dot-dot into another volume", "PATCH", "/v1/volumes/db/../web", js(`{"capacity":1048576}`), 400, api.CodeInvalid, `"/v1/volumes/db/../web"`, "path"},
		{"path empty volume segment", "DELETE", "/v1/volumes//snapshots/base", noBody, 400, api.CodeInvalid, `"/v1/volumes//snapshots/base"`, "path"},
		{"path snapshot upper-case", "GET", "/v1/volumes/web/snapshots/Base", noBody, 400, api.CodeInvalid, `snapshot "Base"`, "snapshot"},
		{"path snapshot encoded slash", "DELETE", "/v1/volumes/web/snapshots/base%2Fx", noBody, 400, api.CodeInvalid, `snapshot "base/x"`, "snapshot"},
		{"path disk upper-case", "DELETE", "/v1/volumes/web/disks/ROOT", noBody, 400, api.CodeInvalid, `disk "ROOT"`, "disk"},
		{"path disk encoded dot-dot", "PATCH", "/v1/volumes/web/disks/%2E%2E", js(`{"size":4194304}`), 400, api.CodeInvalid, `disk ".."`, "disk"},

		// Capacity.
		{"capacity zero", "POST", "/v1/volumes", capBody("0"), 400, api.CodeInvalid, `capacity "0": must be greater than zero`, "capacity"},
		{"capacity missing", "POST", "/v1/volumes", js(`{"name":"new"}`), 400, api.CodeInvalid, `capacity "0"`, "capacity"},
		{"capacity null", "POST", "/v1/volumes", capBody("null"), 400, api.CodeInvalid, `capacity "0"`, "capacity"},
		{"capacity negative", "POST", "/v1/volumes", capBody("-1048576"), 400, api.CodeInvalid, `capacity "-1Mi"`, "capacity"},
		{"capacity not sectors", "POST", "/v1/volumes", capBody("1000"), 400, api.CodeInvalid, `capacity "1000": must be a multiple of 512`, "capacity"},
		{"capacity over 8 PiB", "POST", "/v1/volumes", capBody("9007199254741504"), 400, api.CodeInvalid, `capacity "8Pi (9007199254741504 bytes)": must be at most 8Pi`, "capacity"},
		{"capacity overflows int64", "POST", "/v1/volumes", capBody("9223372036854775808"), 400, api.CodeInvalid, "capacity: must be", "capacity"},
		{"capacity huge exponent", "POST", "/v1/volumes", capBody("1e30"), 400, api.CodeInvalid, "capacity: must be", "capacity"},
		{"capacity string", "POST", "/v1/volumes", capBody(`"1Gi"`), 400, api.CodeInvalid, "capacity: must be", "capacity"},
		{"capacity fractional", "POST", "/v1/volumes", capBody("1048576.5"), 400, api.CodeInvalid, "capacity: must be", "capacity"},
		{"capacity bool", "POST", "/v1/volumes", capBody("true"), 400, api.CodeInvalid, "capacity: must be", "capacity"},

		// Disks of a new volume.
		{"disk size zero", "POST", "/v1/volumes", disksBody(mib, `{"name":"root","size":0}`), 400, api.CodeInvalid, `disks[0].size "0"`, "disks[0].size"},
		{"disk size negative", "POST", "/v1/volumes", disksBody(mib, `{"name":"root","size":-512}`), 400, api.CodeInvalid, `disks[0].size "-512"`, "disks[0].size"},
		{"disk size not sectors", "POST", "/v1/volumes", disksBody(mib, `{"name":"root","size":4097}`), 400, api.CodeInvalid, `disks[0].size "4Ki (4097 bytes)": must be a multiple of 512 bytes`, "disks[0].size"},
		{"disk size string", "POST", "/v1/volumes", disksBody(mib, `{"name":"root","size":"1Mi"}`), 400, api.CodeInvalid, "disks.size: must be", "disks.size"},
		{"disk size overflows int64", "POST", "/v1/volumes", disksBody(mib, `{"name":"root","size":18446744073709551616}`), 400, api.CodeInvalid, "disks.size: must be", "disks.size"},
		{"disks over capacity", "POST", "/v1/volumes", disksBody(mib, `{"name":"root","size":1048576},{"name":"data","size":512}`), 422, api.CodeCapacity, "disks total 1Mi (1049088 bytes), capacity is 1Mi", ""},
		{"disk sizes sum past int64", "POST", "/v1/volumes", disksBody(mib, `{"name":"a","size":9007199254740992},{"name":"b","size":9007199254740992}`), 422, api.CodeCapacity, "disks total 16Pi, capacity is 1Mi", ""},
		{"duplicate disk names", "POST", "/v1/volumes", disksBody(mib, `{"name":"root","size":512},{"name":"root","size":512}`), 400, api.CodeInvalid, `disks[1].name "root": duplicate disk name`, "disks[1].name"},
		{"disk name bad", "POST", "/v1/volumes", disksBody(mib, `{"name":"Root!","size":512}`), 400, api.CodeInvalid, `disks[0].name "Root!"`, "disks[0].name"},
		{"disk name empty", "POST", "/v1/volumes", disksBody(mib, `{"name":"","size":512}`), 400, api.CodeInvalid, "disks[0].name: is required", "disks[0].name"},
		{"disk name dot-dot", "POST", "/v1/volumes", disksBody(mib, `{"name":"..","size":512}`), 400, api.CodeInvalid, `disks[0].name ".."`, "disks[0].name"},
		{"too many disks", "POST", "/v1/volumes", disksBody(mib, strings.TrimSuffix(strings.Repeat(`{"name":"d","size":512},`, pool.MaxDisks+1), ",")), 400, api.CodeInvalid, "disks: at most 256 disks", "disks"},
		{"disks not an array", "POST", "/v1/volumes", js(`{"name":"new","capacity":1048576,"disks":{"name":"root"}}`), 400, api.CodeInvalid, "disks: must be", "disks"},

		// Labels.
		{"too many labels", "POST", "/v1/volumes", js(`{"name":"new","capacity":1048576,"labels":` + labelsJSON(pool.MaxLabels+1) + `}`), 400, api.CodeInvalid, "labels: at most 64 labels", "labels"},
		{"label key bad", "POST", "/v1/volumes", js(`{"name":"new","capacity":1048576,"labels":{"bad key":"v"}}`), 400, api.CodeInvalid, `labels key "bad key"`, "labels key"},
		{"label key empty", "POST", "/v1/volumes", js(`{"name":"new","capacity":1048576,"labels":{"":"v"}}`), 400, api.CodeInvalid, `labels key`, "labels key"},
		{"label value bad", "POST", "/v1/volumes", js(`{"name":"new","capacity":1048576,"labels":{"app":"not ok!"}}`), 400, api.CodeInvalid, `labels[app] "not ok!"`, "labels[app]"},
		{"label value not a string", "POST", "/v1/volumes", js(`{"name":"new","capacity":1048576,"labels":{"app":1}}`), 400, api.CodeInvalid, "labels", ""},
		{"labels not an object", "POST", "/v1/volumes", js(`{"name":"new","capacity":1048576,"labels":["app"]}`), 400, api.CodeInvalid, "labels: must be", "labels"},

		// The body itself. (encoding/json matches keys case-insensitively,
		// so {"Name": ...} is taken as "name", not refused as unknown.)
		{"unknown top-level field", "POST", "/v1/volumes", js(`{"name":"new","capacity":1048576,"size":1}`), 400, api.CodeInvalid, "size: unknown field", "size"},
		{"unknown nested field", "POST", "/v1/volumes", disksBody(mib, `{"name":"root","size":512,"format":"qcow2"}`), 400, api.CodeInvalid, "format: unknown field", "format"},
		{"malformed JSON", "POST", "/v1/volumes", js(`{"name":new}`), 400, api.CodeInvalid, "request body: malformed JSON", ""},
		{"truncated JSON", "POST", "/v1/volumes", js(`{"name":"new",`), 400, api.CodeInvalid, "request body: malformed JSON", ""},
		{"trailing garbage", "POST", "/v1/volumes", js(`{"name":"new","capacity":1048576} x`), 400, api.CodeInvalid, "request body: must hold a single JSON object", ""},
		{"two objects", "POST", "/v1/volumes", js(`{"name":"new","capacity":1048576}{"name":"new2","capacity":1048576}`), 400, api.CodeInvalid, "request body: must hold a single JSON object", ""},
		{"empty body", "POST", "/v1/volumes", js(""), 400, api.CodeInvalid, "request body: a JSON object is required", ""},
		{"array body", "POST", "/v1/volumes", js(`[{"name":"new","capacity":1048576}]`), 400, api.CodeInvalid, "request body: must be a JSON object", ""},
		{"string body", "POST", "/v1/volumes", js(`"new"`), 400, api.CodeInvalid, "request body: must be a JSON object", ""},
		{"null body", "POST", "/v1/volumes", js(`null`), 400, api.CodeInvalid, "name: is required", "name"},
		{"wrong content type", "POST", "/v1/volumes", payload{"text/plain", `{"name":"new","capacity":1048576}`}, 400, api.CodeInvalid, `Content-Type "text/plain"`, ""},
		{"form content type", "PATCH", "/v1/volumes/web", payload{"application/x-www-form-urlencoded", "capacity=1"}, 400, api.CodeInvalid, "Content-Type", ""},
		{"oversize body", "POST", "/v1/volumes", oversize, 400, api.CodeInvalid, "request body: larger than 1Mi", ""},

		// An existing name with another spec.
		{"create existing different spec", "POST", "/v1/volumes", volBody("web"), 409, api.CodeConflict, `volume "web"`, ""},

		// A missing volume.
		{"get missing volume", "GET", "/v1/volumes/nope", noBody, 404, api.CodeNotFound, `volume "nope"`, ""},
		{"patch missing volume", "PATCH", "/v1/volumes/nope", js(`{"capacity":1048576}`), 404, api.CodeNotFound, `volume "nope"`, ""},
		{"delete missing volume", "DELETE", "/v1/volumes/nope", noBody, 404, api.CodeNotFound, `volume "nope"`, ""},
		{"snapshot of missing volume", "POST", "/v1/volumes/nope/snapshots", js(`{"name":"s1"}`), 404, api.CodeNotFound, `volume "nope"`, ""},
		{"async snapshot of missing volume", "POST", "/v1/volumes/nope/snapshots?async=true", js(`{"name":"s1"}`), 404, api.CodeNotFound, `volume "nope"`, ""},
		{"list snapshots of missing volume", "GET", "/v1/volumes/nope/snapshots", noBody, 404, api.CodeNotFound, `volume "nope"`, ""},
		{"add disk to missing volume", "POST", "/v1/volumes/nope/disks", js(`{"name":"d","size":512}`), 404, api.CodeNotFound, `volume "nope"`, ""},
		{"grow disk of missing volume", "PATCH", "/v1/volumes/nope/disks/root", js(`{"size":4194304}`), 404, api.CodeNotFound, `volume "nope"`, ""},
		{"remove disk of missing volume", "DELETE", "/v1/volumes/nope/disks/root", noBody, 404, api.CodeNotFound, `volume "nope"`, ""},
		{"rollback missing volume", "POST", "/v1/volumes/nope/rollback", js(`{"snapshot":"base"}`), 404, api.CodeNotFound, `volume "nope"`, ""},

		// Snapshots.
		{"get missing snapshot", "GET", "/v1/volumes/web/snapshots/nope", noBody, 404, api.CodeNotFound, `snapshot "nope"`, ""},
		{"delete missing snapshot", "DELETE", "/v1/volumes/web/snapshots/nope", noBody, 404, api.CodeNotFound, `snapshot "nope"`, ""},
		{"snapshot of another volume", "GET", "/v1/volumes/db/snapshots/base", noBody, 404, api.CodeNotFound, `snapshot "base" of volume "db"`, ""},
		{"rollback to missing snapshot", "POST", "/v1/volumes/web/rollback", js(`{"snapshot":"nope"}`), 404, api.CodeNotFound, `snapshot "nope"`, ""},
		{"async rollback to missing snapshot", "POST", "/v1/volumes/web/rollback?async=true", js(`{"snapshot":"nope"}`), 404, api.CodeNotFound, `snapshot "nope"`, ""},
		{"rollback without snapshot", "POST", "/v1/volumes/web/rollback", js(`{}`), 400, api.CodeInvalid, "snapshot: is required", "snapshot"},
		{"rollback to bad name", "POST", "/v1/volumes/web/rollback", js(`{"snapshot":"../base"}`), 400, api.CodeInvalid, `snapshot "../base"`, "snapshot"},
		{"snapshot bad name", "POST", "/v1/volumes/web/snapshots", js(`{"name":"Nightly"}`), 400, api.CodeInvalid, `name "Nightly"`, "name"},
		{"snapshot empty name", "POST", "/v1/volumes/web/snapshots", js(`{"name":""}`), 400, api.CodeInvalid, "name: is required", "name"},
		{"async snapshot bad name", "POST", "/v1/volumes/web/snapshots?async=true", js(`{"name":"a/b"}`), 400, api.CodeInvalid, `name "a/b"`, "name"},
		{"snapshot unknown field", "POST", "/v1/volumes/web/snapshots", js(`{"name":"s1","volume":"web"}`), 400, api.CodeInvalid, "volume: unknown field", "volume"},

		// Disks of an existing volume.
		{"grow missing disk", "PATCH", "/v1/volumes/web/disks/nope", js(`{"size":4194304}`), 404, api.CodeNotFound, `disk "nope"`, ""},
		{"shrink disk", "PATCH", "/v1/volumes/web/disks/root", js(`{"size":1048576}`), 400, api.CodeInvalid, `size "1Mi": a disk can only grow (now 2Mi)`, "size"},
		{"grow disk past capacity", "PATCH", "/v1/volumes/web/disks/root", js(`{"size":8388608}`), 422, api.CodeCapacity, "disks would total 9Mi, capacity is 8Mi", ""},
		{"grow disk to zero", "PATCH", "/v1/volumes/web/disks/root", js(`{"size":0}`), 400, api.CodeInvalid, `size "0"`, "size"},
		{"grow disk overflow", "PATCH", "/v1/volumes/web/disks/root", js(`{"size":9223372036854775808}`), 400, api.CodeInvalid, "size: must be", "size"},
		{"add existing disk other size", "POST", "/v1/volumes/web/disks", js(`{"name":"root","size":1048576}`), 409, api.CodeConflict, `disk "root" of volume "web"`, ""},
		{"add disk past capacity", "POST", "/v1/volumes/web/disks", js(`{"name":"big","size":6291456}`), 422, api.CodeCapacity, "capacity is 8Mi; grow the volume first", ""},
		{"add disk not sectors", "POST", "/v1/volumes/web/disks", js(`{"name":"logs","size":1000}`), 400, api.CodeInvalid, `size "1000"`, "size"},
		{"add disk without size", "POST", "/v1/volumes/web/disks", js(`{"name":"logs"}`), 400, api.CodeInvalid, `size "0"`, "size"},
		{"add disk bad name", "POST", "/v1/volumes/web/disks", js(`{"name":"Data_2","size":512}`), 400, api.CodeInvalid, `name "Data_2"`, "name"},
		{"remove missing disk", "DELETE", "/v1/volumes/web/disks/nope", noBody, 404, api.CodeNotFound, `disk "nope"`, ""},

		// api.Volume updates.
		{"shrink capacity", "PATCH", "/v1/volumes/web", js(`{"capacity":4194304}`), 400, api.CodeInvalid, `capacity "4Mi": can only grow (now 8Mi)`, "capacity"},
		{"capacity update zero", "PATCH", "/v1/volumes/web", js(`{"capacity":0}`), 400, api.CodeInvalid, `capacity "0"`, "capacity"},
		{"capacity update string", "PATCH", "/v1/volumes/web", js(`{"capacity":"16Mi"}`), 400, api.CodeInvalid, "capacity: must be", "capacity"},
		{"labels update bad key", "PATCH", "/v1/volumes/web", js(`{"labels":{"-app":"web"}}`), 400, api.CodeInvalid, `labels key "-app"`, "labels key"},
		{"labels update too many", "PATCH", "/v1/volumes/web", js(`{"labels":` + labelsJSON(pool.MaxLabels+1) + `}`), 400, api.CodeInvalid, "labels: at most 64 labels", "labels"},
		{"update unknown field", "PATCH", "/v1/volumes/web", js(`{"disks":[]}`), 400, api.CodeInvalid, "disks: unknown field", "disks"},

		// Clones.
		{"clone empty names", "POST", "/v1/clones", js(`{"source":{"volume":"web","snapshot":"base"},"names":[]}`), 400, api.CodeInvalid, "names: at least one name is required", "names"},
		{"clone without names", "POST", "/v1/clones", js(`{"source":{"volume":"web"}}`), 400, api.CodeInvalid, "names: at least one name is required", "names"},
		{"clone duplicate names", "POST", "/v1/clones", js(`{"source":{"volume":"web","snapshot":"base"},"names":["c1","c1"]}`), 400, api.CodeInvalid, `names[1] "c1": duplicate name`, "names[1]"},
		{"clone onto existing volume", "POST", "/v1/clones", js(`{"source":{"volume":"web","snapshot":"base"},"names":["c1","db"]}`), 409, api.CodeConflict, `volume "db" already exists`, ""},
		{"clone onto its source", "POST", "/v1/clones", js(`{"source":{"volume":"web"},"names":["web"]}`), 400, api.CodeInvalid, `names[0] "web": a clone cannot replace its source`, "names[0]"},
		{"clone missing snapshot", "POST", "/v1/clones", js(`{"source":{"volume":"web","snapshot":"nope"},"names":["c1"]}`), 404, api.CodeNotFound, `snapshot "nope"`, ""},
		{"async clone missing snapshot", "POST", "/v1/clones?async=true", js(`{"source":{"volume":"web","snapshot":"nope"},"names":["c1"]}`), 404, api.CodeNotFound, `snapshot "nope"`, ""},
		{"clone missing volume", "POST", "/v1/clones", js(`{"source":{"volume":"nope"},"names":["c1"]}`), 404, api.CodeNotFound, `volume "nope"`, ""},
		{"clone without source", "POST", "/v1/clones", js(`{"names":["c1"]}`), 400, api.CodeInvalid, "source.volume: is required", "source.volume"},
		{"clone bad source snapshot", "POST", "/v1/clones", js(`{"source":{"volume":"web","snapshot":"Base"},"names":["c1"]}`), 400, api.CodeInvalid, `source.snapshot "Base"`, "source.snapshot"},
		{"clone bad name", "POST", "/v1/clones", js(`{"source":{"volume":"web"},"names":["c1","C2"]}`), 400, api.CodeInvalid, `names[1] "C2"`, "names[1]"},
		{"clone empty name", "POST", "/v1/clones", js(`{"source":{"volume":"web"},"names":[""]}`), 400, api.CodeInvalid, "names[0]: is required", "names[0]"},
		{"clone too many names", "POST", "/v1/clones", js(`{"source":{"volume":"web"},"names":` + namesJSON(api.MaxBulkClones+1) + `}`), 400, api.CodeInvalid, "names: at most 5000 clones", "names"},
		{"clone bad label", "POST", "/v1/clones", js(`{"source":{"volume":"web"},"names":["c1"],"labels":{"a b":"c"}}`), 400, api.CodeInvalid, `labels key "a b"`, "labels key"},
		{"clone names not an array", "POST", "/v1/clones", js(`{"source":{"volume":"web"},"names":"c1"}`), 400, api.CodeInvalid, "names: must be", "names"},
		{"clone unknown source field", "POST", "/v1/clones", js(`{"source":{"volume":"web","disk":"root"},"names":["c1"]}`), 400, api.CodeInvalid, "disk: unknown field", "disk"},

		// Query parameters.
		{"selector unclosed", "GET", "/v1/volumes?selector=app+in+%28web", noBody, 400, api.CodeInvalid, `selector "app in (web"`, "selector"},
		{"selector garbage", "GET", "/v1/volumes?selector=%21%21", noBody, 400, api.CodeInvalid, `selector "!!"`, "selector"},

		// Jobs.
		{"get unknown job", "GET", "/v1/jobs/nope", noBody, 404, api.CodeNotFound, `job "nope"`, ""},
		{"cancel unknown job", "DELETE", "/v1/jobs/nope", noBody, 404, api.CodeNotFound, `job "nope"`, ""},

		// Attachments.
		{"attach without node", "POST", "/v1/volumes/web/attachments", js(`{}`), 400, api.CodeInvalid, "node: is required", "node"},
		{"attach node with slash", "POST", "/v1/volumes/web/attachments", js(`{"node":"a/b"}`), 400, api.CodeInvalid, `node "a/b"`, "node"},
		{"attach node dot-dot", "POST", "/v1/volumes/web/attachments", js(`{"node":".."}`), 400, api.CodeInvalid, `node ".."`, "node"},
		{"attach node 254 chars", "POST", "/v1/volumes/web/attachments", js(`{"node":"` + strings.Repeat("a", 254) + `"}`), 400, api.CodeInvalid, "node", "node"},
		{"attach bad mode", "POST", "/v1/volumes/web/attachments", js(`{"node":"n1","mode":"RW"}`), 400, api.CodeInvalid, `mode "RW"`, "mode"},
		{"attach unknown field", "POST", "/v1/volumes/web/attachments", js(`{"node":"n1","token":"x"}`), 400, api.CodeInvalid, "token: unknown field", "token"},
		{"attach unknown volume", "POST", "/v1/volumes/nope/attachments", js(`{"node":"n1"}`), 404, api.CodeNotFound, `volume "nope"`, ""},
		{"get unknown attachment", "GET", "/v1/volumes/web/attachments/att-x", noBody, 404, api.CodeNotFound, `attachment "att-x"`, ""},
		{"detach unknown attachment", "DELETE", "/v1/volumes/web/attachments/att-x", noBody, 404, api.CodeNotFound, `attachment "att-x"`, ""},
		{"writer to unknown attachment", "POST", "/v1/volumes/web/attachments/att-x/writer", js(`{}`), 404, api.CodeNotFound, `attachment "att-x"`, ""},
		{"writer with a body", "POST", "/v1/volumes/web/attachments/att-x/writer", js(`{"epoch":3}`), 400, api.CodeInvalid, "epoch: unknown field", "epoch"},
		{"detach dot-dot", "DELETE", "/v1/volumes/web/attachments/..", noBody, 400, api.CodeInvalid, "", ""},

		// Routes and methods.
		{"unknown route", "POST", "/v1/volumes/web/resize", js(`{"size":1}`), 404, api.CodeNotFound, "/v1/volumes/web/resize", ""},
		{"PUT a volume", "PUT", "/v1/volumes/web", volBody("web"), 405, api.CodeInvalid, "PUT", ""},
		{"POST to a volume", "POST", "/v1/volumes/web", volBody("web"), 405, api.CodeInvalid, "POST", ""},
	}
	names := map[string]bool{}
	for _, tt := range tests {
		if names[tt.name] {
			t.Fatalf("two cases named %q", tt.name)
		}
		names[tt.name] = true
	}
	t.Logf("%d malformed requests", len(tests))

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := fingerprint(t, p.Dir())
			var body io.Reader
			if tt.body.ctype != "" {
				body = strings.NewReader(tt.body.data)
			}
			req := httptest.NewRequest(tt.method, tt.target, body)
			if tt.body.ctype != "" {
				req.Header.Set("Content-Type", tt.body.ctype)
			}
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)

			if rec.Code < 400 || rec.Code >= 500 || rec.Code != tt.status {
				t.Errorf("status %d, want %d; body: %.500s", rec.Code, tt.status, rec.Body.String())
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			var eb api.ErrorBody
			dec := json.NewDecoder(rec.Body)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&eb); err != nil {
				t.Fatalf("error body is not {\"error\":{...}}: %v", err)
			}
			e := eb.Error
			t.Logf("%d %s field=%q: %.300s", rec.Code, e.Code, e.Field, e.Message)
			if e.Code != tt.code {
				t.Errorf("code %q, want %q (message %q)", e.Code, tt.code, e.Message)
			}
			if !strings.Contains(e.Message, tt.msg) {
				t.Errorf("message %q does not contain %q", e.Message, tt.msg)
			}
			if tt.field != "" && e.Field != tt.field {
				t.Errorf("field %q, want %q (message %q)", e.Field, tt.field, e.Message)
			}
			if raw := rawByteCount(e.Message); raw != "" {
				t.Errorf("message %q shows the size %s in bytes: sizes are for people (40Gi), exact bytes only in parentheses after one", e.Message, raw)
			}
			if diff := diffFingerprints(before, fingerprint(t, p.Dir())); len(diff) > 0 {
				t.Errorf("the pool changed:\n%s", strings.Join(diff, "\n"))
			}
		})
	}

	// No malformed request started a job.
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/jobs", nil))
	var jobs api.List[api.Job]
	if err := json.Unmarshal(rec.Body.Bytes(), &jobs); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("list jobs: %d %v", rec.Code, err)
	}
	if len(jobs.Items) != 0 {
		t.Errorf("malformed requests started jobs: %+v", jobs.Items)
	}
}

// TestFingerprintSeesChanges checks the oracle of TestBadInput: rewriting a
// manifest with the same bytes, and creating then removing a file, both
// change the fingerprint.
func TestFingerprintSeesChanges(t *testing.T) {
	_, p := setupBadInputPool(t)
	ctx := context.Background()
	v, err := p.Volume("web")
	if err != nil {
		t.Fatal(err)
	}
	before := fingerprint(t, p.Dir())
	if _, err := v.Update(ctx, pool.Update{}); err != nil { // rewrites volume.json unchanged
		t.Fatal(err)
	}
	if diff := diffFingerprints(before, fingerprint(t, p.Dir())); len(diff) == 0 {
		t.Error("rewriting volume.json with the same bytes left the fingerprint unchanged")
	}
	before = fingerprint(t, p.Dir())
	tmp := filepath.Join(p.Dir(), "staging", "probe")
	if err := os.WriteFile(tmp, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	if diff := diffFingerprints(before, fingerprint(t, p.Dir())); len(diff) == 0 {
		t.Error("creating and removing a file left the fingerprint unchanged")
	}
}

// rawByteCounts finds sizes of 1Ki or more in raw bytes in an error
// message: "N bytes" (but not the exact count formatSize puts in
// parentheses after a human size, "1.5Gi (1610612737 bytes)") and a quoted
// value that is a bare number, as a size field's value is quoted.
var rawByteCounts = regexp.MustCompile(`(\(?)(\d+) bytes|"(-?\d+)"`)

// rawByteCount returns the first raw byte count in msg, or "".
func rawByteCount(msg string) string {
	for _, m := range rawByteCounts.FindAllStringSubmatch(msg, -1) {
		n := m[2] + m[3]
		if v, err := strconv.ParseInt(strings.TrimPrefix(n, "-"), 10, 64); m[1] == "(" || (err == nil && v < 1024) {
			continue
		}
		return n
	}
	return ""
}
