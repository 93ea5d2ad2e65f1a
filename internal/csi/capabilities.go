package csi

import (
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// accessKind is how a volume is presented on a node.
type accessKind int

const (
	// kindFilesystem: the volume's directory, every disk an image file.
	kindFilesystem accessKind = iota + 1
	// kindBlock: the primary disk as a block device.
	kindBlock
)

func (k accessKind) String() string {
	if k == kindBlock {
		return "block"
	}
	return "filesystem"
}

// supportedModes are the access modes quiver serves, in both access types.
// Multi-node writers are safe because quiver itself enforces a single
// writer per volume (attachments with epochs); KubeVirt live migration needs
// MULTI_NODE_MULTI_WRITER.
var supportedModes = map[csi.VolumeCapability_AccessMode_Mode]bool{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:        true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:   true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER: true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:  true,
	csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:    true,
	csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER:  true,
	csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:   true,
}

// readOnlyMode reports whether an access mode only reads.
func readOnlyMode(m csi.VolumeCapability_AccessMode_Mode) bool {
	return m == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY ||
		m == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// checkCapability checks one volume capability and returns its access kind.
// Filesystem mode publishes a directory of disk images: there is no
// filesystem to make, so a file system type is refused.
func checkCapability(c *csi.VolumeCapability) (accessKind, error) {
	if c == nil {
		return 0, fmt.Errorf("volume_capability is required: %w", ErrInvalid)
	}
	mode := c.GetAccessMode().GetMode()
	if !supportedModes[mode] {
		return 0, fmt.Errorf("access mode %s is not supported (want one of SINGLE_NODE_WRITER, SINGLE_NODE_READER_ONLY, "+
			"SINGLE_NODE_SINGLE_WRITER, SINGLE_NODE_MULTI_WRITER, MULTI_NODE_READER_ONLY, MULTI_NODE_SINGLE_WRITER, "+
			"MULTI_NODE_MULTI_WRITER): %w", mode, ErrInvalid)
	}
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
		return kindBlock, nil
	case *csi.VolumeCapability_Mount:
		if fs := t.Mount.GetFsType(); fs != "" {
			return 0, fmt.Errorf("fs_type %q is not supported: a Filesystem-mode quiver volume is a directory of disk images "+
				"(one <disk>.img per disk), not a filesystem to format; leave fsType empty or use volumeMode: Block: %w", fs, ErrInvalid)
		}
		return kindFilesystem, nil
	default:
		return 0, fmt.Errorf("volume_capability: access_type is required (block or mount): %w", ErrInvalid)
	}
}

// checkCapabilities checks every capability of a request.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return fmt.Errorf("volume_capabilities is required: %w", ErrInvalid)
	}
	for _, c := range caps {
		if _, err := checkCapability(c); err != nil {
			return err
		}
	}
	return nil
}
