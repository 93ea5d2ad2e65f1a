package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

func TestVolumeCreateSendsQoS(t *testing.T) {
	tests := []struct {
		name  string
		flags []string
		want  string // the "qos" member of the body, "" for none
	}{
		{"none", nil, ""},
		{"rw", []string{"--qos-rw-iops", "500", "--qos-rw-mbytes", "50"}, `{"rwIOPS":500,"rwMBytes":50}`},
		{"all six", []string{"--qos-rw-iops", "1", "--qos-rw-mbytes", "2", "--qos-read-iops", "3",
			"--qos-write-iops", "4", "--qos-read-mbytes", "5", "--qos-write-mbytes", "6"},
			`{"rwIOPS":1,"rwMBytes":2,"readIOPS":3,"writeIOPS":4,"readMBytes":5,"writeMBytes":6}`},
		{"zero is unlimited", []string{"--qos-rw-iops", "0"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, url := newFakeAPI(t)
			f.reply("POST /v1/volumes", 201, testVolumes[0])
			args := append([]string{"volume", "create", "web01", "--capacity", "1Gi"}, tt.flags...)
			if got := run(t, context.Background(), url, nil, args...); got.code != 0 {
				t.Fatalf("exit %d: %s", got.code, got.stderr)
			}
			var body map[string]json.RawMessage
			if err := json.Unmarshal([]byte(f.body("POST /v1/volumes")), &body); err != nil {
				t.Fatal(err)
			}
			if got := string(body["qos"]); got != tt.want {
				t.Fatalf("qos = %s, want %s", got, tt.want)
			}
		})
	}
}

func qosVolume(q *api.QoS) api.Volume {
	v := testVolumes[0]
	v.QoS = q
	return v
}

func TestVolumeQoS(t *testing.T) {
	current := &api.QoS{RWIOPS: 500, RWMBytes: 50}
	tests := []struct {
		name    string
		args    []string
		patched *api.QoS // what the server answers the PATCH with
		want    string   // the PATCH body; "" when none must be sent
		get     bool     // whether the volume is read first
		stdout  string
	}{
		{
			name: "show", args: []string{"web01"}, get: true,
			stdout: "VOLUME   RW IOPS   RW MB/S   READ IOPS   WRITE IOPS   READ MB/S   WRITE MB/S\n" +
				"web01    500       50        unlimited   unlimited    unlimited   unlimited\n",
		},
		{
			name: "a flag changes one limit and keeps the others", args: []string{"web01", "--rw-iops", "1000"},
			get: true, want: `{"labels":null,"qos":{"rwIOPS":1000,"rwMBytes":50}}`,
			patched: &api.QoS{RWIOPS: 1000, RWMBytes: 50},
			stdout: "VOLUME   RW IOPS   RW MB/S   READ IOPS   WRITE IOPS   READ MB/S   WRITE MB/S\n" +
				"web01    1000      50        unlimited   unlimited    unlimited   unlimited\n",
		},
		{
			name: "zero removes one limit", args: []string{"web01", "--rw-mbytes", "0", "--write-iops", "20"},
			get: true, want: `{"labels":null,"qos":{"rwIOPS":500,"writeIOPS":20}}`,
			patched: &api.QoS{RWIOPS: 500, WriteIOPS: 20},
			stdout: "VOLUME   RW IOPS   RW MB/S     READ IOPS   WRITE IOPS   READ MB/S   WRITE MB/S\n" +
				"web01    500       unlimited   unlimited   20           unlimited   unlimited\n",
		},
		{
			name: "clear removes all", args: []string{"web01", "--clear"},
			want: `{"labels":null,"qos":{}}`,
			stdout: "VOLUME   RW IOPS     RW MB/S     READ IOPS   WRITE IOPS   READ MB/S   WRITE MB/S\n" +
				"web01    unlimited   unlimited   unlimited   unlimited    unlimited   unlimited\n",
		},
		{
			name: "clear with flags replaces all", args: []string{"web01", "--clear", "--read-mbytes", "7"},
			want: `{"labels":null,"qos":{"readMBytes":7}}`, patched: &api.QoS{ReadMBytes: 7},
			stdout: "VOLUME   RW IOPS     RW MB/S     READ IOPS   WRITE IOPS   READ MB/S   WRITE MB/S\n" +
				"web01    unlimited   unlimited   unlimited   unlimited    7           unlimited\n",
		},
		{
			name: "json", args: []string{"web01", "-o", "json"}, get: true,
			stdout: "{\n  \"rwIOPS\": 500,\n  \"rwMBytes\": 50\n}\n",
		},
		{
			name: "json of no limits is an empty object", args: []string{"web01", "--clear", "-o", "json"},
			want: `{"labels":null,"qos":{}}`, stdout: "{}\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, url := newFakeAPI(t)
			f.reply("GET /v1/volumes/web01", 200, qosVolume(current))
			f.reply("PATCH /v1/volumes/web01", 200, qosVolume(tt.patched))
			got := run(t, context.Background(), url, nil, append([]string{"volume", "qos"}, tt.args...)...)
			if got.code != 0 || got.stdout != tt.stdout {
				t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, tt.stdout)
			}
			if sent := f.sent("GET /v1/volumes/web01"); sent != tt.get {
				t.Errorf("volume read first: %v, want %v", sent, tt.get)
			}
			if body := f.body("PATCH /v1/volumes/web01"); !jsonEqual(t, body, tt.want) {
				t.Errorf("PATCH body %q, want %q", body, tt.want)
			}
		})
	}
}

// jsonEqual compares two JSON texts by value; "" equals only "".
func jsonEqual(t *testing.T, a, b string) bool {
	t.Helper()
	if a == "" || b == "" {
		return a == b
	}
	var va, vb any
	if err := json.Unmarshal([]byte(a), &va); err != nil {
		t.Fatalf("%q: %v", a, err)
	}
	if err := json.Unmarshal([]byte(b), &vb); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	ja, _ := json.Marshal(va)
	jb, _ := json.Marshal(vb)
	return string(ja) == string(jb)
}

func TestVolumeGetShowsQoS(t *testing.T) {
	for _, tt := range []struct {
		q    *api.QoS
		want string
	}{
		{nil, "QoS:        unlimited\n"},
		{&api.QoS{RWIOPS: 500, RWMBytes: 50, WriteMBytes: 20}, "QoS:        rw-iops=500,rw-mbytes=50,write-mbytes=20\n"},
	} {
		f, url := newFakeAPI(t)
		f.reply("GET /v1/volumes/web01", 200, qosVolume(tt.q))
		got := run(t, context.Background(), url, nil, "volume", "get", "web01")
		if got.code != 0 || !strings.Contains(got.stdout, tt.want) {
			t.Errorf("exit %d, output lacks %q:\n%s", got.code, tt.want, got.stdout)
		}
	}
}

func TestBadQoSIsRefusedBeforeSending(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"volume", "create", "v", "--capacity", "1Gi", "--qos-rw-iops", "-1"}, `invalid argument "-1" for "--qos-rw-iops" flag: -1: must be 0 (unlimited) or more`},
		{[]string{"volume", "qos", "v", "--write-mbytes", "-5"}, `invalid argument "-5" for "--write-mbytes" flag: -5: must be 0 (unlimited) or more`},
		{[]string{"volume", "qos", "v", "--rw-iops", "lots"}, `invalid argument "lots" for "--rw-iops" flag: "lots": want operations per second (e.g. 500 or 2k)`},
		{[]string{"volume", "qos", "v", "--rw-mbytes", "20 Mi"}, `invalid argument "20 Mi" for "--rw-mbytes" flag: "20 Mi": want MB per second (e.g. 50) or a size per second (e.g. 50M, 48Mi)`},
		{[]string{"volume", "qos", "v", "--rw-mbytes", "-20Mi"}, `invalid argument "-20Mi" for "--rw-mbytes" flag: "-20Mi": want MB per second`},
		{[]string{"volume", "stats", "v", "--interval", "0s"}, "--interval 0s: must be positive"},
		{[]string{"volume", "stats", "v", "--count", "-1"}, "--count -1: must be 0 (until interrupted) or more"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) { refusedBeforeSending(t, tt.args, tt.want) })
	}
}

// TestQoSFlagsTakeSizes: --*-mbytes take sizes per second as people write
// them, not only MB counts, and IOPS take SI quantities; no Go parse error
// reaches the user.
func TestQoSFlagsTakeSizes(t *testing.T) {
	for _, tc := range []struct {
		flag, value string
		want        string // the JSON the server gets
	}{
		{"--rw-mbytes", "50", `"rwMBytes":50`},
		{"--rw-mbytes", "20Mi", `"rwMBytes":21`}, // 20.97 MB
		{"--rw-mbytes", "50M", `"rwMBytes":50`},
		{"--write-mbytes", "1G", `"writeMBytes":1000`},
		{"--read-mbytes", "1Ki", `"readMBytes":1`}, // below 1 MB/s: 1, never 0 (unlimited)
		{"--rw-iops", "2k", `"rwIOPS":2000`},
		{"--rw-iops", "0", `{}`},
	} {
		t.Run(tc.flag+"="+tc.value, func(t *testing.T) {
			f, url := newFakeAPI(t)
			f.reply("GET /v1/volumes/v", 200, qosVolume(nil))
			f.reply("PATCH /v1/volumes/v", 200, qosVolume(nil))
			got := run(t, context.Background(), url, nil, "volume", "qos", "v", tc.flag, tc.value)
			if got.code != 0 {
				t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
			}
			if body := f.body("PATCH /v1/volumes/v"); !strings.Contains(body, tc.want) {
				t.Fatalf("sent %s, want it to hold %s", body, tc.want)
			}
		})
	}
}
