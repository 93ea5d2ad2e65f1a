package cli

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/buildinfo"
)

// versions is the answer of `quiver version`: this binary's build, and the
// server's when it was reached.
type versions struct {
	Client api.BuildInfo  `json:"client"`
	Server *api.BuildInfo `json:"server,omitempty"`
	// ServerError says why the server's version is missing.
	ServerError string `json:"serverError,omitempty"`
}

func (a *app) versionCommand() *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of this binary and of the server it talks to",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := versions{Client: buildinfo.Get()}
			if !clientOnly {
				c, err := a.client()
				if err == nil {
					var v api.BuildInfo
					if v, err = c.Version(cmd.Context()); err == nil {
						out.Server = &v
					}
				}
				if err != nil {
					out.ServerError = err.Error()
				}
			}
			return a.show(cmd.OutOrStdout(), out, func(w io.Writer) error {
				f := newFields(w)
				addBuild(f, "Client", out.Client)
				switch {
				case out.Server != nil:
					addBuild(f, "Server", *out.Server)
				case !clientOnly:
					f.add("Server", "unreachable: "+out.ServerError)
				}
				return f.flush()
			})
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print only this binary's version; do not ask the server")
	return cmd
}

// addBuild adds one build as "<who> version:" lines.
func addBuild(f *fields, who string, b api.BuildInfo) {
	commit := b.Commit
	switch {
	case commit == "":
		commit = "unknown"
	case b.Modified:
		commit += " (modified)"
	}
	f.add(who+" version", b.Version)
	f.add(who+" commit", commit)
	f.add(who+" go", b.GoVersion+" "+b.Platform)
}
