package server

import (
	"io"
	"log/slog"
	"os"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/storage"
)

// jobsFile is the job history, in the pool's directory.
const jobsFile = "jobs.json"

// maxJobsFile bounds what is read of it.
const maxJobsFile = 4 << 20

// jobJournal keeps the job history in the pool (job.Journal), through the
// storage layer (never following a link planted in the pool), so that
// `quiver job list` after a restart shows what ended and what was cut
// short.
type jobJournal struct{ fs storage.FS }

func (j jobJournal) Load() ([]byte, error) {
	f, err := j.fs.OpenRegular(jobsFile, os.O_RDONLY)
	if storage.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(io.NewSectionReader(f, 0, maxJobsFile), maxJobsFile))
}

func (j jobJournal) Save(data []byte) error { return durable.WriteFile(j.fs, jobsFile, data, 0o600) }

// newJobs returns the job manager of a server on p: with its history in
// the pool, unless the pool is read-only.
func newJobs(p *pool.Pool, log *slog.Logger) *job.Manager {
	if p.ReadOnly() {
		return job.NewManager()
	}
	return job.NewManagerWithJournal(jobJournal{fs: p.FS()}, func(err error) {
		log.Warn("job history", "err", err)
	})
}
