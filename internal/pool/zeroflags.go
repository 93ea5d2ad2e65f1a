package pool

// ZeroFlags modify Disk.Zero. The zero value writes zeros, keeps the range
// allocated, may be slow, and is durable only after a later Flush.
type ZeroFlags uint8

const (
	// ZeroMayTrim lets Zero deallocate the range instead of writing zeros
	// (NBD_CMD_WRITE_ZEROES without NBD_CMD_FLAG_NO_HOLE).
	ZeroMayTrim ZeroFlags = 1 << iota
	// ZeroFast makes Zero fail with ErrNotSupported where zeroing would be
	// no faster than writing zeros (NBD_CMD_FLAG_FAST_ZERO).
	ZeroFast
	// ZeroFUA makes the zeros durable when Zero returns (NBD_CMD_FLAG_FUA).
	ZeroFUA
)
