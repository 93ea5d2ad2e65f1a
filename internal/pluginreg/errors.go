package pluginreg

import "errors"

var (
	// ErrInvalid: the configuration cannot be served (a bad path or name).
	ErrInvalid = errors.New("invalid plugin registration")
	// ErrRefused: the kubelet answered that it did not register the plugin.
	ErrRefused = errors.New("the kubelet refused the plugin")
)
