package webhook

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeAPI is a Kubernetes API server over TLS that holds objects as JSON,
// answers GET, and applies JSON Patches (the "test" and "add" operations
// of RFC 6902, as the API server does: a failed test is 422 and nothing
// changes), bumping resourceVersion on each change. Requests without the
// token are 401.
type fakeAPI struct {
	*httptest.Server
	token string

	mu      sync.Mutex
	objects map[string]map[string]any // path -> object
	patches int
	// beforePatch, when set, runs under mu before each PATCH is applied
	// (another writer changing the object in between).
	beforePatch func(obj map[string]any)
	// status, when set for a path, is answered instead.
	status map[string]int
}

func newFakeAPI(t *testing.T, token string, objects map[string]string) *fakeAPI {
	t.Helper()
	f := &fakeAPI{token: token, objects: map[string]map[string]any{}, status: map[string]int{}}
	for path, body := range objects {
		var obj map[string]any
		if err := json.Unmarshal([]byte(body), &obj); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		f.objects[path] = obj
	}
	f.Server = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if code := f.status[r.URL.Path]; code != 0 {
		http.Error(w, "injected", code)
		return
	}
	obj, ok := f.objects[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	switch r.Method {
	case http.MethodGet:
	case http.MethodPatch:
		if r.Header.Get("Content-Type") != "application/json-patch+json" {
			http.Error(w, "want a JSON Patch", http.StatusUnsupportedMediaType)
			return
		}
		f.patches++
		if f.beforePatch != nil {
			f.beforePatch(obj)
		}
		body, _ := io.ReadAll(r.Body)
		var ops []struct {
			Op, Path string
			Value    any
		}
		if err := json.Unmarshal(body, &ops); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		next := deepCopy(obj)
		for _, op := range ops {
			if err := applyOp(next, op.Op, op.Path, op.Value); err != nil {
				http.Error(w, err.Error(), http.StatusUnprocessableEntity)
				return
			}
		}
		meta := next["metadata"].(map[string]any)
		rv, _ := strconv.Atoi(fmt.Sprint(meta["resourceVersion"]))
		meta["resourceVersion"] = strconv.Itoa(rv + 1)
		f.objects[r.URL.Path], obj = next, next
	default:
		http.Error(w, "method", http.StatusMethodNotAllowed)
		return
	}
	json.NewEncoder(w).Encode(obj)
}

func deepCopy(obj map[string]any) map[string]any {
	b, _ := json.Marshal(obj)
	var out map[string]any
	json.Unmarshal(b, &out)
	return out
}

// applyOp applies one "test" or "add" operation at a JSON Pointer whose
// parents exist.
func applyOp(obj map[string]any, op, path string, value any) error {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	var cur any = obj
	for _, p := range parts[:len(parts)-1] {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[p]
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(c) {
				return fmt.Errorf("path %s: no element %s", path, p)
			}
			cur = c[i]
		}
		if cur == nil {
			return fmt.Errorf("path %s: no %s", path, p)
		}
	}
	m, ok := cur.(map[string]any)
	if !ok {
		return fmt.Errorf("path %s: parent is not an object", path)
	}
	last := parts[len(parts)-1]
	switch op {
	case "test":
		if fmt.Sprint(m[last]) != fmt.Sprint(value) {
			return fmt.Errorf("test of %s failed: %v != %v", path, m[last], value)
		}
	case "add":
		m[last] = value
	default:
		return fmt.Errorf("op %s not supported", op)
	}
	return nil
}

// kubeconfig writes a kubeconfig for the fake API: its URL, its CA, the
// token.
func (f *fakeAPI) kubeconfig(t *testing.T) string {
	t.Helper()
	ca := f.Certificate()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	pemCA := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	if err := os.WriteFile(caFile, pemCA, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: webhook
  user:
    token: %s
contexts:
- name: fake
  context: {cluster: fake, user: webhook}
current-context: fake
`, f.URL, caFile, f.token)
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
