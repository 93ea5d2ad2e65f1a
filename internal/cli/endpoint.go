package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	mount "k8s.io/mount-utils"

	"github.com/quiverstorage/quiver/internal/blockdev"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/nbd"
)

func (a *app) endpointCommand() *cobra.Command {
	var control, root, fuseRoot, logLevel string
	var servers []string
	var poll time.Duration
	cmd := &cobra.Command{
		Use:   "endpoint",
		Short: "Serve the disks of the volumes published on a compute node, following each volume's primary",
		Long: `Run the compute node's endpoint until interrupted. The CSI node plugin
(quiver csi --quiver-endpoint) publishes each volume staged on the node here:
the endpoint serves its disks over NBD on a unix socket of its own
(<root>/volumes/<volume>/nbd.sock, one export per disk, named by disk), which
the plugin binds at the volume's staging path, and sends every request
directly to the volume's primary of the moment. It finds the primary through
the storage nodes' API (--servers: any of them; compute nodes need no etcd),
asks again when a connection breaks and every --poll-interval, and sends an
unanswered request again to the new primary, so QEMU sees a failover of the
storage nodes as slow requests, never an error. It presents the attachment
token the CSI driver made for this node, so the single-writer rule and the
fencing of a live migration hold as for any NBD client.

It also holds the nbdfuse processes and loop devices of Block-mode volumes
(the device agent's job), on the same control socket: they are its
children and outlive the node plugin.

Run it as a DaemonSet of its own (not rolled with the node plugin) or a
systemd unit. A restart serves every publication again from <root>/state;
QEMU with reconnect-delay rides through it (docs/kubevirt.md). The control
socket is made 0600; the token of --token-file needs to read volumes.`,
		Example: `  quiver endpoint --servers https://10.0.0.1:7480,https://10.0.0.2:7480 --token-file /etc/quiver/token
  quiver csi --mode node --quiver-endpoint /run/quiver/endpoint.sock ...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
			}
			log := slog.New(slog.NewTextHandler(a.env.Stderr, &slog.HandlerOptions{Level: level}))
			if !filepath.IsAbs(root) || !filepath.IsAbs(control) || !filepath.IsAbs(fuseRoot) {
				return errors.New("--root, --control and --fuse-root must be absolute paths")
			}
			if len(servers) == 0 {
				servers = []string{a.server}
			}
			var nodes []*client.Client
			for _, s := range servers {
				s = strings.TrimSpace(s)
				if s == "" {
					continue
				}
				c, err := a.clientOf(s)
				if err != nil {
					return fmt.Errorf("--servers %s: %w", s, err)
				}
				nodes = append(nodes, c)
			}
			if len(nodes) == 0 {
				return errors.New("--servers: name at least one storage node's API")
			}
			ln, err := listenControl(control, "endpoint")
			if err != nil {
				return err
			}
			defer ln.Close()
			if err := os.MkdirAll(fuseRoot, 0o700); err != nil {
				return fmt.Errorf("--fuse-root: %w", err)
			}
			cfg := nbd.DefaultConfig()
			e, err := endpoint.Open(endpoint.Config{Root: root, Locator: endpoint.NewLocator(nodes...), NBD: cfg,
				PollInterval: poll, Log: log})
			if err != nil {
				return err
			}
			defer e.Close()
			agent := &blockdev.Agent{Root: fuseRoot, Devices: blockdev.NewNbdfuseLoop(mount.New("")), Log: log}
			log.Info("endpoint serving", "control", control, "root", root, "servers", len(nodes), "volumes", len(e.List()))
			return serveControl(cmd.Context(), ln, e.Handler(agent), func() {
				log.Info("endpoint stopping; publications stay recorded and the block devices keep running")
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&servers, "servers", nil, "storage nodes' API addresses, comma-separated (default: --server)")
	f.StringVar(&control, "control", "/run/quiver/endpoint.sock", "unix socket the CSI node plugin asks on (made 0600)")
	f.StringVar(&root, "root", "/var/lib/quiver-endpoint", "publications and the volumes' socket directories")
	f.StringVar(&fuseRoot, "fuse-root", "/var/lib/quiver-csi/fuse", "the only directory under which FUSE mount points are made: the plugin's --state-dir/fuse")
	f.DurationVar(&poll, "poll-interval", time.Second, "how often a served volume's primary is asked again")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}
