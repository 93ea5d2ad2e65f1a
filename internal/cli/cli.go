package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/tlscert"
)

// Exit codes of Execute.
const (
	ExitOK          = 0
	ExitError       = 1
	ExitInterrupted = 130 // as a shell reports a command ended by SIGINT
)

// Env is what a run of the command line sees of its process.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// Interactive says Stderr is a terminal: only then are progress bars drawn.
	Interactive bool
	// Redraw says Stdout is a terminal: `volume stats` then redraws its
	// table in place instead of printing a new one per interval.
	Redraw bool
	// Now is the clock for AGE columns and for the rates of `volume stats`;
	// nil means time.Now.
	Now func() time.Time
	// PollInterval is how often a job is polled; 0 means the client's default.
	PollInterval time.Duration
}

// OSEnv is the Env of this process.
func OSEnv() Env {
	return Env{
		Stdout:      os.Stdout,
		Stderr:      os.Stderr,
		Getenv:      os.Getenv,
		Interactive: term.IsTerminal(int(os.Stderr.Fd())),
		Redraw:      term.IsTerminal(int(os.Stdout.Fd())),
	}
}

// Environment variables that set the defaults of global flags.
const (
	envServer    = "QUIVER_SERVER"
	envTokenFile = "QUIVER_TOKEN_FILE"
	envCAFile    = "QUIVER_CA_FILE"
	envCertFile  = "QUIVER_CERT_FILE"
	envKeyFile   = "QUIVER_KEY_FILE"
)

// app is one run of the command line: the parsed global flags and the Env.
type app struct {
	env       Env
	server    string
	tokenFile string
	caFile    string
	certFile  string // client certificate, with keyFile: a credential instead of a token
	keyFile   string
	output    string
	// started is set once flags and arguments parsed and a command began,
	// to tell usage errors from failures of the command.
	started bool
}

// errInterrupted marks a command stopped by SIGINT or SIGTERM.
var errInterrupted = errors.New("interrupted")

// Execute runs the command line with args (without the program name) and
// returns the exit code. Cancelling ctx (SIGINT, SIGTERM) stops the command;
// a job it was waiting for is cancelled on the server.
func Execute(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	a := &app{env: env}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	a.report(cmd, err)
	if errors.Is(err, errInterrupted) || ctx.Err() != nil {
		return ExitInterrupted
	}
	return ExitError
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "quiver",
		Short: "Storage for virtual machines: one volume per VM, whole-VM snapshots and clones",
		Long: `quiver keeps every virtual disk of a VM in one volume, takes crash-consistent
snapshots of the whole VM and makes clones of it by the hundred.

Run "quiver server" on the storage node; every other command talks to it over
its HTTP API (--server, or QUIVER_SERVER).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			// Cobra checks required flags after this hook; check them here
			// so that every usage error comes before started is set.
			if err := cmd.ValidateRequiredFlags(); err != nil {
				return err
			}
			if err := checkOutput(a.output); err != nil {
				return err
			}
			a.started = true
			return nil
		},
	}
	defaultServer := a.env.Getenv(envServer)
	if defaultServer == "" {
		defaultServer = "http://" + api.DefaultAddr
	}
	flags := root.PersistentFlags()
	flags.StringVar(&a.server, "server", defaultServer,
		"URL of the quiver API: http://host:port, https://host:port or unix:///path/to.sock (env "+envServer+")")
	flags.StringVar(&a.tokenFile, "token-file", a.env.Getenv(envTokenFile),
		"file holding the API bearer token (env "+envTokenFile+")")
	flags.StringVar(&a.caFile, "ca-file", a.env.Getenv(envCAFile),
		"PEM file of the CAs an https:// --server's certificate must chain to (env "+envCAFile+")")
	flags.StringVar(&a.certFile, "cert-file", a.env.Getenv(envCertFile),
		"PEM client certificate for an https:// --server: mapped to a token (quiver token create --cert), it stands for one (env "+envCertFile+")")
	flags.StringVar(&a.keyFile, "key-file", a.env.Getenv(envKeyFile),
		"the PEM key of --cert-file (env "+envKeyFile+")")
	flags.StringVarP(&a.output, "output", "o", outputTable, "output format: "+strings.Join(outputFormats, ", "))

	root.AddGroup(
		&cobra.Group{ID: "node", Title: "Storage node:"},
		&cobra.Group{ID: "storage", Title: "Volumes and disks:"},
		&cobra.Group{ID: "data", Title: "Snapshots and clones:"},
	)
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add("node", a.serverCommand(), a.clusterCommand(), a.nodeCommand(), a.poolCommand(), a.jobCommand(), a.csiCommand(), a.deviceAgentCommand(), a.endpointCommand(),
		a.kubevirtHookCommand(), a.kubevirtWebhookCommand(), a.tokenCommand(), a.tenantCommand(), a.eventsCommand())
	add("storage", a.volumeCommand(), a.diskCommand(), a.attachCommand())
	add("data", a.snapshotCommand(), a.rollbackCommand(), a.cloneCommand(), a.backupCommand(), a.drCommand())
	root.AddCommand(a.versionCommand(), a.manCommand())
	a.addCompletions(root)
	requireSubcommands(root)
	return root
}

// requireSubcommands makes every command group of the tree (a command that
// only holds subcommands) refuse an unknown subcommand with an error that
// suggests the nearest names, as cobra does only at the top level; left
// alone, cobra prints a group's help for any word and exits 0, so a typo
// in a script looks like success. A group given no word prints its help.
func requireSubcommands(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		requireSubcommands(c)
	}
	if !cmd.HasSubCommands() || cmd.Runnable() {
		return
	}
	cmd.Args = knownSubcommand
	cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
}

// knownSubcommand refuses any word left after cobra found the deepest
// command: for a group it names no subcommand. It runs before the command
// starts, so the error is reported as a usage error.
func knownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, set only when it suggests itself
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return errors.New(msg)
}

// client builds the API client from the global flags.
func (a *app) client() (*client.Client, error) {
	return a.clientOf(a.server)
}

// clientOf builds an API client of the server at addr with the global
// flags' token and TLS settings.
func (a *app) clientOf(addr string) (*client.Client, error) {
	var opts []client.Option
	if a.tokenFile != "" {
		token, err := readToken(a.tokenFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithToken(token))
	}
	tc, err := a.tlsConfig()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, client.WithTLSConfig(tc))
	}
	return client.New(serverURL(addr), opts...)
}

// tlsConfig returns the client TLS configuration of --ca-file, --cert-file
// and --key-file, or nil when none is given (the system's roots, no
// client certificate).
func (a *app) tlsConfig() (*tls.Config, error) {
	if a.caFile == "" && a.certFile == "" && a.keyFile == "" {
		return nil, nil
	}
	if (a.certFile == "") != (a.keyFile == "") {
		return nil, fmt.Errorf("--cert-file and --key-file go together (%s, %s)", envCertFile, envKeyFile)
	}
	if a.certFile != "" && !strings.HasPrefix(serverURL(a.server), "https://") {
		return nil, fmt.Errorf("--cert-file: a client certificate needs an https:// --server, not %s", a.server)
	}
	return tlscert.ClientConfig(a.caFile, a.certFile, a.keyFile)
}

// serverURL accepts a bare host:port as http://host:port.
func serverURL(s string) string {
	if !strings.Contains(s, "://") {
		return "http://" + s
	}
	return s
}

// readToken reads a bearer token file: the token is its content, trimmed.
func readToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return token, nil
}

// report prints err and, where one helps, a hint of what to do.
func (a *app) report(cmd *cobra.Command, err error) {
	w := a.env.Stderr
	fmt.Fprintf(w, "error: %s\n", err)
	if !a.started {
		if cmd != nil {
			fmt.Fprintf(w, "hint: see '%s --help'\n", cmd.CommandPath())
		}
		return
	}
	if hint := a.hint(err); hint != "" {
		fmt.Fprintf(w, "hint: %s\n", hint)
	}
}

// hint says what to do about err, or "" when there is nothing useful to say.
func (a *app) hint(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED),
		strings.HasPrefix(serverURL(a.server), "unix:") && errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("is `quiver server` running at %s? Start it, or point --server (%s) at it", a.server, envServer)
	}
	switch client.Code(err) {
	case api.CodeUnauthorized:
		if a.certFile != "" {
			return fmt.Sprintf("the server takes the client certificate of --cert-file only when it is mapped to a token "+
				"(quiver token create --cert) and, with a token as well, of the same role and tenant; or pass --token-file (%s)", envTokenFile)
		}
		return fmt.Sprintf("the server wants its bearer token: pass --token-file (%s), or a client certificate mapped to a token (--cert-file, --key-file)", envTokenFile)
	case api.CodeBusy:
		return "another operation holds the volume; `quiver job list` shows what is running"
	case api.CodeNoSpace:
		return "the pool is full; `quiver pool info` shows its free space"
	case api.CodeHasSnapshots:
		return "`quiver snapshot list VOLUME` shows them; `quiver volume delete --recursive` deletes them with the volume"
	case api.CodeInUse:
		return "`quiver attach list VOLUME` shows who is attached and connected"
	case api.CodeNoCheckpoint:
		return "take a new snapshot as the base: every snapshot taken from now on is a checkpoint; the next backup from an older one is full"
	}
	return ""
}
