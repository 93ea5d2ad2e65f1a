package backup

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/tests3"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// backupEnv is a quiver server with one backup target, "offsite", on a
// fresh S3 server, its repository initialised.
type backupEnv struct {
	s3      *tests3.Server
	srv     *testserver.Process
	keyFile string
	// cli runs the CLI and fails the test on an error; cli2 talks to srv.
	cli, cli2 func(args ...string) string
}

func startWithBackups(t *testing.T) *backupEnv {
	t.Helper()
	e := &backupEnv{s3: tests3.Start(t)}
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	e.keyFile = filepath.Join(dir, "repo.key")
	cfg := map[string]any{"targets": []map[string]any{{"name": "offsite", "endpoint": e.s3.Config.Endpoint,
		"bucket": e.s3.Config.Bucket, "prefix": "quiver", "insecure": true,
		"accessKeyFile": write("access", e.s3.Config.AccessKey), "secretKeyFile": write("secret", e.s3.Config.SecretKey),
		"keyFile": e.keyFile}}}
	data, _ := json.Marshal(cfg)
	cfgFile := write("backup.json", string(data))
	e.cli = func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("quiver %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	e.cli("backup", "key", "generate", e.keyFile)
	e.srv = testserver.StartT(t, bin, testserver.Options{Pool: t.TempDir(), NBDTCP: true, Args: []string{"--backup-config", cfgFile}})
	e.cli2 = func(args ...string) string {
		t.Helper()
		return e.cli(append([]string{"--server", "http://" + e.srv.APIAddr}, args...)...)
	}
	e.cli2("backup", "target", "init", "offsite")
	return e
}
