package powercut

import (
	"context"
	"fmt"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// Rekeys of encrypted volumes (issue 35, acceptance 3: a power cut at a
// random point of a deep rekey leaves every block readable with the right
// key). Half of the volumes the workload creates are encrypted, and so are
// their clones. A deep rekey re-encrypts every block under a new data key,
// one step of 256 KiB (internal/pool, rekey.go: rekeyStep; four per disk
// of an encrypted volume here, encDiskBlocks) at a time, journaled, while
// the write bursts go on; a cut leaves a volume with blocks under either
// key, and the next boot's verification reads every block through NBD. A
// shallow rekey only re-wraps the data key.

// rekeyRate is the slowest pace of the workload's deep rekeys, in bytes
// per second: two steps a second, so a rekey of a volume of two disks
// (encDiskBlocks) lasts four seconds, twice the workload's longest window,
// and is often running at the cut. Each rekey runs at this rate times 1,
// 2, 4 or 8 (up to 4 MiB/s): the faster ones finish before the cut more
// often, and pack their steps closer.
const rekeyRate = 512 << 10

// rekeyPhase is where a deep rekey of a volume stands.
type rekeyPhase int

const (
	rekeyNone        rekeyPhase = iota // none in progress
	rekeyRunning                       // its job runs
	rekeyInterrupted                   // a cut stopped it: start it again to finish it
)

// rekeyState asks quiver how the deep rekey of v stands, and brings the
// model up to it: a job that ended must have succeeded.
func (l *lane) rekeyState(ctx context.Context, v string) (rekeyPhase, error) {
	vm := l.model.vols[v]
	if !vm.rekey {
		return rekeyNone, nil
	}
	if vm.rekeyJob != "" {
		j, err := l.mc.api.GetJob(ctx, vm.rekeyJob)
		if err != nil {
			return 0, fmt.Errorf("deep rekey of %s: job %s: %w", v, vm.rekeyJob, err)
		}
		switch j.State {
		case api.JobRunning:
			return rekeyRunning, nil
		case api.JobSucceeded:
			vm.rekey, vm.rekeyJob = false, ""
			l.model.note("deep rekey of %s finished", v)
			l.stats.rekeysFinished++
			return rekeyNone, nil
		}
		msg := ""
		if j.Error != nil {
			msg = j.Error.Message
		}
		return 0, fmt.Errorf("deep rekey of %s: job %s ended %s with no cut since it started: %s", v, j.ID, j.State, msg)
	}
	got, err := l.mc.api.GetVolume(ctx, v)
	if err != nil {
		return 0, err
	}
	if got.Encryption == nil || got.Encryption.Rekey == nil {
		vm.rekey = false
		return rekeyNone, nil
	}
	return rekeyInterrupted, nil
}

// encryptedVolume picks an encrypted volume the test can write, one whose
// deep rekey a cut interrupted first; "" when there is none.
func (l *lane) encryptedVolume() string {
	var cands []string
	for _, v := range l.model.volNames() {
		vm := l.model.vols[v]
		if !vm.encrypted || vm.token == "" {
			continue
		}
		if vm.rekey && vm.rekeyJob == "" {
			return v
		}
		cands = append(cands, v)
	}
	if len(cands) == 0 {
		return ""
	}
	return cands[l.rng.IntN(len(cands))]
}

// deepRekey starts a deep rekey of an encrypted volume, or starts again
// one that a cut interrupted (it goes on from the marks its journals
// recorded), at rekeyRate; nothing while one runs. A deep rekey refuses a
// volume with snapshots, so they are deleted first.
func (l *lane) deepRekey(ctx context.Context) error {
	if v := l.encryptedVolume(); v != "" {
		return l.rekeyDeep(ctx, v)
	}
	return nil
}

// resumeRekeys starts again, at the start of a workload, three in four of
// the deep rekeys that the cut interrupted: their steps then run from the
// first instants after a boot, where the cut may land too; the others stay
// interrupted for a while, the volume's disks under both keys with no job.
func (l *lane) resumeRekeys(ctx context.Context) error {
	for _, v := range l.model.volNames() {
		vm := l.model.vols[v]
		if vm.rekey && vm.rekeyJob == "" && vm.token != "" && l.rng.IntN(4) != 0 {
			if err := l.rekeyDeep(ctx, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// rekeyDeep starts a deep rekey of encrypted volume v, or resumes one.
func (l *lane) rekeyDeep(ctx context.Context, v string) error {
	vm := l.model.vols[v]
	phase, err := l.rekeyState(ctx, v)
	if err != nil || phase == rekeyRunning {
		return err
	}
	for _, s := range sortedKeys(vm.snaps) {
		if err := l.deleteSnapshot(ctx, v, s); err != nil {
			return err
		}
	}
	what := "deep rekey of " + v
	if phase == rekeyInterrupted {
		what = "resume the " + what
		l.stats.rekeysResumed++
	} else {
		l.stats.rekeysStarted++
	}
	l.begin(&pendingOp{what: what, vol: v})
	vm.rekey = true // it may run from now on
	rate := int64(rekeyRate) << l.rng.IntN(4)
	l.model.note("%s at %d KiB/s", what, rate>>10)
	j, err := l.mc.api.StartRekey(ctx, v, api.RekeySpec{Deep: true, Rate: rate})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	vm.rekeyJob = j.ID
	// The job records the rekey in the manifest as it starts: until then
	// quiver would take a snapshot, and the job would then refuse the
	// volume for it.
	for {
		got, err := l.mc.api.GetVolume(ctx, v)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if got.Encryption != nil && got.Encryption.Rekey != nil {
			break
		}
		phase, err := l.rekeyState(ctx, v)
		if err != nil {
			return err
		}
		if phase == rekeyNone { // done already
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.done()
	return nil
}

// shallowRekey wraps the data key of an encrypted volume under a new KEK;
// quiver refuses it while a deep rekey of the volume is in progress.
func (l *lane) shallowRekey(ctx context.Context) error {
	v := l.encryptedVolume()
	if v == "" {
		return nil
	}
	l.begin(&pendingOp{what: "shallow rekey of " + v, vol: v})
	got, err := l.mc.api.Rekey(ctx, v, api.RekeySpec{})
	if err != nil {
		if l.refused(v, err) {
			return nil
		}
		return fmt.Errorf("shallow rekey of %s: %w", v, err)
	}
	if got.Encryption == nil {
		return fmt.Errorf("shallow rekey of %s: the reply says the volume is not encrypted", v)
	}
	l.stats.shallowRekeys++
	l.done()
	return nil
}

// refused says whether err is quiver's 409 Busy to the operation in flight
// on volume v while a deep rekey of v may be in progress: snapshots, clones
// and disk changes are refused then, and the rekey job holds the volume's
// control lock for a moment as it starts and ends. The operation did not
// happen. Any other refusal is the workload's failure.
func (l *lane) refused(v string, err error) bool {
	vm := l.model.vols[v]
	if vm == nil || !vm.rekey || !client.IsBusy(err) {
		return false
	}
	l.model.note("refused, %s in a deep rekey: %s: %v", v, l.model.pending.what, err)
	l.model.pending = nil
	l.stats.ops-- // counted apart: "x of y operations" stays those completed of those sent to happen
	l.stats.refusedInRekey++
	return true
}

// verifyEncryption checks after a boot that volume name is encrypted as
// the model says, and that a deep rekey in progress is one the workload
// started; it brings the model up to what it found and reports whether a
// deep rekey of the volume is in progress (the cut landed in it), and
// whether its disks hold blocks under both keys by its progress.
func (l *lane) verifyEncryption(name string, v api.Volume) (inRekey, mixed bool, err error) {
	vm := l.model.vols[name]
	if (v.Encryption != nil) != vm.encrypted {
		return false, false, fmt.Errorf("encrypted %v, want %v", v.Encryption != nil, vm.encrypted)
	}
	vm.rekeyJob = ""
	if v.Encryption == nil || v.Encryption.Rekey == nil {
		if vm.rekey {
			l.stats.rekeysFinished++ // before the cut (or a start in flight at the cut never happened)
		}
		vm.rekey = false
		return false, false, nil
	}
	rk := v.Encryption.Rekey
	if !vm.rekey {
		return false, false, fmt.Errorf("a deep rekey is in progress (%d of %d bytes under the new key), but none was started", rk.DoneBytes, rk.TotalBytes)
	}
	l.model.note("boot: %s in a deep rekey, %d of %d bytes under the new key", name, rk.DoneBytes, rk.TotalBytes)
	return true, rk.DoneBytes > 0 && rk.DoneBytes < rk.TotalBytes, nil
}
