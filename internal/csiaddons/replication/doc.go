// Package replication is the generated Go code of the csi-addons replication service
// (replication.proto, transcribed from the csi-addons spec); regenerate it with
// make proto, never edit the *.pb.go files by hand.
//
// Imports from quiver: nothing.
package replication
