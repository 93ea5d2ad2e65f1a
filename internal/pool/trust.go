package pool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
)

// maxManifest bounds a manifest read from the pool (volume.json with
// MaxDisks disks and MaxLabels labels is a few tens of KiB).
const maxManifest = 4 << 20

// readManifest reads the manifest at rel (relative to the pool directory)
// through the pool's root, so a symbolic link anywhere on the way is refused,
// and decodes it into v refusing unknown fields and trailing data. It does
// not validate: each loader does.
func (p *Pool) readManifest(rel string, v any) error {
	return p.readDecoded(rel, func(data []byte) error { return decodeStrict(data, v) })
}

// writeJSON replaces the manifest at path (in the pool) atomically and
// durably (durable.WriteJSON), owner-only, every step resolved beneath the
// pool root: a link put in place of a directory of the pool is refused,
// never written through.
func (p *Pool) writeJSON(path string, v any) error {
	return hostile(durable.WriteJSON(p.fs, p.rel(path), v))
}

// decodeStrict decodes one JSON value, refusing unknown fields and anything
// after the value.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed JSON: data after the top-level value")
	}
	return nil
}

// hostile adds ErrHostile to the errors of beneath that mean a link.
func hostile(err error) error {
	if errors.Is(err, storage.ErrEscape) || errors.Is(err, storage.ErrHardLink) || errors.Is(err, storage.ErrNotRegular) {
		return fmt.Errorf("%w: %w", ErrHostile, err)
	}
	return err
}

// decodeVolumeManifest decodes and validates volume.json of the volume
// directory dir: every name passes the API's rules.
func decodeVolumeManifest(data []byte, dir string) (volumeManifest, error) {
	var m volumeManifest
	if err := decodeStrict(data, &m); err != nil {
		return m, err
	}
	return m, m.validate(dir)
}

func (m *volumeManifest) validate(dir string) error {
	if m.Kind != "Volume" || m.Version != manifestVersion {
		return fmt.Errorf("kind %q version %d: want kind Volume version %d", m.Kind, m.Version, manifestVersion)
	}
	if err := ValidateName("name", m.Name); err != nil {
		return err
	}
	if m.Name != dir {
		return fmt.Errorf("manifest names %q, its directory is %q", m.Name, dir)
	}
	if err := ValidateSize("capacity", m.Capacity); err != nil {
		return err
	}
	if err := ValidateLabels("labels", m.Labels); err != nil {
		return err
	}
	if err := ValidateDisks(m.Disks, m.Capacity); err != nil {
		return err
	}
	if m.Source != nil {
		if err := ValidateName("source.volume", m.Source.Volume); err != nil {
			return err
		}
		if m.Source.Snapshot != "" {
			if err := ValidateName("source.snapshot", m.Source.Snapshot); err != nil {
				return err
			}
		}
	}
	if m.QoS != nil {
		if err := m.QoS.Validate(); err != nil {
			return invalid("qos", "", err.Error())
		}
	}
	if m.Replicas < 0 || m.Replicas > MaxReplicas {
		return invalid("replicas", "", fmt.Sprintf("replicas %d: must be from 1 to %d", m.Replicas, MaxReplicas))
	}
	for _, h := range m.DirectAccess {
		if errs := validation.IsDNS1123Subdomain(h); len(errs) > 0 {
			return invalid("directAccess", h, "must be a DNS subdomain (a node name)")
		}
	}
	if m.BackupPolicy != nil {
		if err := ValidateBackupPolicy(*m.BackupPolicy); err != nil {
			return fmt.Errorf("backupPolicy: %w", err)
		}
	}
	if m.DRPolicy != nil {
		if err := ValidateDRPolicy(*m.DRPolicy); err != nil {
			return fmt.Errorf("drPolicy: %w", err)
		}
	}
	if m.Fill != nil {
		if err := ValidateFillSource(m.Fill.Source); err != nil {
			return err
		}
	}
	if m.Key != nil {
		if err := m.validateKey(); err != nil {
			return err
		}
	} else if m.Rekey != nil || m.KeyUID != "" || m.BackupKey != nil {
		return invalid("rekey", "", "a volume stored in the clear has no data key to rekey")
	}
	return ValidateVolumeTenant(m.Name, m.Tenant)
}

// decodeSnapshotManifest decodes and validates snapshot.json of the
// snapshot directory dir of volume vol.
func decodeSnapshotManifest(data []byte, vol, dir string) (snapshotManifest, error) {
	var s snapshotManifest
	if err := decodeStrict(data, &s); err != nil {
		return s, err
	}
	return s, s.validate(vol, dir)
}

func (s *snapshotManifest) validate(vol, dir string) error {
	if s.Kind != "Snapshot" || s.Version != manifestVersion {
		return fmt.Errorf("kind %q version %d: want kind Snapshot version %d", s.Kind, s.Version, manifestVersion)
	}
	if err := ValidateName("name", s.Name); err != nil {
		return err
	}
	if s.Name != dir {
		return fmt.Errorf("manifest names %q, its directory is %q", s.Name, dir)
	}
	if s.Volume != vol {
		return fmt.Errorf("manifest names volume %q, it is in volume %q", s.Volume, vol)
	}
	if err := ValidateSize("capacity", s.Capacity); err != nil {
		return err
	}
	return ValidateDisks(s.Disks, s.Capacity)
}

// decodeAttachments decodes and validates attachments.json.
func decodeAttachments(data []byte) (attachState, error) {
	var st attachState
	if err := decodeStrict(data, &st); err != nil {
		return st, err
	}
	return st, st.validate()
}

func (st *attachState) validate() error {
	if st.Kind != "Attachments" || st.Version != 1 {
		return fmt.Errorf("kind %q version %d: want kind Attachments version 1", st.Kind, st.Version)
	}
	if len(st.Attachments) > MaxAttachments {
		return fmt.Errorf("%d attachments, at most %d", len(st.Attachments), MaxAttachments)
	}
	ids := map[string]bool{}
	for i, r := range st.Attachments {
		f := fmt.Sprintf("attachments[%d]", i)
		if err := ValidateNodeName(r.Node); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if r.Mode != ModeReadWrite && r.Mode != ModeReadOnly {
			return invalid(f+".mode", r.Mode, `must be "rw" or "ro"`)
		}
		if r.ID == "" || len(r.ID) > 64 || ids[r.ID] {
			return invalid(f+".id", r.ID, "must be unique, 1 to 64 characters")
		}
		ids[r.ID] = true
		if len(r.Token) < 32 {
			return invalid(f+".token", "", "must be at least 32 characters")
		}
	}
	return nil
}

// decodeRollbackRecord decodes and validates rollback.json: the staging
// directory it names is one plain name under staging/.
func decodeRollbackRecord(data []byte) (rollbackRecord, error) {
	var r rollbackRecord
	if err := decodeStrict(data, &r); err != nil {
		return r, err
	}
	if err := ValidateName("snapshot", r.Snapshot); err != nil {
		return r, err
	}
	if err := validateStagingName(r.Staging); err != nil {
		return r, err
	}
	return r, nil
}

// validateStagingName accepts what newStaging makes: <kind>-<hex uid>.
func validateStagingName(n string) error {
	if n == "" || len(n) > 64 {
		return invalid("staging", n, "must be 1 to 64 characters")
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return invalid("staging", n, "must hold only lower-case letters, digits and '-'")
		}
	}
	return nil
}

// readDecoded reads the file at rel through the root (a regular file with
// one link, at most maxManifest bytes) and hands it to decode.
// fs.ErrNotExist passes through for callers to test.
func (p *Pool) readDecoded(rel string, decode func([]byte) error) error {
	f, err := p.fs.OpenRegular(rel, os.O_RDONLY)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return hostile(err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(io.NewSectionReader(f, 0, maxManifest+1), maxManifest+1))
	if err != nil {
		return err
	}
	if len(data) > maxManifest {
		return fmt.Errorf("%s: larger than %d bytes", rel, maxManifest)
	}
	if err := decode(data); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}
