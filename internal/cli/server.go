package cli

import (
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/server"
)

func (a *app) serverCommand() *cobra.Command {
	cfg := server.Config{}
	var logLevel, readyFile string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a storage node: open the pool, serve the API and the disks over NBD",
		Long: `Run a storage node: open (or create) the pool directory, serve the HTTP API
and every disk over NBD until interrupted.

NBD exports are <volume>/<disk> (read-write) and <volume>@<snapshot>/<disk>
(read-only), e.g. nbd://127.0.0.1:10809/web01/root. Clients of an attachment
(quiver attach create) add its token: <volume>/<disk>/<token>.

Everything listens on loopback by default. To serve the API on another
address, give the server a bearer token with --token-file; clients pass the
same file. NBD on another address requires an attachment token in every export
name (as --nbd-require-token does on loopback).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
			}
			cfg.TokenFile = a.tokenFile
			cfg.Logger = slog.New(slog.NewTextHandler(a.env.Stderr, &slog.HandlerOptions{Level: level}))
			if readyFile != "" {
				cfg.Ready = writeReadyFile(readyFile, cfg.NBDSocket, cfg.Logger)
			}
			return server.Run(cmd.Context(), cfg)
		},
	}
	cmd.Flags().StringVar(&cfg.PoolDir, "pool", "./quiver-data", "pool directory, created on first start")
	cmd.Flags().StringVar(&cfg.APIAddr, "listen", api.DefaultAddr, "host:port of the HTTP API")
	cmd.Flags().StringVar(&cfg.NBDAddr, "nbd-listen", nbd.DefaultAddr, "host:port of the NBD server (empty: no TCP)")
	cmd.Flags().StringVar(&cfg.NBDSocket, "nbd-socket", "", "also serve NBD on this unix socket")
	cmd.Flags().BoolVar(&cfg.NBDRequireToken, "nbd-require-token", false,
		"refuse NBD exports without an attachment token (always on beyond loopback)")
	cmd.Flags().BoolVar(&cfg.Pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the API port")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(&readyFile, "ready-file", "",
		"once serving, write the bound addresses here as JSON (for port 0 in scripts and tests)")
	return cmd
}

// writeReadyFile returns a server.Config.Ready that writes path (api.ReadyFile)
// atomically, so a reader sees no file or a whole one. A failure is logged:
// the server is up and serving either way.
func writeReadyFile(path, socket string, log *slog.Logger) func(apiAddr, nbdAddr net.Addr) {
	return func(apiAddr, nbdAddr net.Addr) {
		r := api.ReadyFile{PID: os.Getpid(), API: apiAddr.String(), NBDSocket: socket}
		if nbdAddr != nil {
			r.NBD = nbdAddr.String()
		}
		if err := durable.WriteJSON(path, r); err != nil {
			log.Error("write ready file", "path", path, "err", err)
		}
	}
}
