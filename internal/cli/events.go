package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// defaultFollowInterval is how often `events --follow` asks for new events.
const defaultFollowInterval = time.Second

func (a *app) eventsCommand() *cobra.Command {
	var since string
	var follow bool
	var limit int
	cmd := &cobra.Command{
		Use:   "events [--since DURATION|TIME] [--follow]",
		Short: "Show the node's audit log: every change asked of the API and every refused credential",
		Long: `Show the audit log of the node --server names: who (token, role, tenant,
client certificate, address), what (method, route, names) and the result
(status, error code) of every request that changes something and of every
request refused for its credential, oldest first (docs/security.md, "Audit log").

An admin or a monitor token reads every event; a tenant's token only those of
its tenant's tokens. --since takes a duration (1h: the last hour) or a time
(2026-03-01T12:00:00Z). --follow prints new events as they come, until
interrupted; with -o json it prints one event per line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := client.EventQuery{Limit: limit}
			if since != "" {
				t, err := parseSince(since, a.env.Now())
				if err != nil {
					return err
				}
				q.Since = t
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx, out := cmd.Context(), cmd.OutOrStdout()
			evs, err := c.ListEvents(ctx, q)
			if err != nil {
				return err
			}
			if !follow {
				return a.show(out, api.List[api.Event]{Items: nonNil(evs)}, eventTable(evs, true))
			}
			interval := a.env.PollInterval
			if interval <= 0 {
				interval = defaultFollowInterval
			}
			header := true
			for {
				if err := a.printEvents(out, evs, header); err != nil {
					return err
				}
				header = header && len(evs) == 0
				if len(evs) > 0 {
					q.After, q.Since = evs[len(evs)-1].Seq, time.Time{}
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(interval):
				}
				if evs, err = c.ListEvents(ctx, q); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&since, "since", "", "only events from this long ago (1h, 30m) or from this time (RFC 3339)")
	f.BoolVarP(&follow, "follow", "f", false, "print new events as they come, until interrupted")
	f.IntVar(&limit, "limit", 0, "at most the last N events (default: the server's bound, 10000)")
	return cmd
}

// printEvents prints one batch of a followed log: table rows (the header
// with the first batch that has events), or one JSON or YAML object each.
func (a *app) printEvents(w io.Writer, evs []api.Event, header bool) error {
	if a.forPeople() {
		if len(evs) == 0 {
			return nil
		}
		return eventTable(evs, header)(w)
	}
	for _, ev := range evs {
		if a.output == outputJSON {
			b, err := json.Marshal(ev)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(w, "%s\n", b); err != nil {
				return err
			}
			continue
		}
		if err := a.printObject(w, ev); err != nil {
			return err
		}
	}
	return nil
}

// parseSince reads --since: a duration back from now, or a time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want a duration (1h, 30m) or a time in RFC 3339 (2026-03-01T12:00:00Z)", s)
}

func eventTable(evs []api.Event, header bool) func(io.Writer) error {
	return func(w io.Writer) error {
		t := &table{tw: tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)}
		if header {
			t = newTable(w, "SEQ", "TIME", "WHO", "ROLE", "TENANT", "REQUEST", "NAMES", "RESULT")
		}
		for _, ev := range evs {
			who := ev.Who.TokenID
			if ev.Who.Cert != "" {
				who = strings.TrimPrefix(who+" cert "+ev.Who.Cert, " ")
			}
			if who == "" {
				who = "-"
			}
			if ev.Who.Remote != "" {
				who += " from " + ev.Who.Remote
			}
			req := ev.Route
			if req == "" {
				req = ev.Method + " (no route)"
			}
			result := strconv.Itoa(ev.Status)
			if ev.Code != "" {
				result += " " + ev.Code
			}
			t.row(strconv.FormatInt(ev.Seq, 10), ev.Time.UTC().Format(time.RFC3339), who, dash(ev.Who.Role),
				dash(ev.Who.Tenant), req, dash(formatNames(ev.Names)), result)
		}
		return t.flush()
	}
}

func formatNames(names map[string]string) string {
	keys := make([]string, 0, len(names))
	for k := range names {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + names[k]
	}
	return strings.Join(parts, ",")
}
