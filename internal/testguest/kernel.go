package testguest

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// ErrMissing marks a prerequisite that is not there (a tool, a package, the
// package index): the test skips locally and fails under CI.
var ErrMissing = errors.New("missing prerequisite")

// baseConfig are the options every guest relies on, each with the values
// that will do ("m" means the module is loaded from the initramfs).
var baseConfig = map[string][]string{
	"CONFIG_BLK_DEV_INITRD":      {"y"},
	"CONFIG_DEVTMPFS":            {"y"},
	"CONFIG_SERIAL_8250_CONSOLE": {"y"},
}

// KernelSpec says what a guest needs of the kernel.
type KernelSpec struct {
	// Flavour is the Debian kernel flavour: "amd64" (the default) or
	// "cloud-amd64", built for virtual machines, with fewer drivers built
	// in, which boots in about half the CPU time under TCG.
	Flavour string
	// Modules are the modules to load (e.g. virtio_pci, virtio_blk); their
	// dependencies are found in the modules themselves.
	Modules []string
	// Config are kernel options the guest relies on besides the base ones
	// (initrd, devtmpfs, serial console), each with the values that will do.
	Config map[string][]string
}

// VirtioBlk is the spec of a guest whose disks are virtio-blk on
// virtio-pci: what test/migration, test/enospc and the other QEMU tests
// boot, so they share one cached kernel.
var VirtioBlk = KernelSpec{
	Modules: []string{"virtio_pci", "virtio_blk"},
	Config: map[string][]string{
		"CONFIG_VIRTIO_PCI": {"y", "m"},
		"CONFIG_VIRTIO_BLK": {"y", "m"},
	},
}

// VirtioXFS is the spec of a guest whose virtio-blk disks hold XFS, on
// Debian's cloud kernel (about half the generic one's CPU time under TCG):
// test/shutdown and test/backup boot it, sharing one cached kernel.
// crc32c_generic: XFS asks the crypto API for crc32c, which no module
// loader answers in the guest; built in on 6.1, a module on 6.12.
var VirtioXFS = KernelSpec{
	Flavour: "cloud-amd64",
	Modules: []string{"virtio_pci", "virtio_blk", "crc32c_generic", "xfs"},
	Config: map[string][]string{
		"CONFIG_VIRTIO_PCI":    {"y", "m"},
		"CONFIG_VIRTIO_BLK":    {"y", "m"},
		"CONFIG_XFS_FS":        {"y", "m"},
		"CONFIG_CRYPTO_CRC32C": {"y", "m"},
	},
}

// Kernel is a guest kernel unpacked from Debian's package into the cache:
// a bzImage and the modules of a KernelSpec, in an order that loads every
// dependency first.
type Kernel struct {
	Package string   `json:"package"` // e.g. linux-image-6.1.0-57-amd64
	Vmlinuz string   `json:"vmlinuz"` // file name in Dir
	Modules []string `json:"modules"` // module names in load order, files modules/<name>.ko
	Dir     string   `json:"-"`
}

// VmlinuzPath is the kernel image, for QEMU's -kernel.
func (k *Kernel) VmlinuzPath() string { return filepath.Join(k.Dir, k.Vmlinuz) }

// ModulePath is the file of a module of Modules.
func (k *Kernel) ModulePath(name string) string {
	return filepath.Join(k.Dir, "modules", name+".ko")
}

// CacheRoot is where downloads survive between runs: $QUIVER_TEST_CACHE,
// else quiver-test under $XDG_CACHE_HOME or ~/.cache.
func CacheRoot() string {
	if dir := os.Getenv("QUIVER_TEST_CACHE"); dir != "" {
		return dir
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "quiver-test")
}

// FetchKernel returns the kernel of Debian's linux-image-<flavour> (the
// current kernel of the release the machine's apt points at), or the
// package $QUIVER_GUEST_KERNEL names (to run a guest test on another
// kernel, e.g. linux-image-6.12.118+deb12-amd64), with the modules of
// spec, from the cache when an earlier run put it there, else downloaded
// with `apt-get download` and unpacked with `dpkg -x`, nothing installed.
func FetchKernel(spec KernelSpec) (*Kernel, error) {
	for _, tool := range []string{"apt-cache", "apt-get", "dpkg"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrMissing, tool, err)
		}
	}
	pkg := os.Getenv("QUIVER_GUEST_KERNEL")
	if pkg == "" {
		var err error
		if pkg, err = kernelPackage(spec.flavour()); err != nil {
			return nil, fmt.Errorf("%w: no Debian kernel package to boot the guest: %v", ErrMissing, err)
		}
	} else if !regexp.MustCompile(`^linux-image-[0-9][a-z0-9.+~-]*$`).MatchString(pkg) {
		return nil, fmt.Errorf("QUIVER_GUEST_KERNEL=%q: want a Debian kernel package such as linux-image-6.12.118+deb12-amd64", pkg)
	}
	root := filepath.Join(CacheRoot(), "kernel")
	dir := filepath.Join(root, pkg+"-"+spec.key())
	if k, err := loadKernel(dir); err == nil {
		return k, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(root, ".fetch-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	download := exec.Command("apt-get", "download", pkg)
	download.Dir = work
	if out, err := download.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: apt-get download %s: %v\n%s", ErrMissing, pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(work, "*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("apt-get download %s left %d .deb files, want 1", pkg, len(debs))
	}
	tree := filepath.Join(work, "tree")
	if out, err := exec.Command("dpkg", "-x", debs[0], tree).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dpkg -x %s: %v\n%s", debs[0], err, out)
	}
	out := filepath.Join(work, "kernel")
	k, err := extractKernel(pkg, tree, out, spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pkg, err)
	}
	// Another test process may have filled the cache meanwhile: either copy
	// will do.
	if err := os.Rename(out, dir); err != nil {
		if k, lerr := loadKernel(dir); lerr == nil {
			return k, nil
		}
		return nil, err
	}
	k.Dir = dir
	return k, nil
}

func (s KernelSpec) flavour() string {
	if s.Flavour == "" {
		return "amd64"
	}
	return s.Flavour
}

// key names the spec's module set in the cache.
func (s KernelSpec) key() string {
	mods := slices.Clone(s.Modules)
	slices.Sort(mods)
	sum := sha256.Sum256([]byte(strings.Join(mods, ",")))
	return hex.EncodeToString(sum[:4])
}

// kernelPackage names the package linux-image-<flavour> depends on, the
// current kernel, e.g. linux-image-6.1.0-57-amd64.
func kernelPackage(flavour string) (string, error) {
	meta := "linux-image-" + flavour
	out, err := exec.Command("apt-cache", "depends", meta).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s: %v\n%s", meta, err, out)
	}
	re := regexp.MustCompile(`(?m)^\s*\|?Depends:\s*(linux-image-[0-9][a-z0-9.+-]*-` + regexp.QuoteMeta(flavour) + `)\s*$`)
	m := re.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("apt-cache depends %s names no linux-image-<version>-%s (run apt-get update?):\n%s", meta, flavour, out)
	}
	return string(m[1]), nil
}

func loadKernel(dir string) (*Kernel, error) {
	b, err := os.ReadFile(filepath.Join(dir, "kernel.json"))
	if err != nil {
		return nil, err
	}
	k := &Kernel{Dir: dir}
	if err := json.Unmarshal(b, k); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return k, nil
}

// extractKernel copies from the unpacked package tree into out what the
// guest needs: vmlinuz, the config, the modules of spec and their
// dependencies, and kernel.json describing them.
func extractKernel(pkg, tree, out string, spec KernelSpec) (*Kernel, error) {
	vmlinuz, _ := filepath.Glob(filepath.Join(tree, "boot", "vmlinuz-*"))
	configs, _ := filepath.Glob(filepath.Join(tree, "boot", "config-*"))
	moddirs, _ := filepath.Glob(filepath.Join(tree, "lib", "modules", "*"))
	if len(vmlinuz) != 1 || len(configs) != 1 || len(moddirs) != 1 {
		return nil, fmt.Errorf("want one boot/vmlinuz-*, boot/config-* and lib/modules/*, got %q %q %q", vmlinuz, configs, moddirs)
	}
	config, err := os.ReadFile(configs[0])
	if err != nil {
		return nil, err
	}
	if err := checkKernelConfig(config, spec.Config); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(configs[0]), err)
	}
	order, files, err := resolveModules(moddirs[0], spec.Modules)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(out, "modules"), 0o755); err != nil {
		return nil, err
	}
	k := &Kernel{Package: pkg, Vmlinuz: filepath.Base(vmlinuz[0]), Modules: order, Dir: out}
	copies := map[string]string{vmlinuz[0]: k.VmlinuzPath(), configs[0]: filepath.Join(out, filepath.Base(configs[0]))}
	for _, name := range order {
		copies[files[name]] = k.ModulePath(name)
	}
	for from, to := range copies {
		if err := copyFile(from, to); err != nil {
			return nil, err
		}
	}
	b, err := json.MarshalIndent(k, "", "  ")
	if err != nil {
		return nil, err
	}
	return k, os.WriteFile(filepath.Join(out, "kernel.json"), append(b, '\n'), 0o644)
}

// checkKernelConfig fails unless config sets every option of baseConfig
// and needs to an acceptable value.
func checkKernelConfig(config []byte, needs map[string][]string) error {
	set := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(config))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			set[k] = v
		}
	}
	var errs []error
	for _, m := range []map[string][]string{baseConfig, needs} {
		for opt, ok := range m {
			if v := set[opt]; !slices.Contains(ok, v) {
				errs = append(errs, fmt.Errorf("%s=%q, want one of %q", opt, v, ok))
			}
		}
	}
	return errors.Join(errs...)
}

// resolveModules returns the modules to load for roots, dependencies first,
// and the file of each. Debian's package ships no modules.dep (depmod
// writes it when the package is installed), so the dependencies come from
// each module's .modinfo section ("depends=a,b"), the data depmod reads.
// Modules built into the kernel (modules.builtin) need no loading.
func resolveModules(moddir string, roots []string) (order []string, files map[string]string, err error) {
	files = map[string]string{}
	err = filepath.WalkDir(filepath.Join(moddir, "kernel"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name, ok := strings.CutSuffix(d.Name(), ".ko")
		if !ok {
			name, ok = strings.CutSuffix(d.Name(), ".ko.xz") // Debian's kernels from 6.12
		}
		if ok && d.Type().IsRegular() {
			files[moduleName(name)] = path
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(moddir, "modules.builtin")); err == nil {
		for line := range strings.Lines(string(b)) {
			name := strings.TrimSuffix(filepath.Base(strings.TrimSpace(line)), ".ko")
			builtin[moduleName(name)] = true
		}
	}
	done := map[string]bool{}
	var visit func(name string, path []string) error
	visit = func(name string, path []string) error {
		if done[name] || builtin[name] {
			return nil
		}
		if slices.Contains(path, name) {
			return fmt.Errorf("module dependency cycle: %s", strings.Join(append(path, name), " -> "))
		}
		file, ok := files[name]
		if !ok {
			return fmt.Errorf("module %s (needed by %s): neither a file under %s nor built in", name, strings.Join(path, " -> "), moddir)
		}
		if plain, ok := strings.CutSuffix(file, ".xz"); ok {
			// busybox's insmod takes an uncompressed module.
			if out, err := exec.Command("xz", "-d", file).CombinedOutput(); err != nil {
				return fmt.Errorf("%w: xz -d %s: %v\n%s", ErrMissing, file, err, out)
			}
			file = plain
			files[name] = plain
		}
		deps, err := moduleDepends(file)
		if err != nil {
			return err
		}
		for _, dep := range deps {
			if err := visit(dep, append(path, name)); err != nil {
				return err
			}
		}
		done[name] = true
		order = append(order, name)
		return nil
	}
	for _, r := range roots {
		if err := visit(r, nil); err != nil {
			return nil, nil, err
		}
	}
	return order, files, nil
}

// moduleDepends reads the depends= entry of a module's .modinfo section.
func moduleDepends(file string) ([]string, error) {
	f, err := elf.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("%s: no .modinfo section", file)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("%s: .modinfo: %w", file, err)
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					deps = append(deps, moduleName(d))
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}

// moduleName normalizes a module name as the kernel does: '-' and '_' are
// the same.
func moduleName(s string) string { return strings.ReplaceAll(s, "-", "_") }

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}
