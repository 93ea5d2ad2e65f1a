package cli

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/server"
)

func (a *app) serverCommand() *cobra.Command {
	cfg := server.Config{}
	var logLevel string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a storage node: open the pool and serve the API",
		Long: `Run a storage node: open (or create) the pool directory and serve the HTTP
API until interrupted.

The API listens on loopback by default. To listen on another address, give the
server a bearer token with --token-file; clients pass the same file.`,
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
	cmd.Flags().StringVar(&cfg.PoolDir, "pool", "./quiver-data", "pool directory, created on first start")
	cmd.Flags().StringVar(&cfg.APIAddr, "listen", api.DefaultAddr, "host:port of the HTTP API")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}
