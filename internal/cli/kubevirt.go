package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/kubevirt/hook"
	"github.com/quiverstorage/quiver/internal/kubevirt/webhook"
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
	f := cmd.Flags()
	f.StringVar(&cfg.Socket, "socket", filepath.Join(hook.SocketDir, "quiver.sock"), "unix socket to serve on")
	f.StringVar(&cfg.Options.Volume, "volume", "", "only this KubeVirt volume (the webhook runs one sidecar per quiver PVC)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

func (a *app) kubevirtWebhookCommand() *cobra.Command {
	cfg := webhook.Config{}
	var listen, certFile, keyFile, logLevel string
	cmd := &cobra.Command{
		Use:   "kubevirt-webhook",
		Short: "Run the mutating admission webhook that adds the hook sidecar to VMs with quiver PVCs",
		Long: `Serve a Kubernetes mutating admission webhook (HTTPS, POST /mutate) until
interrupted. For a VirtualMachineInstance or VirtualMachine whose PVC is a quiver
volume in Filesystem mode, it names the volume's other disks in the
quiver.io/extra-disks annotation and adds the quiver hook sidecar
(hooks.kubevirt.io/hookSidecars). A Block-mode quiver PVC with several disks gets
a warning. It reads PVCs from Kubernetes with its service account and volumes
from the quiver API (--server, --token-file). See docs/kubevirt.md.`,
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
			claims, err := webhook.InClusterClaims()
			if err != nil {
				return err
			}
			cfg.Volumes, cfg.Claims, cfg.Logger = c, claims, log
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
			log.Info("serving KubeVirt admission webhook", "listen", listen)
			if err := srv.ListenAndServeTLS(certFile, keyFile); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":8443", "HTTPS address")
	f.StringVar(&certFile, "tls-cert", "/etc/quiver-webhook/tls.crt", "serving certificate (PEM)")
	f.StringVar(&keyFile, "tls-key", "/etc/quiver-webhook/tls.key", "its private key (PEM)")
	f.StringVar(&cfg.Image, "sidecar-image", "", "image of the hook sidecar: a quiver image")
	f.StringVar(&cfg.ImagePullPolicy, "sidecar-pull-policy", "IfNotPresent", "imagePullPolicy of the sidecar")
	f.StringVar(&cfg.Driver, "driver-name", webhook.DefaultDriver, "CSI driver whose PVCs are quiver volumes")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}
