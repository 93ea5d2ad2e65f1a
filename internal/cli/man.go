package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// manCommand writes a man page per command, generated from the command tree
// (`make man`, packagers). Hidden: people read the pages, not this.
func (a *app) manCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:    "man --dir DIR",
		Short:  "Write the man pages of every command into DIR (section 1)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true // reproducible pages: no date line
			header := &doc.GenManHeader{Title: "QUIVER", Section: "1", Source: "quiver", Manual: "quiver manual"}
			if err := doc.GenManTree(root, header, dir); err != nil {
				return fmt.Errorf("write man pages to %s: %w", dir, err)
			}
			return a.printDone(cmd.OutOrStdout(), "man pages written to %s", dir)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory for the pages (made if absent)")
	cmd.MarkFlagRequired("dir")
	return cmd
}
