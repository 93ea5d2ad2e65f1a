package backup

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// BlockID is the content address of a block: HMAC-SHA256 of its plaintext
// under the repository's id key. The zero BlockID stands for a block of
// zeros (never stored).
type BlockID [32]byte

func (id BlockID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id stands for a block of zeros.
func (id BlockID) IsZero() bool { return id == BlockID{} }

// Sealed block: nonce | AES-GCM(flag | payload), bound to the block's id.
const (
	blockRaw  = 0 // payload is the block
	blockZstd = 1 // payload is the block, zstd-compressed
)

func blockAAD(id BlockID) []byte { return append([]byte("block:"), id[:]...) }

// sealBlock compresses (when that saves at least 1/16) and encrypts p,
// bound to its id.
func (r *Repository) sealBlock(p []byte, id BlockID) ([]byte, error) {
	pt := make([]byte, 1, 1+len(p))
	pt[0] = blockZstd
	pt = r.enc.EncodeAll(p, pt)
	if len(pt)-1 >= len(p)-len(p)/16 {
		pt = append(pt[:1], p...)
		pt[0] = blockRaw
	}
	ns := r.aead.NonceSize()
	out := make([]byte, ns, ns+len(pt)+r.aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return nil, err
	}
	return r.aead.Seal(out, out[:ns], pt, blockAAD(id)), nil
}

// openBlock decrypts a sealed block (in place: data is overwritten) into
// dst (its capacity should be BlockSize) and returns it. The AEAD, under the
// repository's key and bound to the block's id, proves the block is the
// one stored under that id; check also recomputes its address from the
// plaintext (verify does: a proof that what was sealed was that block).
func (r *Repository) openBlock(data []byte, id BlockID, dst []byte, check bool) ([]byte, error) {
	ns := r.aead.NonceSize()
	if len(data) < ns+r.aead.Overhead()+1 {
		return nil, fmt.Errorf("block %s: too short: %w", id, ErrCorrupt)
	}
	pt, err := r.aead.Open(data[ns:ns], data[:ns], data[ns:], blockAAD(id))
	if err != nil {
		return nil, fmt.Errorf("block %s: authentication failed: %w", id, ErrCorrupt)
	}
	var p []byte
	switch pt[0] {
	case blockRaw:
		p = append(dst[:0], pt[1:]...)
	case blockZstd:
		p, err = r.dec.DecodeAll(pt[1:], dst[:0])
		if err != nil {
			return nil, fmt.Errorf("block %s: does not decompress: %w", id, ErrCorrupt)
		}
	default:
		return nil, fmt.Errorf("block %s: unknown encoding %d: %w", id, pt[0], ErrCorrupt)
	}
	if len(p) == 0 || len(p) > BlockSize {
		return nil, fmt.Errorf("block %s: %d bytes: %w", id, len(p), ErrCorrupt)
	}
	if check {
		if got := r.blockID(p); !hmac.Equal(got[:], id[:]) {
			return nil, fmt.Errorf("block %s: content does not match its address: %w", id, ErrCorrupt)
		}
	}
	return p, nil
}

// indexEntry places one block in its pack.
type indexEntry struct {
	ID     BlockID
	Offset uint32
	Length uint32
}

// maxBackupSize bounds the disks of one backup (its manifest's block ids
// are held in memory: 32 bytes a block).
const maxBackupSize = 8 << 40

const (
	indexMagic    = "QVX2"
	manifestMagic = "QVM2"
	entrySize     = 32 + 4 + 4
)

func encodeIndex(entries []indexEntry) []byte {
	p := make([]byte, 0, 8+len(entries)*entrySize)
	p = append(p, indexMagic...)
	p = binary.LittleEndian.AppendUint32(p, uint32(len(entries)))
	for _, e := range entries {
		p = append(p, e.ID[:]...)
		p = binary.LittleEndian.AppendUint32(p, e.Offset)
		p = binary.LittleEndian.AppendUint32(p, e.Length)
	}
	return p
}

var errFormat = errors.New("malformed")

func decodeIndex(p []byte) ([]indexEntry, error) {
	if len(p) < 8 || string(p[:4]) != indexMagic {
		return nil, errFormat
	}
	n := int(binary.LittleEndian.Uint32(p[4:]))
	p = p[8:]
	if len(p) != n*entrySize {
		return nil, errFormat
	}
	out := make([]indexEntry, n)
	for i := range out {
		e := p[i*entrySize:]
		copy(out[i].ID[:], e)
		out[i].Offset = binary.LittleEndian.Uint32(e[32:])
		out[i].Length = binary.LittleEndian.Uint32(e[36:])
		if out[i].Length == 0 || out[i].Length > 2*BlockSize {
			return nil, errFormat
		}
	}
	return out, nil
}

// encodeManifest: magic | uint32 header length | header (JSON) | for each
// disk, its runs: uvarint zero blocks, uvarint stored blocks, their ids;
// until the disk's blocks are all told.
func encodeManifest(m *Manifest) ([]byte, error) {
	hdr, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	size := 8 + len(hdr)
	for _, d := range m.Disks {
		size += len(d.Blocks) * 32
	}
	p := make([]byte, 0, size)
	p = append(p, manifestMagic...)
	p = binary.LittleEndian.AppendUint32(p, uint32(len(hdr)))
	p = append(p, hdr...)
	for _, d := range m.Disks {
		for i := 0; i < len(d.Blocks); {
			z := i
			for z < len(d.Blocks) && d.Blocks[z].IsZero() {
				z++
			}
			s := z
			for s < len(d.Blocks) && !d.Blocks[s].IsZero() {
				s++
			}
			p = binary.AppendUvarint(p, uint64(z-i))
			p = binary.AppendUvarint(p, uint64(s-z))
			for _, id := range d.Blocks[z:s] {
				p = append(p, id[:]...)
			}
			i = s
		}
	}
	return p, nil
}

func decodeManifest(p []byte) (*Manifest, error) {
	if len(p) < 8 || string(p[:4]) != manifestMagic {
		return nil, errFormat
	}
	n := int(binary.LittleEndian.Uint32(p[4:]))
	if n > len(p)-8 {
		return nil, errFormat
	}
	var m Manifest
	if err := json.Unmarshal(p[8:8+n], &m); err != nil {
		return nil, errFormat
	}
	p = p[8+n:]
	uvarint := func() (int64, error) {
		v, k := binary.Uvarint(p)
		if k <= 0 || v > 1<<40 {
			return 0, errFormat
		}
		p = p[k:]
		return int64(v), nil
	}
	var all int64
	for i := range m.Disks {
		d := &m.Disks[i]
		if d.Size < 0 || d.Size > maxBackupSize {
			return nil, errFormat
		}
		total := (d.Size + BlockSize - 1) / BlockSize
		if all += total; all > maxBackupSize/BlockSize {
			return nil, errFormat
		}
		d.Blocks = make([]BlockID, total)
		for at := int64(0); at < total; {
			z, err := uvarint()
			if err != nil {
				return nil, err
			}
			s, err := uvarint()
			if err != nil {
				return nil, err
			}
			if z+s == 0 || at+z+s > total || int64(len(p)) < s*32 {
				return nil, errFormat
			}
			at += z
			for range s {
				copy(d.Blocks[at][:], p)
				if d.Blocks[at].IsZero() {
					return nil, errFormat
				}
				p, at = p[32:], at+1
			}
		}
	}
	if len(p) != 0 {
		return nil, errFormat
	}
	return &m, nil
}
