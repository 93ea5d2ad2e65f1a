package kubevirt

import "errors"

// Sentinels of the KubeVirt integration, shared by the hook and the webhook.
var (
	// ErrInvalid: an annotation, a VMI or a domain breaks a rule.
	ErrInvalid = errors.New("invalid")
	// ErrDuplicate: a disk name, serial or target is used twice.
	ErrDuplicate = errors.New("duplicate")
	// ErrMissingDisk: an annotation names a disk the volume lacks.
	ErrMissingDisk = errors.New("no such disk")
	// ErrUnsupported: a volume shape the integration does not handle
	// (a Block-mode PVC with extra disks).
	ErrUnsupported = errors.New("unsupported")
)
