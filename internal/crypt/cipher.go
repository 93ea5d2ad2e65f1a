package crypt

import (
	"crypto/aes"
	"fmt"

	"golang.org/x/crypto/xts"
)

// BlockSize is the unit of encryption: every 4 KiB block of a disk is one
// XTS data unit whose tweak is its block number (byte offset / BlockSize).
const BlockSize = 4096

// Cipher encrypts and decrypts the blocks of one disk (or of all disks of one
// VM: the tweak is the block number within a disk, so two disks under one
// data key are told apart only by their files, as in dm-crypt with one key).
// It is safe for concurrent use and allocates nothing per call.
type Cipher struct {
	x *xts.Cipher
}

// NewCipher makes the cipher of a data key: XTS-AES-256, whose 64 bytes are
// the data key's (the first 32 encrypt the data, the last 32 the tweak).
func NewCipher(key *DataKey) (*Cipher, error) {
	x, err := xts.NewCipher(aes.NewCipher, key.b[:])
	if err != nil {
		return nil, fmt.Errorf("xts-aes-256: %w", err)
	}
	return &Cipher{x: x}, nil
}

// EncryptAt encrypts buf in place as the blocks at byte offset off of the
// disk. off and len(buf) must be multiples of BlockSize.
func (c *Cipher) EncryptAt(buf []byte, off int64) error {
	if err := aligned(buf, off); err != nil {
		return fmt.Errorf("encrypt: %w", err)
	}
	n := uint64(off) / BlockSize
	for i := 0; i < len(buf); i += BlockSize {
		b := buf[i : i+BlockSize]
		c.x.Encrypt(b, b, n)
		n++
	}
	return nil
}

// DecryptAt decrypts buf in place as the blocks at byte offset off of the
// disk. off and len(buf) must be multiples of BlockSize.
func (c *Cipher) DecryptAt(buf []byte, off int64) error {
	if err := aligned(buf, off); err != nil {
		return fmt.Errorf("decrypt: %w", err)
	}
	n := uint64(off) / BlockSize
	for i := 0; i < len(buf); i += BlockSize {
		b := buf[i : i+BlockSize]
		c.x.Decrypt(b, b, n)
		n++
	}
	return nil
}

func aligned(buf []byte, off int64) error {
	switch {
	case off < 0 || off%BlockSize != 0:
		return fmt.Errorf("offset %d: %w", off, ErrUnaligned)
	case len(buf)%BlockSize != 0:
		return fmt.Errorf("length %d: %w", len(buf), ErrUnaligned)
	}
	return nil
}
