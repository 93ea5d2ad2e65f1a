// Package blockdev makes an NBD export a block device on a node without the
// kernel's nbd module: nbdfuse serves the export as a file on a FUSE mount
// and a loop device over it is the block device (NbdfuseLoop). The
// processes and devices it starts must outlive whoever asked for them while
// a VM uses them, so they can be held by a device agent (Agent, `quiver
// device-agent`), a long-lived process of its own that the CSI node plugin
// asks over a unix socket (Client): a restart or upgrade of the plugin then
// leaves every device running.
//
// The CSI driver and the CLI import it.
//
// Imports from quiver: nothing.
package blockdev
