package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/client"
)

// defaultWatchInterval is how often --watch asks the server again.
const defaultWatchInterval = 2 * time.Second

// fetchFunc gets what a list or get command shows: the object (for the
// machine formats) and the table for people.
type fetchFunc func(ctx context.Context, c *client.Client, args []string) (obj any, table func(io.Writer) error, err error)

// getter makes cmd a list or get command that prints what fetch returns,
// once, or with --watch again each time it changes, until Ctrl-C, as
// kubectl get -w does. A change is a change of the object, not of its
// AGE column. fetch runs with the command's arguments. Ctrl-C ends a watch
// with success.
// volumeOrSelector are the arguments of a list of one volume's objects or
// of every volume's: one VOLUME or none, and not a VOLUME with a --selector.
func volumeOrSelector(selector *string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == 1 && *selector != "" {
			return fmt.Errorf("give a VOLUME or a --selector, not both")
		}
		return cobra.MaximumNArgs(1)(cmd, args)
	}
}

func (a *app) getter(cmd *cobra.Command, fetch fetchFunc) *cobra.Command {
	var watch bool
	var every time.Duration
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "after printing, watch for changes and print again each time (Ctrl-C ends)")
	cmd.Flags().DurationVar(&every, "watch-interval", defaultWatchInterval, "with --watch, how often to ask the server")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if watch && every <= 0 {
			return fmt.Errorf("--watch-interval %s: want a positive duration, e.g. 2s", every)
		}
		c, err := a.client()
		if err != nil {
			return err
		}
		ctx, out := cmd.Context(), cmd.OutOrStdout()
		var last []byte
		for n := 0; ; n++ {
			obj, table, err := fetch(ctx, c, args)
			if err != nil {
				return interrupted(ctx, err)
			}
			state, err := json.Marshal(obj)
			if err != nil {
				return err
			}
			if n == 0 || !bytes.Equal(state, last) {
				if n > 0 && a.forPeople() {
					fmt.Fprintln(out)
				}
				if err := a.show(out, obj, table); err != nil {
					return err
				}
				last = state
			}
			if !watch {
				return nil
			}
			select {
			case <-ctx.Done():
				return nil // Ctrl-C is how a watch ends, as with volume stats
			case <-time.After(every):
			}
		}
	}
	return cmd
}
