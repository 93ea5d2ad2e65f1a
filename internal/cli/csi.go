package cli

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/quiverstorage/quiver/internal/csi"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pluginreg"
)

func (a *app) csiCommand() *cobra.Command {
	cfg := csi.Config{}
	var mode, logLevel, regDir, kubeletEndpoint string
	cmd := &cobra.Command{
		Use:   "csi",
		Short: "Run the CSI plugin (identity, controller and node services) for Kubernetes",
		Long: `Run quiver's Container Storage Interface plugin on a unix socket until
interrupted. A CSI volume is a quiver volume: one PVC per VM, all its disks.

The plugin is a client of the quiver API (--server, and --token-file or a
client certificate mapped to a token, --cert-file and --key-file): run it with
--mode controller beside the CSI sidecars, and with --mode node on every node
(or --mode all on a single host). Block-mode volumes reach the disks over NBD
(--nbd) through nbdfuse and a loop device; Filesystem-mode volumes bind-mount
the volume's directory, which the node must see (--pool-dir).

See docs/csi.md for deployment and StorageClass parameters.`,
		Example: `  quiver csi --mode controller --endpoint unix:///csi/csi.sock --server https://quiver:7480 --token-file /etc/quiver/token
  quiver csi --mode node --node-id "$NODE_NAME" --endpoint unix:///csi/csi.sock --server http://127.0.0.1:7480 --nbd 127.0.0.1:10809`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
			}
			cfg.Mode = csi.Mode(mode)
			cfg.Server = serverURL(a.server)
			cfg.CAFile, cfg.CertFile, cfg.KeyFile = a.caFile, a.certFile, a.keyFile
			if a.tokenFile != "" {
				token, err := readToken(a.tokenFile)
				if err != nil {
					return err
				}
				cfg.Token = token
			}
			cfg.Logger = slog.New(slog.NewTextHandler(a.env.Stderr, &slog.HandlerOptions{Level: level}))
			d, err := csi.New(cfg)
			if err != nil {
				return err
			}
			if regDir == "" {
				return d.Serve(cmd.Context())
			}
			if cfg.Mode == csi.ModeController {
				return fmt.Errorf("--registration-dir registers a node plugin with the kubelet: it needs --mode node or all")
			}
			if kubeletEndpoint == "" {
				if kubeletEndpoint, err = csi.SocketPath(cfg.Endpoint); err != nil {
					return err
				}
			}
			reg, err := pluginreg.New(pluginreg.Config{Dir: regDir, DriverName: cfg.DriverName, Endpoint: kubeletEndpoint,
				Logger: cfg.Logger})
			if err != nil {
				return err
			}
			// Both end together: a plugin the kubelet cannot reach, or a
			// registration without a plugin behind it, helps no one.
			g, ctx := errgroup.WithContext(cmd.Context())
			g.Go(func() error { return d.Serve(ctx) })
			g.Go(func() error { return reg.Serve(ctx) })
			return g.Wait()
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI socket: unix:///path/to/csi.sock")
	f.StringVar(&mode, "mode", string(csi.ModeAll), "services to run: controller, node or all")
	f.StringVar(&cfg.NodeID, "node-id", "", "this node's ID, usually the Kubernetes node name (node and all modes)")
	f.StringVar(&cfg.NBD, "nbd", nbd.DefaultAddr, "quiver's NBD server as this node reaches it: host:port or unix:///path/to.sock")
	f.StringVar(&cfg.StateDir, "state-dir", "/var/lib/quiver-csi", "node state: publication records and nbdfuse mount points")
	f.StringVar(&cfg.DeviceAgent, "device-agent", "",
		"unix socket of `quiver device-agent`, which holds Block-mode devices so they outlive this plugin (empty: this process holds them)")
	f.StringVar(&cfg.QuiverEndpoint, "quiver-endpoint", "",
		"control socket of this node's `quiver endpoint`: volumes reach QEMU through it, following their primary (required for Filesystem mode on a cluster)")
	f.StringVar(&cfg.PoolDir, "pool-dir", "", "where this node sees the pool directory, if not at the server's path")
	f.StringVar(&cfg.DriverName, "driver-name", csi.DefaultDriverName, "CSI driver name")
	f.StringVar(&regDir, "registration-dir", "",
		"register the node plugin with the kubelet through this directory (the kubelet's "+pluginreg.DefaultDir+" as this process sees it; empty: do not register)")
	f.StringVar(&kubeletEndpoint, "kubelet-endpoint", "",
		"the CSI socket's path as the kubelet sees it on the host, when it differs from --endpoint's (for example /var/lib/kubelet/plugins/csi.quiver.io/csi.sock)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}
