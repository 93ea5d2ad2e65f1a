package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/kubevirt/hook"
	"github.com/quiverstorage/quiver/internal/kubevirt/webhook"
	"github.com/quiverstorage/quiver/internal/tlscert"
)

func newLogger(a *app, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(a.env.Stderr, &slog.HandlerOptions{Level: l})), nil
}

func (a *app) kubevirtHookCommand() *cobra.Command {
	cfg := hook.Config{}
	var logLevel string
	cmd := &cobra.Command{
		Use:   "kubevirt-hook",
		Short: "Run the KubeVirt hook sidecar that gives a VM every disk of its quiver PVC",
		Long: `Serve KubeVirt's hook sidecar API (Info, Callbacks v1alpha3 and v1alpha2) on a
unix socket until interrupted. Before virt-launcher defines the VM's domain,
OnDefineDomain adds the disks the VMI's quiver.io/extra-disks annotation names
as file disks beside the PVC's disk.img, with serial = disk name.

quiver kubevirt-webhook adds this sidecar to VMs with quiver PVCs; see
docs/kubevirt.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(a, logLevel)
			if err != nil {
				return err
			}
			cfg.Logger = log
			return hook.NewServer(cfg).Serve(cmd.Context())
		},
	}
	// It serves virt-launcher on a socket and never calls the quiver API.
	dropRootFlags(cmd, "server", "token-file", "ca-file", "cert-file", "key-file", "output")
	f := cmd.Flags()
	f.StringVar(&cfg.Socket, "socket", filepath.Join(hook.SocketDir, "quiver.sock"), "unix socket to serve on")
	f.StringVar(&cfg.Options.Volume, "volume", "", "only this KubeVirt volume (default: every volume the quiver annotations name; the webhook runs one sidecar for all)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// watchCertificate reads the serving certificate again whenever its files
// change, every interval, until ctx ends. A failed read (a renewal half
// written) keeps the current one and is logged.
func watchCertificate(ctx context.Context, pair *tlscert.Pair, every time.Duration, log *slog.Logger) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tried, err := pair.ReloadIfChanged()
		switch {
		case err != nil:
			log.Warn("serving certificate not reloaded; the previous one stays", "files", pair.Files(), "err", err)
		case tried:
			log.Info("serving certificate reloaded", "files", pair.Files())
		}
	}
}

// ensureCABundle checks that the serving certificate chains to the CA of
// caFile, then writes that CA into the webhook configuration.
func ensureCABundle(ctx context.Context, kube *webhook.Kube, config, caFile, certFile, keyFile string) (int, error) {
	bundle, err := os.ReadFile(caFile)
	if err != nil {
		return 0, fmt.Errorf("--webhook-ca-file: %w", err)
	}
	roots, err := webhook.CheckCA(bundle)
	if err != nil {
		return 0, fmt.Errorf("--webhook-ca-file %s: %w", caFile, err)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return 0, fmt.Errorf("--tls-cert, --tls-key: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return 0, fmt.Errorf("--tls-cert %s: %w", certFile, err)
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
		return 0, fmt.Errorf("--tls-cert %s does not chain to --webhook-ca-file %s: %w", certFile, caFile, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return kube.EnsureCABundle(ctx, config, bundle)
}

func (a *app) kubevirtWebhookCommand() *cobra.Command {
	cfg := webhook.Config{}
	var listen, certFile, keyFile, logLevel, kubeconfig, webhookConfig, webhookCAFile string
	var tlsWatch time.Duration
	cmd := &cobra.Command{
		Use:   "kubevirt-webhook",
		Short: "Run the mutating admission webhook that adds the hook sidecar to VMs with quiver PVCs",
		Long: `Serve a Kubernetes mutating admission webhook (HTTPS, POST /mutate) until
interrupted. For a VirtualMachineInstance or VirtualMachine whose PVC is a quiver
volume in Filesystem mode, it names the volume's other disks in the
quiver.io/extra-disks annotation and adds the quiver hook sidecar
(hooks.kubevirt.io/hookSidecars). A Block-mode quiver PVC with several disks gets
a warning. It reads PVCs from Kubernetes with its service account and volumes
from the quiver API (--server, --token-file). See docs/kubevirt.md.

It reaches Kubernetes with its pod's service account, or with --kubeconfig.
With --webhook-config, it first makes every webhook of that
MutatingWebhookConfiguration trust the CA of --webhook-ca-file (its caBundle),
after checking that the serving certificate chains to that CA.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(a, logLevel)
			if err != nil {
				return err
			}
			if cfg.Image == "" {
				return errors.New("--sidecar-image: the quiver image the hook sidecar runs is required")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if (webhookConfig == "") != (webhookCAFile == "") {
				return errors.New("--webhook-config and --webhook-ca-file: give both (the configuration whose caBundle the webhook writes, and the CA), or neither")
			}
			kube, err := webhook.NewKube(kubeconfig)
			if err != nil {
				return err
			}
			if webhookConfig != "" {
				n, err := ensureCABundle(cmd.Context(), kube, webhookConfig, webhookCAFile, certFile, keyFile)
				if err != nil {
					return err
				}
				log.Info("caBundle of the webhook configuration", "config", webhookConfig, "changed", n)
			}
			cfg.Volumes, cfg.Claims, cfg.Logger = c, kube, log
			mux := http.NewServeMux()
			mux.Handle("POST /mutate", webhook.New(cfg))
			mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
			srv := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			stop := context.AfterFunc(cmd.Context(), func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
			})
			defer stop()
			// The certificate is read again when its files change (a
			// Secret volume's update, cert-manager's renewal): new
			// connections get the new one.
			pair, err := tlscert.Load(certFile, keyFile)
			if err != nil {
				return fmt.Errorf("--tls-cert, --tls-key: %w", err)
			}
			srv.TLSConfig = tlscert.ServerConfig(pair, nil, tls.NoClientCert)
			watchCtx, stopWatch := context.WithCancel(cmd.Context())
			watched := make(chan struct{})
			go func() {
				defer close(watched)
				watchCertificate(watchCtx, pair, tlsWatch, log)
			}()
			defer func() { stopWatch(); <-watched }()
			log.Info("serving KubeVirt admission webhook", "listen", listen)
			if err := srv.ListenAndServeTLS("", ""); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":8443", "HTTPS address")
	f.StringVar(&certFile, "tls-cert", "/etc/quiver-webhook/tls.crt", "serving certificate (PEM)")
	f.StringVar(&keyFile, "tls-key", "/etc/quiver-webhook/tls.key", "its private key (PEM)")
	f.DurationVar(&tlsWatch, "tls-watch-interval", 10*time.Second, "how often the certificate files are checked for a change (read again when they change)")
	f.StringVar(&cfg.Image, "sidecar-image", "", "image of the hook sidecar: a quiver image")
	f.StringVar(&cfg.ImagePullPolicy, "sidecar-pull-policy", "IfNotPresent", "imagePullPolicy of the sidecar")
	f.StringVar(&cfg.Driver, "driver-name", webhook.DefaultDriver, "CSI driver whose PVCs are quiver volumes")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file for the Kubernetes API (default: the pod's service account)")
	f.StringVar(&webhookConfig, "webhook-config", "", "MutatingWebhookConfiguration whose caBundle the webhook sets at start to --webhook-ca-file")
	f.StringVar(&webhookCAFile, "webhook-ca-file", "", "PEM CA the serving certificate chains to, written as caBundle into --webhook-config")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// dropRootFlags takes the root's flags of these names out of cmd: its help
// does not list them, and giving one is a usage error naming it, rather than
// a flag accepted and ignored. (Cobra adds a parent's persistent flag to a
// command only when the command has no flag of that name: a hidden one of
// its own shadows it.)
func dropRootFlags(cmd *cobra.Command, names ...string) {
	for _, name := range names {
		shorthand := ""
		if name == "output" {
			shorthand = "o"
		}
		cmd.Flags().StringP(name, shorthand, "", "not used by "+cmd.Name())
		_ = cmd.Flags().MarkHidden(name)
	}
	// Before the root's hook, which marks the command started: an error
	// here is a usage error.
	cmd.PersistentPreRunE = func(c *cobra.Command, args []string) error {
		for _, name := range names {
			if c.Flags().Changed(name) {
				return fmt.Errorf("quiver %s does not use --%s", c.Name(), name)
			}
		}
		if pre := c.Root().PersistentPreRunE; pre != nil {
			return pre(c, args)
		}
		return nil
	}
}
