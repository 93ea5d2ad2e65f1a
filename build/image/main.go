// Command image assembles a container image without a daemon and writes it
// as a docker-archive tarball, which `podman load`, `docker load` and
// `ctr images import` read:
//
//	image -base rootfs.tar -add bin/quiver:/usr/bin/quiver \
//	      -entrypoint /usr/bin/quiver -label org.opencontainers.image.version=v1 \
//	      -tag quiver:v1 -o quiver.tar
//
// The image is the base tarball (optional: a root filesystem, such as
// mmdebstrap's; its device nodes are dropped, the runtime provides /dev) as
// one layer, then every -add file in a second layer. Without -base it is a
// single layer with the -add files: enough for one static binary (a CSI
// sidecar, a pause image).
//
// -cap DEST=CAPS gives the file an -add put at DEST file capabilities, as
// setcap would (caps.go): -cap /usr/bin/virt-launcher-monitor=cap_net_bind_service+ep.
//
// The same inputs give the same image, byte for byte: every time in the
// image is -created (default $SOURCE_DATE_EPOCH, else 0), the added files
// are owned by root with their permission bits and nothing else of the
// build machine, and the layers are compressed without a timestamp. It
// prints the tag, the image ID (the config's digest, what `podman images`
// shows) and the manifest's digest.
//
// It is a module of its own so that quiver's go.mod does not carry
// go-containerregistry and its dependencies for a build tool.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// list is a repeatable flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, " ") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

type options struct {
	base                    string
	adds                    []addition
	entrypoint, cmd, env    []string
	labels                  map[string]string
	user, workdir           string
	tag                     name.Tag
	out                     string
	created                 time.Time
	arch                    string
	historyBase, historyAdd string
}

func main() {
	o, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(2)
	}
	id, digest, err := build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s %s\n", o.tag.String(), id, digest)
}

func parse(args []string) (*options, error) {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var adds, labels list
	o := &options{labels: map[string]string{}}
	fs.StringVar(&o.base, "base", "", "a root filesystem tarball, the first layer (optional)")
	fs.Var(&adds, "add", "SRC:DEST, a file of the last layer (repeatable)")
	var caps list
	fs.Var(&caps, "cap", "DEST=CAPS, file capabilities of the file an -add puts at DEST, in setcap's form: cap_net_bind_service+ep (repeatable)")
	fs.Var((*list)(&o.entrypoint), "entrypoint", "one argument of the entrypoint (repeatable, in order)")
	fs.Var((*list)(&o.cmd), "cmd", "one argument of the default command (repeatable, in order)")
	fs.Var((*list)(&o.env), "env", "KEY=VALUE in the environment (repeatable; PATH has a default)")
	fs.Var(&labels, "label", "KEY=VALUE, a label of the image (repeatable)")
	fs.StringVar(&o.user, "user", "", "the user the entrypoint runs as (uid[:gid])")
	fs.StringVar(&o.workdir, "workdir", "", "the working directory")
	tag := fs.String("tag", "", "name:tag of the image (required)")
	fs.StringVar(&o.out, "o", "", "the docker-archive tarball to write (required)")
	created := fs.String("created", os.Getenv("SOURCE_DATE_EPOCH"), "creation time, seconds since 1970 (default $SOURCE_DATE_EPOCH, else 0)")
	fs.StringVar(&o.arch, "arch", runtime.GOARCH, "the image's architecture")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *tag == "" || o.out == "" {
		return nil, errors.New("-tag and -o are required")
	}
	t, err := name.NewTag(*tag)
	if err != nil {
		return nil, fmt.Errorf("-tag %q: %w", *tag, err)
	}
	o.tag = t
	if o.base == "" && len(adds) == 0 {
		return nil, errors.New("nothing to put in the image: give -base, -add or both")
	}
	for _, a := range adds {
		src, dest, ok := strings.Cut(a, ":")
		if !ok || src == "" || !strings.HasPrefix(dest, "/") || strings.HasSuffix(dest, "/") {
			return nil, fmt.Errorf("-add %q: must be SRC:DEST with DEST an absolute file path", a)
		}
		o.adds = append(o.adds, addition{src: src, dest: dest})
	}
	for _, c := range caps {
		if err := o.setCaps(c); err != nil {
			return nil, err
		}
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("-label %q: must be KEY=VALUE", l)
		}
		o.labels[k] = v
	}
	for _, e := range o.env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, fmt.Errorf("-env %q: must be KEY=VALUE", e)
		}
	}
	secs := int64(0)
	if *created != "" {
		if secs, err = strconv.ParseInt(*created, 10, 64); err != nil || secs < 0 {
			return nil, fmt.Errorf("-created %q: must be seconds since 1970", *created)
		}
	}
	o.created = time.Unix(secs, 0).UTC()
	// The history names what a layer holds, not where it came from: a
	// path on the build machine would make the image depend on it.
	o.historyBase = "root filesystem"
	dests := make([]string, len(o.adds))
	for i, a := range o.adds {
		dests[i] = a.dest
	}
	o.historyAdd = "add " + strings.Join(dests, " ")
	return o, nil
}

// setCaps applies one -cap DEST=CAPS to the -add of DEST. DEST ends at
// the first = of its last path element (CAPS has no /; a file whose name
// has a = cannot be given capabilities).
func (o *options) setCaps(arg string) error {
	slash := strings.LastIndex(arg, "/")
	i := strings.Index(arg[slash+1:], "=")
	if slash < 0 || i < 0 {
		return fmt.Errorf("-cap %q: must be DEST=CAPS, as /usr/bin/ping=cap_net_raw+ep", arg)
	}
	i += slash + 1
	dest, text := arg[:i], arg[i+1:]
	c, err := parseCaps(text)
	if err != nil {
		return fmt.Errorf("-cap %q: %w", arg, err)
	}
	for k := range o.adds {
		if a := &o.adds[k]; path.Clean(a.dest) == path.Clean(dest) {
			if a.caps != nil {
				return fmt.Errorf("-cap %q: %s has capabilities already", arg, dest)
			}
			a.caps = c.xattr()
			return nil
		}
	}
	return fmt.Errorf("-cap %q: no -add puts a file at %s", arg, dest)
}

// defaultPath is PATH when -env does not set it.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// build writes the image to o.out and returns its image ID and manifest
// digest.
func build(o *options) (id, digest v1.Hash, err error) {
	env := o.env
	if !hasKey(env, "PATH") {
		env = append([]string{defaultPath}, env...)
	}
	created := v1.Time{Time: o.created}
	cfg := &v1.ConfigFile{
		Architecture: o.arch,
		OS:           "linux",
		Created:      created,
		Config: v1.Config{
			Entrypoint: o.entrypoint,
			Cmd:        o.cmd,
			Env:        env,
			Labels:     o.labels,
			User:       o.user,
			WorkingDir: o.workdir,
		},
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return id, digest, err
	}
	var adds []mutate.Addendum
	if o.base != "" {
		l, err := baseLayer(o.base)
		if err != nil {
			return id, digest, err
		}
		adds = append(adds, mutate.Addendum{Layer: l, History: v1.History{Created: created, CreatedBy: o.historyBase}})
	}
	if len(o.adds) > 0 {
		l, err := fileLayer(o.adds, o.created)
		if err != nil {
			return id, digest, err
		}
		adds = append(adds, mutate.Addendum{Layer: l, History: v1.History{Created: created, CreatedBy: o.historyAdd}})
	}
	if img, err = mutate.Append(img, adds...); err != nil {
		return id, digest, err
	}
	tmp := o.out + ".tmp"
	if err := tarball.WriteToFile(tmp, o.tag, img); err != nil {
		os.Remove(tmp)
		return id, digest, fmt.Errorf("write %s: %w", o.out, err)
	}
	if err := os.Rename(tmp, o.out); err != nil {
		return id, digest, err
	}
	if id, err = img.ConfigName(); err != nil {
		return id, digest, err
	}
	digest, err = img.Digest()
	return id, digest, err
}

func hasKey(env []string, key string) bool {
	for _, e := range env {
		if k, _, _ := strings.Cut(e, "="); k == key {
			return true
		}
	}
	return false
}
