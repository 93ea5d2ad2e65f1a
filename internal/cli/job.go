package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/quantity"
)

func (a *app) jobCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "job",
		Aliases: []string{"jobs"},
		Short:   "List, show and cancel long operations",
	}
	cmd.AddCommand(
		a.getter(&cobra.Command{
			Use:     "list",
			Aliases: []string{"ls"},
			Short:   "List running jobs and those that ended in the last minutes",
			Args:    cobra.NoArgs,
		}, func(ctx context.Context, c *client.Client, _ []string) (any, func(io.Writer) error, error) {
			jobs, err := c.ListJobs(ctx)
			return api.List[api.Job]{Items: nonNil(jobs)}, a.jobTable(jobs...), err
		}),
		a.getter(&cobra.Command{
			Use:   "get ID",
			Short: "Show a job with its progress",
			Args:  cobra.ExactArgs(1),
		}, func(ctx context.Context, c *client.Client, args []string) (any, func(io.Writer) error, error) {
			job, err := c.GetJob(ctx, args[0])
			return job, a.jobDetail(job), err
		}),
		&cobra.Command{
			Use:   "cancel ID",
			Short: "Ask the server to cancel a running job",
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := a.client()
				if err != nil {
					return err
				}
				job, err := c.CancelJob(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return a.show(cmd.OutOrStdout(), job, a.jobTable(job))
			},
		},
	)
	return cmd
}

// jobTable prints jobs as a table.
func (a *app) jobTable(jobs ...api.Job) func(io.Writer) error {
	return func(w io.Writer) error {
		now := a.env.Now()
		header := []string{"ID", "KIND", "TARGET", "STATE", "PROGRESS", "AGE"}
		if a.wide() {
			header = append(header, "DURATION", "ERROR")
		}
		t := newTable(w, header...)
		for _, j := range jobs {
			row := []string{j.ID, j.Kind, j.Target, j.State, progress(j), age(now, j.StartedAt)}
			if a.wide() {
				took, msg := "-", none
				if !j.EndedAt.IsZero() {
					took = j.EndedAt.Sub(j.StartedAt).Round(time.Millisecond).String()
				}
				if j.Error != nil {
					msg = j.Error.Message
				}
				row = append(row, took, msg)
			}
			t.row(row...)
		}
		return t.flush()
	}
}

// jobDetail prints one job.
func (a *app) jobDetail(j api.Job) func(io.Writer) error {
	return func(w io.Writer) error {
		now := a.env.Now()
		f := newFields(w)
		f.add("ID", j.ID)
		f.add("Kind", j.Kind)
		f.add("Target", j.Target)
		f.add("State", j.State)
		f.add("Progress", progress(j))
		if j.Error != nil {
			f.add("Error", fmt.Sprintf("%s (%s)", j.Error.Message, j.Error.Code))
		}
		if len(j.Result) > 0 {
			f.add("Result", strings.Join(j.Result, ", "))
		}
		f.add("Started", timestamp(now, j.StartedAt))
		if !j.EndedAt.IsZero() {
			f.add("Ended", fmt.Sprintf("%s (took %s)", timestamp(now, j.EndedAt), j.EndedAt.Sub(j.StartedAt).Round(time.Millisecond)))
		}
		return f.flush()
	}
}

// progress renders a job's progress: "45% 18Gi/40Gi, 12/500 items".
func progress(j api.Job) string {
	var parts []string
	if j.BytesTotal > 0 {
		parts = append(parts, fmt.Sprintf("%d%% %s/%s", j.BytesDone*100/j.BytesTotal,
			quantity.Format(j.BytesDone), quantity.Format(j.BytesTotal)))
	}
	if j.ItemsTotal > 0 {
		parts = append(parts, fmt.Sprintf("%d/%d items", j.ItemsDone, j.ItemsTotal))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// cancelTimeout bounds the request that cancels a job after an interrupt.
const cancelTimeout = 10 * time.Second

// wait follows a job the command started until it ends, drawing a progress
// bar on a terminal. When ctx ends first (Ctrl-C) it cancels the job on
// the server and returns errInterrupted.
func (a *app) wait(ctx context.Context, c *client.Client, job api.Job) (api.Job, error) {
	bar := a.newBar(job)
	final, err := c.WaitJob(ctx, job.ID, a.env.PollInterval, bar.update)
	bar.finish()
	if err == nil || ctx.Err() == nil {
		return final, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
	defer cancel()
	if _, cerr := c.CancelJob(cctx, job.ID); cerr != nil && !client.IsNotFound(cerr) {
		return final, fmt.Errorf("%w; cancelling job %s failed too (%v): run `quiver job cancel %s`",
			errInterrupted, job.ID, cerr, job.ID)
	}
	return final, fmt.Errorf("%w: asked the server to cancel job %s (%s %s)", errInterrupted, job.ID, job.Kind, job.Target)
}

// jobBar draws a job's progress on stderr; the zero value draws nothing.
type jobBar struct {
	bar   *progressbar.ProgressBar
	label string
	max   int64
}

func (a *app) newBar(job api.Job) *jobBar {
	if !a.env.Interactive {
		return &jobBar{}
	}
	b := &jobBar{label: job.Kind + " " + job.Target, max: -1}
	b.bar = progressbar.NewOptions64(-1,
		progressbar.OptionSetWriter(a.env.Stderr),
		progressbar.OptionSetDescription(b.label),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionUseIECUnits(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetPredictTime(true),
	)
	return b
}

func (b *jobBar) update(j api.Job) {
	if b.bar == nil {
		return
	}
	if j.BytesTotal > 0 && j.BytesTotal != b.max {
		b.max = j.BytesTotal
		b.bar.ChangeMax64(j.BytesTotal)
	}
	if j.ItemsTotal > 0 {
		b.bar.Describe(fmt.Sprintf("%s [%d/%d]", b.label, j.ItemsDone, j.ItemsTotal))
	}
	_ = b.bar.Set64(j.BytesDone)
}

// finish wipes the bar, so that what is printed next starts a clean line.
func (b *jobBar) finish() {
	if b.bar != nil {
		_ = b.bar.Clear()
	}
}
