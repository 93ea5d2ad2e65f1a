// Package drtest runs DR between two quiver servers, each a process on
// loopback with its own pool (docs/dr.md): a site ships a VM's points to
// the other, which keeps them and promotes the last.
package drtest
