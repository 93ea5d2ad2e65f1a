// Command quiver is the storage server and its command-line client: see
// `quiver --help`.
//
// Imports from quiver: cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/quiverstorage/quiver/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:], cli.OSEnv())
	stop()
	os.Exit(code)
}
