package cli

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/server"
)

func (a *app) serverCommand() *cobra.Command {
	cfg := server.Config{}
	var logLevel string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a storage node: open the pool, serve the API and the disks over NBD",
		Long: `Run a storage node: open the pool directory, serve the HTTP API and every
disk over NBD until interrupted.

One server at a time opens a pool: the second one fails, naming the PID of
the first. A new pool is made only in an empty (or absent) directory, or by
'quiver pool init DIR'; a directory that holds anything else but no
pool.json is refused, as is, with --expect-mount, a directory that is not a
mount point (the pool's filesystem is not mounted). A pool the server cannot
write (a read-only mount, or no write permission on the pool directory) is
served read-only. A volume whose files are damaged or lead outside the pool
is quarantined: listed as broken, not served, not touched.

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
			return server.Run(cmd.Context(), cfg)
		},
	}
	cmd.Flags().StringVar(&cfg.PoolDir, "pool", "./quiver-data", "pool directory (a new pool is made only in an empty or absent one)")
	cmd.Flags().BoolVar(&cfg.ExpectMount, "expect-mount", false,
		"refuse a pool directory that is not a mount point (its filesystem is not mounted)")
	cmd.Flags().StringVar(&cfg.APIAddr, "listen", api.DefaultAddr, "host:port of the HTTP API")
	cmd.Flags().StringVar(&cfg.NBDAddr, "nbd-listen", nbd.DefaultAddr, "host:port of the NBD server (empty: no TCP)")
	cmd.Flags().StringVar(&cfg.NBDSocket, "nbd-socket", "", "also serve NBD on this unix socket")
	cmd.Flags().BoolVar(&cfg.NBDRequireToken, "nbd-require-token", false,
		"refuse NBD exports without an attachment token (always on beyond loopback)")
	cmd.Flags().BoolVar(&cfg.Pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the API port")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}
