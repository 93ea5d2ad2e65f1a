// Package identity is the generated Go code of the csi-addons identity service
// (identity.proto, transcribed from the csi-addons spec); regenerate it with
// make proto, never edit the *.pb.go files by hand.
//
// Imports from quiver: nothing.
package identity
