package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/kubevirt/webhook"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// execute runs a command line for at most 10 s (a command that should have
// been refused but serves is stopped, and the test fails on its exit code).
func execute(args ...string) result {
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code := Execute(ctx, args, Env{Stdout: &stdout, Stderr: &stderr})
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// TestKubevirtHookDropsRootFlags: the hook sidecar never calls the quiver
// API, so the root's API and output flags are not in its help, and giving
// one is a usage error naming it (before the command starts: no socket is
// made), in either position.
func TestKubevirtHookDropsRootFlags(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "hook.sock")
	for _, args := range [][]string{
		{"kubevirt-hook", "--socket", socket, "--server", "http://x:7480"},
		{"--token-file", "/t", "kubevirt-hook", "--socket", socket},
		{"kubevirt-hook", "--socket", socket, "--ca-file", "/ca"},
		{"kubevirt-hook", "--socket", socket, "--cert-file", "/c"},
		{"kubevirt-hook", "--socket", socket, "--key-file", "/k"},
		{"kubevirt-hook", "--socket", socket, "-o", "json"},
	} {
		got := execute(args...)
		name := ""
		for _, a := range args {
			if strings.HasPrefix(a, "-") && a != "--socket" {
				name = strings.TrimLeft(a, "-")
			}
		}
		if name == "o" {
			name = "output"
		}
		if got.code != ExitError || !strings.Contains(got.stderr, "quiver kubevirt-hook does not use --"+name) {
			t.Errorf("%v: exit %d, stderr %q", args, got.code, got.stderr)
		}
	}
	help := execute("kubevirt-hook", "--help")
	for _, flag := range []string{"--server", "--token-file", "--ca-file", "--cert-file", "--key-file", "--output"} {
		if strings.Contains(help.stdout, flag) {
			t.Errorf("kubevirt-hook --help lists %s:\n%s", flag, help.stdout)
		}
	}
	if !strings.Contains(help.stdout, "--socket") || !strings.Contains(help.stdout, "--volume") {
		t.Errorf("kubevirt-hook --help lacks its own flags:\n%s", help.stdout)
	}
	// Other commands keep them.
	if help := execute("kubevirt-webhook", "--help"); !strings.Contains(help.stdout, "--server") {
		t.Errorf("kubevirt-webhook lost --server:\n%s", help.stdout)
	}
}

// TestKubevirtWebhookCAFlags: --webhook-config and --webhook-ca-file go
// together, and a serving certificate that does not chain to the CA is
// refused before the configuration is touched (the API address has no
// listener: a request would end in another error), as is a CA file that
// holds no CA.
func TestKubevirtWebhookCAFlags(t *testing.T) {
	got := execute("kubevirt-webhook", "--sidecar-image", "quiver:dev", "--webhook-config", "quiver-kubevirt")
	if got.code != ExitError || !strings.Contains(got.stderr, "--webhook-config and --webhook-ca-file: give both") {
		t.Errorf("config without CA: exit %d, stderr %q", got.code, got.stderr)
	}
	dir := t.TempDir()
	ca, other := certtest.NewCA(t, "webhook-ca"), certtest.NewCA(t, "other-ca")
	caFile := filepath.Join(dir, "ca.crt")
	certtest.WriteFile(t, caFile, ca.PEM)
	cert, key := other.Server(t, false, "quiver-kubevirt-webhook.quiver.svc").Write(t, dir)
	_, err := ensureCABundle(t.Context(), &webhook.Kube{Server: "http://127.0.0.1:1"}, "quiver-kubevirt", caFile, cert, key)
	if err == nil || !strings.Contains(err.Error(), "does not chain to --webhook-ca-file") {
		t.Errorf("certificate of another CA: %v", err)
	}
	leafDir := t.TempDir()
	leafCert, leafKey := ca.Server(t, false, "w.q.svc").Write(t, leafDir)
	_, err = ensureCABundle(t.Context(), &webhook.Kube{Server: "http://127.0.0.1:1"}, "quiver-kubevirt", leafCert, leafCert, leafKey)
	if err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("a leaf as CA: %v", err)
	}
}

// TestDeployFlags: every flag the Kubernetes manifests and the Helm chart's
// templates pass to a quiver command exists, so they do not rot as flags
// change. Both write a command's arguments as "- <command>" followed by
// "- --flag[=value]" lines; the scan reads those.
func TestDeployFlags(t *testing.T) {
	files, _ := filepath.Glob("../../deploy/kubernetes/*.yaml")
	templates, _ := filepath.Glob("../../deploy/helm/quiver/templates/*.yaml")
	files = append(files, templates...)
	if len(files) < 10 {
		t.Fatalf("found %d manifests and templates", len(files))
	}
	a := &app{env: Env{Getenv: func(string) string { return "" }}}
	root := a.rootCommand()
	seen := map[string]int{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var cmd *cobra.Command
		for line := range strings.SplitSeq(string(data), "\n") {
			item, ok := strings.CutPrefix(strings.TrimSpace(line), "- ")
			if !ok {
				if !strings.HasPrefix(strings.TrimSpace(line), "#") && !strings.HasPrefix(strings.TrimSpace(line), "{{") {
					cmd = nil
				}
				continue
			}
			if flag, isFlag := strings.CutPrefix(item, "--"); isFlag && cmd != nil {
				name, _, _ := strings.Cut(flag, "=")
				if cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil {
					t.Errorf("%s passes --%s, which quiver %s does not have", filepath.Base(file), name, cmd.Name())
				}
				seen[cmd.Name()]++
				continue
			}
			switch item {
			case "server", "csi", "endpoint", "kubevirt-webhook":
				c, _, err := root.Find([]string{item})
				if err != nil {
					t.Fatal(err)
				}
				cmd = c
			default:
				cmd = nil
			}
		}
	}
	for _, c := range []string{"server", "csi", "endpoint", "kubevirt-webhook"} {
		if seen[c] < 3 {
			t.Errorf("found %d flags of quiver %s in the manifests and templates", seen[c], c)
		}
	}
}

// TestKubevirtWebhookReloadsCertificate: the webhook, started with a
// kubeconfig outside a cluster, serves its certificate, and once the files
// are replaced (renamed over, as a Secret volume's update does) serves the
// new one to new connections without a restart. A renewal by cert-manager
// works so.
func TestKubevirtWebhookReloadsCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "webhook-ca")
	first := ca.Server(t, false, "127.0.0.1")
	cert, key := first.Write(t, dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	certtest.WriteFile(t, kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n"+
		"users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() {
		var stdout, stderr bytes.Buffer
		code := Execute(ctx, []string{"kubevirt-webhook", "--server", "http://127.0.0.1:1", "--sidecar-image", "quiver:dev",
			"--kubeconfig", kubeconfig, "--listen", addr, "--tls-cert", cert, "--tls-key", key, "--tls-watch-interval", "20ms"},
			Env{Stdout: &stdout, Stderr: &stderr})
		done <- result{code: code, stdout: stdout.String(), stderr: stderr.String()}
	}()
	defer func() {
		cancel()
		if r := <-done; r.code != ExitOK && r.code != ExitInterrupted {
			t.Errorf("webhook exit %d: %s", r.code, r.stderr)
		}
	}()
	served := func() *x509.Certificate {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
			if err != nil {
				continue
			}
			peer := c.ConnectionState().PeerCertificates[0]
			c.Close()
			return peer
		}
		select {
		case r := <-done:
			t.Fatalf("webhook ended: exit %d: %s", r.code, r.stderr)
		default:
		}
		t.Fatal("webhook does not serve TLS")
		return nil
	}
	serial := func(p certtest.Pair) string {
		block, _ := pem.Decode(p.Cert)
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c.SerialNumber.String()
	}
	if got := served().SerialNumber.String(); got != serial(first) {
		t.Fatalf("serves certificate %s, want the first %s", got, serial(first))
	}
	second := ca.Server(t, false, "127.0.0.1")
	newDir := t.TempDir()
	newCert, newKey := second.Write(t, newDir)
	for from, to := range map[string]string{newKey: key, newCert: cert} {
		if err := os.Rename(from, to); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if served().SerialNumber.String() == serial(second) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the renewed certificate is not served 10 s after the files changed")
		}
	}
}
