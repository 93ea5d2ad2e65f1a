package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	mount "k8s.io/mount-utils"

	"github.com/quiverstorage/quiver/internal/blockdev"
	"github.com/quiverstorage/quiver/internal/server"
)

func (a *app) deviceAgentCommand() *cobra.Command {
	var socket, root, logLevel string
	cmd := &cobra.Command{
		Use:   "device-agent",
		Short: "Hold the block devices of Block-mode CSI volumes, outliving the CSI node plugin",
		Long: `Run the device agent of a node until interrupted. A Block-mode CSI volume is a
loop device over a file that nbdfuse serves from quiver's NBD export. The
agent starts and stops those nbdfuse processes and loop devices for the CSI
node plugin (quiver csi --device-agent), which asks over a unix socket. They
are the agent's children, not the plugin's, so restarting or upgrading the
node plugin leaves every VM's device running; the restarted plugin finds them
from its state directory.

Run it outside the node plugin's container (a DaemonSet of its own that is not
rolled with the plugin, or a systemd unit on the node). Stopping the agent
leaves the devices running too; a new agent takes them over. The socket is
made 0600: whoever can reach it can map any NBD export it has a URI for.
--root must be the plugin's --state-dir followed by /fuse.`,
		Example: `  quiver device-agent --socket /run/quiver/device-agent.sock --root /var/lib/quiver-csi/fuse
  quiver csi --mode node --device-agent /run/quiver/device-agent.sock ...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
			}
			log := slog.New(slog.NewTextHandler(a.env.Stderr, &slog.HandlerOptions{Level: level}))
			if !filepath.IsAbs(root) || !filepath.IsAbs(socket) {
				return errors.New("--root and --socket must be absolute paths")
			}
			if err := os.MkdirAll(root, 0o700); err != nil {
				return fmt.Errorf("--root: %w", err)
			}
			ln, err := listenControl(socket, "device agent")
			if err != nil {
				return err
			}
			agent := &blockdev.Agent{Root: root, Devices: blockdev.NewNbdfuseLoop(mount.New("")), Log: log}
			log.Info("device agent serving", "socket", socket, "root", root)
			return serveControl(cmd.Context(), ln, agent.Handler(), func() {
				log.Info("device agent stopping; the devices it holds keep running")
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&socket, "socket", "/run/quiver/device-agent.sock", "unix socket the CSI node plugin asks on (made 0600)")
	f.StringVar(&root, "root", "/var/lib/quiver-csi/fuse", "the only directory under which FUSE mount points are made: the plugin's --state-dir/fuse")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// listenControl listens on the unix socket of a node-local service (0600),
// refusing a socket another one of who serves already.
func listenControl(socket, who string) (net.Listener, error) {
	if c, err := net.DialTimeout("unix", socket, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("%s: another %s is serving there", socket, who)
	}
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return nil, err
	}
	return server.ListenUnix(socket, "") // 0600
}

// serveControl serves h on ln until ctx ends (then stopping is called and
// the server closed) or serving fails.
func serveControl(ctx context.Context, ln net.Listener, h http.Handler, stopping func()) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopping()
	return srv.Close()
}
