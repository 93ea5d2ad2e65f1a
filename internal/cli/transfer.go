package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/imageconv"
	"github.com/quiverstorage/quiver/internal/ova"
	"github.com/quiverstorage/quiver/internal/quantity"
)

// cleanupTimeout bounds the requests that undo a failed import or export.
const cleanupTimeout = 30 * time.Second

// importDisk is one disk to import: its name in the volume, its image and
// the size a descriptor declares for it (0: none).
type importDisk struct {
	name     string
	src      imageconv.Source
	declared int64
	info     imageconv.Info
}

func (a *app) volumeImportCommand() *cobra.Command {
	var from, capacity, node string
	var disks, names, labels []string
	cmd := &cobra.Command{
		Use:   "import NAME (--from VM.ova|VM.ovf | --disk NAME=FILE...) [--capacity SIZE]",
		Short: "Make a volume of a whole VM: an OVA, an OVF with its disks, or disk images",
		Long: `Make a volume holding every disk of a VM, the way it leaves vSphere: an OVA
archive, an OVF descriptor with its disk files beside it, or disk images of
any format qemu-img reads (vmdk, qcow2, vhdx, raw) given as --disk NAME=FILE.

The descriptor gives the disks, their order and sizes; disks are named from
their hardware items ("Hard disk 1" becomes hard-disk-1) unless --disk-names
names them. Everything is checked before the volume is made: the manifest's
digests, every image with qemu-img. The disks are then written over NBD,
sparse, with a progress bar. On any failure, or Ctrl-C, the volume is
removed: nothing is left behind. Needs qemu-img on this machine.`,
		Example: `  quiver volume import web01 --from web01.ova
  quiver volume import web01 --from web01.ova --disk-names root,data
  quiver volume import db01 --disk root=db01-root.qcow2 --disk data=db01-data.vmdk --capacity 200Gi`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (from == "") == (len(disks) == 0) {
				return errors.New("give --from VM.ova|VM.ovf, or --disk NAME=FILE (repeatable), not both")
			}
			if len(names) > 0 && from == "" {
				return errors.New("--disk-names renames the disks of --from; with --disk, name each disk in NAME=FILE")
			}
			spec := api.VolumeSpec{Name: args[0]}
			var err error
			if spec.Labels, err = parseLabels(labels); err != nil {
				return fmt.Errorf("--label: %w", err)
			}
			if capacity != "" {
				if spec.Capacity, err = quantity.Parse(capacity); err != nil {
					return fmt.Errorf("--capacity: %w", err)
				}
			}
			ctx := cmd.Context()
			todo, err := a.importSources(ctx, from, disks, names)
			if err != nil {
				return err
			}
			var total int64
			for _, d := range todo {
				size := (d.info.VirtualSize + 511) &^ 511
				spec.Disks = append(spec.Disks, api.DiskSpec{Name: d.name, Size: size})
				total += size
			}
			if spec.Capacity == 0 {
				spec.Capacity = total
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(ctx, spec)
			if err != nil {
				return err
			}
			if err := a.importInto(ctx, c, v.Name, node, todo); err != nil {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
				defer cancel()
				if _, derr := c.DeleteVolume(cctx, v.Name, client.Recursive()); derr != nil {
					return fmt.Errorf("import %s: %w; removing the half-made volume failed too (%v): run `quiver volume delete %s --recursive`",
						v.Name, err, derr, v.Name)
				}
				return fmt.Errorf("import %s: %w (the volume was removed)", v.Name, interruptedErr(ctx, err))
			}
			if v, err = c.GetVolume(ctx, v.Name); err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), v, a.volumeTable(v))
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "an .ova archive, or an .ovf descriptor with its disk files in the same directory")
	cmd.Flags().StringArrayVar(&disks, "disk", nil, "a disk as NAME=FILE, any format qemu-img reads (repeatable; instead of --from)")
	cmd.Flags().StringSliceVar(&names, "disk-names", nil, "names for the disks of --from, in the VM's order, e.g. root,data")
	cmd.Flags().StringVar(&capacity, "capacity", "", "the volume's capacity (default: the sum of the disks)")
	cmd.Flags().StringArrayVar(&labels, "label", nil, "a label as KEY=VALUE (repeatable)")
	cmd.Flags().StringVar(&node, "node", "import", "the node name of the attachment that writes the disks")
	return cmd
}

// importSources lists and checks the disks to import, before anything is
// made on the server.
func (a *app) importSources(ctx context.Context, from string, disks, names []string) ([]importDisk, error) {
	var todo []importDisk
	if from != "" {
		pkg, err := ova.Open(from, names)
		if err != nil {
			return nil, err
		}
		if pkg.HasManifest() {
			var size int64
			for _, m := range pkg.Files {
				size += m.Size
			}
			bar := a.newBar(api.Job{Kind: "verify", Target: filepath.Base(from)})
			var done int64
			err := pkg.Verify(func(n int64) {
				done += n
				bar.update(api.Job{BytesDone: done, BytesTotal: size})
			})
			bar.finish()
			if err != nil {
				return nil, err
			}
		}
		for _, d := range pkg.Descriptor.Disks {
			m := pkg.Files[d.File]
			src := imageconv.Source{Path: m.Path, Offset: m.Offset, Size: m.Size, Format: formatOf(d.Format, d.File)}
			if src.Offset == 0 { // beside an .ovf: the whole file
				src.Size = 0
			}
			todo = append(todo, importDisk{name: d.Name, src: src, declared: d.Capacity})
		}
	} else {
		seen := map[string]bool{}
		for _, w := range disks {
			name, file, ok := strings.Cut(w, "=")
			if !ok || name == "" || file == "" {
				return nil, fmt.Errorf("--disk %q: want NAME=FILE, e.g. root=web01-root.vmdk", w)
			}
			if seen[name] {
				return nil, fmt.Errorf("--disk %q: disk %s is given twice", w, name)
			}
			seen[name] = true
			todo = append(todo, importDisk{name: name, src: imageconv.Source{Path: file}})
		}
	}
	for i := range todo {
		d := &todo[i]
		info, err := imageconv.Inspect(ctx, d.src)
		if err != nil {
			return nil, fmt.Errorf("disk %s: %w", d.name, err)
		}
		if d.declared != 0 && d.declared != info.VirtualSize {
			return nil, fmt.Errorf("disk %s: the image holds %s, the descriptor says %s: the package is inconsistent",
				d.name, quantity.Format(info.VirtualSize), quantity.Format(d.declared))
		}
		d.info, d.src.Format = info, info.Format
	}
	return todo, nil
}

// formatOf is the qemu-img format of a descriptor's disk: VMDK for the
// VMware format URIs and .vmdk files, else "" (probe it).
func formatOf(uri, file string) string {
	if strings.Contains(strings.ToLower(uri), "vmdk") || strings.EqualFold(filepath.Ext(file), ".vmdk") {
		return "vmdk"
	}
	return ""
}

// importInto writes every disk into the new volume through an attachment
// of its own, detached at the end.
func (a *app) importInto(ctx context.Context, c *client.Client, vol, node string, todo []importDisk) (err error) {
	att, err := c.Attach(ctx, vol, api.AttachmentSpec{Node: node, Mode: api.ModeReadWrite})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if derr := c.Detach(cctx, vol, att.ID); derr != nil && err == nil {
			err = fmt.Errorf("detach the import's attachment: %w", derr)
		}
	}()
	var total, done int64
	for _, d := range todo {
		total += d.info.VirtualSize
	}
	bar := a.newBar(api.Job{Kind: "import", Target: vol})
	defer bar.finish()
	for i, d := range todo {
		uri, ok := att.URIs[d.name]
		if !ok {
			return errors.New("the server gave no NBD URI: it must serve NBD over TCP or a unix socket (quiver server --nbd)")
		}
		err := imageconv.Convert(ctx, d.src, d.info.Format, uri, "raw", true, "", func(f float64) {
			bar.update(api.Job{BytesDone: done + int64(f*float64(d.info.VirtualSize)), BytesTotal: total,
				ItemsDone: i, ItemsTotal: len(todo)})
		})
		if err != nil {
			return fmt.Errorf("disk %s: %w", d.name, err)
		}
		done += d.info.VirtualSize
	}
	return nil
}

// Formats `volume export` writes, by --format.
var exportFormats = map[string]struct{ ext, opts string }{
	"raw":   {".img", ""},
	"qcow2": {".qcow2", ""},
	"vmdk":  {".vmdk", "subformat=streamOptimized"},
}

func (a *app) volumeExportCommand() *cobra.Command {
	var to, format, snapshot, node string
	cmd := &cobra.Command{
		Use:   "export NAME --to DIR|VM.ova [--format qcow2|raw|vmdk] [--snapshot SNAP]",
		Short: "Write every disk of a volume to files, or to an OVA",
		Long: `Write every disk of a volume, at one crash-consistent instant, to image files
in a directory (<volume>-<disk>.qcow2, .img or .vmdk), or to an OVA archive
(streamOptimized VMDKs with an OVF descriptor and a manifest) that vSphere and
other hypervisors import. Without --snapshot a temporary snapshot is taken and
removed afterwards, so a running VM can be exported. Existing files are never
overwritten. Needs qemu-img on this machine.`,
		Example: `  quiver volume export web01 --to /backup/web01 --format qcow2
  quiver volume export web01 --to web01.ova
  quiver volume export web01 --to /backup --snapshot nightly --format raw`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vol, ctx := args[0], cmd.Context()
			toOVA := strings.EqualFold(filepath.Ext(to), ".ova")
			if toOVA && cmd.Flags().Changed("format") && format != "vmdk" {
				return fmt.Errorf("--format %s: an OVA holds VMDKs; drop --format or export to a directory", format)
			}
			if toOVA {
				format = "vmdk"
			}
			f, ok := exportFormats[format]
			if !ok {
				return fmt.Errorf("--format %q: want qcow2, raw or vmdk", format)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.GetVolume(ctx, vol)
			if err != nil {
				return err
			}
			dir := to
			if toOVA {
				if _, err := os.Lstat(to); err == nil {
					return fmt.Errorf("%s exists: pick another name, or remove it first", to)
				}
				if dir, err = os.MkdirTemp(filepath.Dir(to), ".quiver-export-"); err != nil {
					return err
				}
				defer os.RemoveAll(dir)
			} else if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			files := make(map[string]string, len(v.Disks))
			for _, d := range v.Disks {
				files[d.Name] = filepath.Join(dir, vol+"-"+d.Name+f.ext)
				if _, err := os.Lstat(files[d.Name]); err == nil {
					return fmt.Errorf("%s exists: export to another directory, or remove it first", files[d.Name])
				}
			}
			if err := a.exportTo(ctx, c, v, snapshot, node, files, format, f.opts); err != nil {
				for _, p := range files {
					os.Remove(p)
				}
				return fmt.Errorf("export %s: %w (nothing was written)", vol, interruptedErr(ctx, err))
			}
			if toOVA {
				disks := make([]ova.ExportDisk, 0, len(v.Disks))
				paths := map[string]string{}
				for _, d := range v.Disks {
					file := filepath.Base(files[d.Name])
					disks = append(disks, ova.ExportDisk{Name: d.Name, File: file, Capacity: d.Size})
					paths[file] = files[d.Name]
				}
				if err := ova.WriteOVA(to, vol, disks, paths); err != nil {
					return fmt.Errorf("export %s: write %s: %w", vol, to, err)
				}
				return a.printDone(cmd.OutOrStdout(), "volume %s exported to %s (%d disks)", vol, to, len(v.Disks))
			}
			if !a.forPeople() {
				return a.printObject(cmd.OutOrStdout(), files)
			}
			t := newTable(cmd.OutOrStdout(), "DISK", "SIZE", "FILE")
			for _, d := range v.Disks {
				t.row(d.Name, quantity.Format(d.Size), files[d.Name])
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "a directory for the image files, or a file name ending in .ova (required)")
	cmd.Flags().StringVar(&format, "format", "qcow2", "image format of the files: qcow2, raw or vmdk (an OVA is always vmdk)")
	cmd.Flags().StringVar(&snapshot, "snapshot", "", "export this snapshot instead of a temporary one of the live volume")
	cmd.Flags().StringVar(&node, "node", "", "the node name of the read-only attachment that reads the disks (default: a new export-XXXX)")
	cmd.MarkFlagRequired("to")
	return cmd
}

// exportTo converts every disk of snapshot (a temporary one when "") of v
// to files[disk].
func (a *app) exportTo(ctx context.Context, c *client.Client, v api.Volume, snapshot, node string, files map[string]string, format, opts string) (err error) {
	cleanup := func(f func(context.Context) error, what string) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if cerr := f(cctx); cerr != nil && err == nil {
			err = fmt.Errorf("%s: %w", what, cerr)
		}
	}
	if snapshot == "" {
		snapshot = "export-" + suffix()
		if _, err := c.CreateSnapshot(ctx, v.Name, snapshot); err != nil {
			return err
		}
		defer cleanup(func(ctx context.Context) error { return c.DeleteSnapshot(ctx, v.Name, snapshot) }, "delete the temporary snapshot "+snapshot)
	}
	if node == "" {
		node = "export-" + suffix()
	}
	att, err := c.Attach(ctx, v.Name, api.AttachmentSpec{Node: node, Mode: api.ModeReadOnly})
	if err != nil {
		return err
	}
	defer cleanup(func(ctx context.Context) error { return c.Detach(ctx, v.Name, att.ID) }, "detach the export's attachment")
	var total, done int64
	for _, d := range v.Disks {
		total += d.Size
	}
	bar := a.newBar(api.Job{Kind: "export", Target: v.Name + "@" + snapshot})
	defer bar.finish()
	for i, d := range v.Disks {
		uri, err := snapshotURI(att.URIs[d.Name], v.Name, snapshot)
		if err != nil {
			return fmt.Errorf("disk %s: %w", d.Name, err)
		}
		err = imageconv.Convert(ctx, imageconv.Source{Path: uri}, "raw", files[d.Name], format, false, opts, func(f float64) {
			bar.update(api.Job{BytesDone: done + int64(f*float64(d.Size)), BytesTotal: total, ItemsDone: i, ItemsTotal: len(v.Disks)})
		})
		if err != nil {
			return fmt.Errorf("disk %s: %w", d.Name, err)
		}
		done += d.Size
	}
	return nil
}

// snapshotURI turns the NBD URI of a live disk, .../<volume>/<disk>/<token>,
// into that of the disk in snapshot, .../<volume>@<snapshot>/<disk>/<token>.
func snapshotURI(live, volume, snapshot string) (string, error) {
	u, err := url.Parse(live)
	if live == "" || err != nil || !strings.HasPrefix(u.Path, "/"+volume+"/") {
		return "", errors.New("the server gave no NBD URI: it must serve NBD over TCP or a unix socket")
	}
	u.Path = "/" + volume + "@" + snapshot + strings.TrimPrefix(u.Path, "/"+volume)
	return u.String(), nil
}

// suffix is 4 random hex digits, for names of temporary objects.
func suffix() string {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// interruptedErr says "interrupted" for an error caused by Ctrl-C.
func interruptedErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errInterrupted
	}
	return err
}
