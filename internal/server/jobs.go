package server

import (
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
)

// jobsFile is the job history in the pool's directory.
const jobsFile = "jobs.json"

// maxJobsFile bounds what is read of it.
const maxJobsFile = 4 << 20

// jobJournal keeps the job history in the pool (job.Journal), so that
// `quiver job list` after a restart shows what ended and what was cut
// short.
type jobJournal struct{ path string }

func (j jobJournal) Load() ([]byte, error) {
	// Never follow a link planted in the pool: read the file itself only.
	f, err := os.OpenFile(j.path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxJobsFile))
}

func (j jobJournal) Save(data []byte) error { return durable.WriteFile(j.path, data, 0o600) }

// newJobs returns the job manager of a server on p: with its history in
// the pool, unless the pool is read-only.
func newJobs(p *pool.Pool, log *slog.Logger) *job.Manager {
	if p.ReadOnly() {
		return job.NewManager()
	}
	return job.NewManagerWithJournal(jobJournal{path: filepath.Join(p.Dir(), jobsFile)}, func(err error) {
		log.Warn("job history", "err", err)
	})
}
