// Package pluginreg registers quiver's CSI node plugin with the kubelet, the
// job the node-driver-registrar sidecar does in other drivers.
//
// The kubelet watches its plugin directory (/var/lib/kubelet/plugins_registry)
// for sockets. For each one it calls the registration service
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1): GetInfo, which answers the
// plugin's kind, driver name, the CSI socket's path as the kubelet sees it and
// the versions it speaks; then NotifyRegistrationStatus, which says whether
// the kubelet took it. The kubelet forgets the plugin when the registration
// socket goes away, so the socket lives exactly as long as the node plugin
// serves: a restarted plugin registers again.
//
// Serving it in the node plugin itself spares a sidecar image (the
// registrar's module cannot be fetched by version from the Go module proxy)
// and ties registration to the process that answers CSI calls.
//
// Imports from quiver: nothing.
package pluginreg
