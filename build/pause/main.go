// Command pause is the sandbox ("pause") container of the end-to-end test's
// Kubernetes: it holds a pod's namespaces open and does nothing else. PID 1
// of the pod, it reaps the orphans a shared PID namespace hands it and ends
// on SIGINT or SIGTERM. There is no registry to pull registry.k8s.io/pause
// from, so the test builds this one into an image of that name.
//
// Imports from quiver: nothing.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
