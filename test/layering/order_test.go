package layering

import (
	"strings"
	"testing"
)

// layers are quiver's packages from the top (the binary) down to the
// ground (wire types and leaf helpers), as the README's architecture
// picture draws them: a package imports only packages of layers below its
// own, never one of its own layer or above. A package missing here fails the
// test: place it.
var layers = [][]string{
	{"cmd/quiver", "build/pause"},
	{"cli"},    // the command line: client and server sides
	{"server"}, // wiring: builds the parts and runs them
	{"apiserver", "console", "csi", "pluginreg", // transports and front ends: HTTP API, web console, CSI, kubelet registration, KubeVirt hooks
		"kubevirt/hook", "kubevirt/webhook"},
	{"replicated", "endpoint"}, // cluster domain: the replicated volume on a node; the compute node's endpoint
	{"forward"},                // NBD forwarding to the primary of the moment
	{"nbd"},                    // the NBD server
	{"cluster", "replica", "auth", "metrics", "backup", "dr"}, // cluster state, replication protocol, tokens, metrics, backup, DR
	{"pool", "job", "ova", "imageconv", "consistency", "audit", // the single node's domain; the audit log
		"crypt/keyfile", "crypt/kmip"}, // key providers
	{"qos", "durable", "faultio", "storage/crashfs", "crypt"}, // I/O budgets, durable metadata, storage twins, encryption at rest
	{"storage"},          // the only package that calls the kernel for the pool
	{"fscap", "beneath"}, // filesystem capabilities, RESOLVE_BENEATH opens
	{"buildinfo", "client", "blockdev", "kubevirt/hookapi/info", "kubevirt/hookapi/v1alpha2", "kubevirt/hookapi/v1alpha3",
		"csiaddons/identity", "csiaddons/replication"},
	{"api", "quantity", "connlimit", "tlscert", "nbdclient", "history", "kubevirt", "objstore"}, // wire types and leaves; object stores
}

// testSupport are packages for tests only: they may import anything, and
// nothing but another test-support package may import them.
var testSupport = map[string]bool{"testfs": true, "testguest": true, "testserver": true, "testnet": true, "csi/csitest": true,
	"csi/sanitytest": true, "tlscert/certtest": true, "tests3": true, "crypt/kmip/kmiptest": true}

// TestLayerOrder checks the direction of every import between quiver's
// packages against layers.
func TestLayerOrder(t *testing.T) {
	pkgs := listPackages(t)
	layerOf := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			if _, dup := layerOf[p]; dup {
				t.Fatalf("%s placed twice", p)
			}
			layerOf[p] = i
		}
	}
	for path, p := range pkgs {
		name := short(path)
		if strings.HasPrefix(name, "test/") || strings.HasPrefix(name, "deploy/") {
			continue // test suites: their code is in _test.go files
		}
		from, placed := layerOf[name]
		if !placed && !testSupport[name] {
			t.Errorf("%s is in no layer: place it in test/layering's layers", name)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			to := short(imp)
			switch {
			case testSupport[to]:
				if !testSupport[name] {
					t.Errorf("%s imports the test-support package %s", name, to)
				}
			case testSupport[name]:
			case layerOf[to] <= from:
				t.Errorf("%s (layer %d, %v) imports %s (layer %d, %v): imports run down the layers only",
					name, from, layers[from], to, layerOf[to], layers[layerOf[to]])
			}
		}
	}
}
