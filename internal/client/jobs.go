package client

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

// startJob posts body to path with async=true and returns the job.
func (c *Client) startJob(ctx context.Context, path string, body any, opts ...CallOption) (api.Job, error) {
	var job api.Job
	if err := c.do(ctx, http.MethodPost, path, asyncQuery, body, &job, opts...); err != nil {
		return job, err
	}
	if job.ID == "" {
		return job, fmt.Errorf("POST %s%s: %w", api.Version, path, errNoJob)
	}
	return job, nil
}

// ListJobs lists running jobs and those that ended in the last minutes.
func (c *Client) ListJobs(ctx context.Context) ([]api.Job, error) {
	var list api.List[api.Job]
	err := c.do(ctx, http.MethodGet, "/jobs", nil, nil, &list)
	return list.Items, err
}

// GetJob returns one job with its progress.
func (c *Client) GetJob(ctx context.Context, id string) (api.Job, error) {
	var job api.Job
	p, err := segment("job", id)
	if err != nil {
		return job, err
	}
	err = c.do(ctx, http.MethodGet, "/jobs/"+p, nil, nil, &job)
	return job, err
}

// CancelJob asks the server to cancel a job and returns the job as it is
// then; the job ends soon after, in state cancelled (or in the state it
// reached first).
func (c *Client) CancelJob(ctx context.Context, id string) (api.Job, error) {
	var job api.Job
	p, err := segment("job", id)
	if err != nil {
		return job, err
	}
	err = c.do(ctx, http.MethodDelete, "/jobs/"+p, nil, nil, &job)
	return job, err
}

// DefaultPollInterval is WaitJob's interval when it is given none.
const DefaultPollInterval = 500 * time.Millisecond

// WaitJob polls a job every interval until it is no longer running, calling
// onProgress (when not nil) with each state it sees, the last one included.
//
// It returns the final job. A job that ended failed or cancelled also
// returns its error as an *Error with Status 0 (IsCancelled tells the
// second). When ctx ends first WaitJob returns the last job seen and
// ctx.Err(); the job keeps running on the server: cancel it with CancelJob
// if that is what the caller wants.
func (c *Client) WaitJob(ctx context.Context, id string, interval time.Duration, onProgress func(api.Job)) (api.Job, error) {
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var last api.Job
	for {
		job, err := c.GetJob(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return last, ctx.Err()
			}
			return last, fmt.Errorf("wait for job %s: %w", id, err)
		}
		last = job
		if onProgress != nil {
			onProgress(job)
		}
		switch job.State {
		case api.JobRunning:
		case api.JobSucceeded:
			return job, nil
		case api.JobFailed, api.JobCancelled:
			return job, jobError(job)
		default:
			return job, fmt.Errorf("job %s: unknown state %q", id, job.State)
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-ticker.C:
		}
	}
}
