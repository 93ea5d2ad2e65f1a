package nbd

// Wire constants from the NBD protocol specification (doc/proto.md). Every
// multi-byte field on the wire is big-endian.

// Handshake ("Newstyle negotiation").
const (
	magicNBD         = 0x4e42444d41474943 // "NBDMAGIC"
	magicIHaveOpt    = 0x49484156454f5054 // "IHAVEOPT", also the option request magic
	magicOptionReply = 0x3e889045565a9

	flagFixedNewstyle = 1 << 0 // handshake flags, server
	flagNoZeroes      = 1 << 1

	clientFlagFixedNewstyle = 1 << 0 // client flags
	clientFlagNoZeroes      = 1 << 1
)

// Options ("Option types").
const (
	optExportName      = 1
	optAbort           = 2
	optList            = 3
	optStartTLS        = 5
	optInfo            = 6
	optGo              = 7
	optStructuredReply = 8
	optListMetaContext = 9
	optSetMetaContext  = 10
)

// Option reply types ("Option reply types").
const (
	repAck         = 1
	repServer      = 2
	repInfo        = 3
	repMetaContext = 4

	repFlagError     = 1 << 31
	repErrUnsup      = repFlagError | 1
	repErrPolicy     = repFlagError | 2
	repErrInvalid    = repFlagError | 3
	repErrPlatform   = repFlagError | 4
	repErrTLSReqd    = repFlagError | 5
	repErrUnknown    = repFlagError | 6
	repErrShutdown   = repFlagError | 7
	repErrBlockSize  = repFlagError | 8
	repErrTooBig     = repFlagError | 9
	repErrExtHdrReqd = repFlagError | 10
)

// Information types for NBD_OPT_INFO and NBD_OPT_GO.
const (
	infoExport      = 0
	infoName        = 1
	infoDescription = 2
	infoBlockSize   = 3
)

// Transmission flags.
const (
	tflagHasFlags        = 1 << 0
	tflagReadOnly        = 1 << 1
	tflagSendFlush       = 1 << 2
	tflagSendFUA         = 1 << 3
	tflagRotational      = 1 << 4
	tflagSendTrim        = 1 << 5
	tflagSendWriteZeroes = 1 << 6
	tflagSendDF          = 1 << 7
	tflagCanMultiConn    = 1 << 8
	tflagSendCache       = 1 << 10
	tflagSendFastZero    = 1 << 11
)

// Requests ("Request message").
const (
	magicRequest      = 0x25609513
	requestHeaderSize = 28
)

// Commands ("Request types").
const (
	cmdRead        = 0
	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdTrim        = 4
	cmdCache       = 5
	cmdWriteZeroes = 6
	cmdBlockStatus = 7
)

// Command flags.
const (
	cmdFlagFUA      = 1 << 0
	cmdFlagNoHole   = 1 << 1
	cmdFlagDF       = 1 << 2
	cmdFlagReqOne   = 1 << 3
	cmdFlagFastZero = 1 << 4
)

// Replies ("Simple reply message", "Structured reply chunk message").
const (
	magicSimpleReply     = 0x67446698
	magicStructuredReply = 0x668e33ef
	simpleReplySize      = 16
	structuredHeaderSize = 20

	replyFlagDone = 1 << 0

	replyTypeNone        = 0
	replyTypeOffsetData  = 1
	replyTypeOffsetHole  = 2
	replyTypeBlockStatus = 5
	replyTypeError       = 1<<15 | 1
)

// Error values ("Error values").
const (
	errPerm     = 1
	errIO       = 5
	errNoMem    = 12
	errInval    = 22
	errNoSpc    = 28
	errOverflow = 75
	errNotSup   = 95
	errShutdown = 108
)

// base:allocation flags ("Metadata contexts").
const (
	metaContextBaseAllocation = "base:allocation"
	stateHole                 = 1 << 0
	stateZero                 = 1 << 1
)

// Limits quiver applies and advertises (NBD_INFO_BLOCK_SIZE).
const (
	minBlockSize       = 1
	preferredBlockSize = 4096
	maxPayload         = 32 << 20 // largest READ or WRITE
	maxOptionLength    = 64 << 10 // longest option payload read during negotiation
	maxOptions         = 256      // options per connection before it is dropped (more per export listed: handshake.go)
	maxStringLength    = 4096     // export names and other strings
	maxExtents         = 1 << 16  // descriptors in one BLOCK_STATUS reply
	baseAllocationID   = 1        // our context id for base:allocation
)
