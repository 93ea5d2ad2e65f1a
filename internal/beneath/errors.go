package beneath

import "errors"

// Sentinels, tested with errors.Is.
var (
	// ErrEscape refuses a path that is absolute, climbs with "..", or
	// passes through a symbolic link.
	ErrEscape = errors.New("path leaves the root or passes through a symbolic link")
	// ErrNotRegular refuses a file that is not a regular file where one is
	// required.
	ErrNotRegular = errors.New("not a regular file")
	// ErrHardLink refuses a regular file with more than one name (st_nlink
	// > 1): another name may be outside the root.
	ErrHardLink = errors.New("file has more than one hard link")
)
