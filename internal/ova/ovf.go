// Package ova reads and writes the vSphere exit format: an OVF descriptor
// naming a VM's virtual disks, alone beside its disk files or packed with
// them in an OVA (a tar archive, the descriptor first). It parses and
// checks; converting the disks is the caller's (qemu-img).
//
// Every name in a descriptor is untrusted: a file reference must be a plain
// file name in the package, never a path.
//
// Imports from quiver: nothing.
package ova

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// ErrInvalid marks a descriptor or package that cannot be imported; the
// message says what is wrong with it.
var ErrInvalid = errors.New("invalid OVF package")

// MaxDescriptor bounds an OVF descriptor's size.
const MaxDescriptor = 4 << 20

// MaxDisks bounds the disks one descriptor may name.
const MaxDisks = 64

// Disk is one virtual disk of a descriptor, in the VM's order.
type Disk struct {
	// ID is the disk's ovf:diskId.
	ID string
	// Name is a DNS label for it: from the hardware item's ElementName
	// ("Hard disk 1" becomes hard-disk-1), else from its ID.
	Name string
	// File is the plain file name of its image in the package.
	File string
	// Capacity is its virtual size in bytes, as the descriptor says.
	Capacity int64
	// Format is the descriptor's format URI (e.g. ...vmdk.html#streamOptimized).
	Format string
}

// Descriptor is what quiver needs of an OVF descriptor.
type Descriptor struct {
	// VM is the virtual system's name, or its ID.
	VM    string
	Disks []Disk
}

// The subset of the OVF envelope (DMTF DSP0243) read here; local names
// only, so OVF 1.x and 2.x both parse.
type envelope struct {
	XMLName    xml.Name `xml:"Envelope"`
	References struct {
		Files []struct {
			ID   string `xml:"id,attr"`
			Href string `xml:"href,attr"`
		} `xml:"File"`
	} `xml:"References"`
	DiskSections []struct {
		Disks []struct {
			ID       string `xml:"diskId,attr"`
			FileRef  string `xml:"fileRef,attr"`
			Capacity string `xml:"capacity,attr"`
			Units    string `xml:"capacityAllocationUnits,attr"`
			Format   string `xml:"format,attr"`
		} `xml:"Disk"`
	} `xml:"DiskSection"`
	Systems []struct {
		ID    string `xml:"id,attr"`
		Name  string `xml:"Name"`
		Items []struct {
			ElementName  string `xml:"ElementName"`
			HostResource string `xml:"HostResource"`
			ResourceType string `xml:"ResourceType"`
		} `xml:"VirtualHardwareSection>Item"`
	} `xml:"VirtualSystem"`
}

// Parse reads an OVF descriptor and checks it: one virtual system, at
// least one disk, every disk backed by a file of the package under a plain
// name, capacities in bytes that fit, and disk names that are distinct DNS
// labels. names, when not empty, renames the disks in order.
func Parse(r io.Reader, names []string) (*Descriptor, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxDescriptor+1))
	if err != nil {
		return nil, fmt.Errorf("read OVF descriptor: %w", err)
	}
	if len(data) > MaxDescriptor {
		return nil, fmt.Errorf("OVF descriptor larger than %d MiB: %w", MaxDescriptor>>20, ErrInvalid)
	}
	var env envelope
	dec := xml.NewDecoder(strings.NewReader(string(data)))
	dec.Strict = true
	if err := dec.Decode(&env); err != nil {
		return nil, fmt.Errorf("OVF descriptor is not an OVF envelope (%v): %w", err, ErrInvalid)
	}
	if len(env.Systems) != 1 {
		return nil, fmt.Errorf("OVF descriptor has %d virtual systems, want one (a VirtualSystemCollection is not supported): %w",
			len(env.Systems), ErrInvalid)
	}
	files := map[string]string{}
	for _, f := range env.References.Files {
		if err := plainName(f.Href); err != nil {
			return nil, fmt.Errorf("file %q: %v: %w", f.Href, err, ErrInvalid)
		}
		if _, dup := files[f.ID]; dup {
			return nil, fmt.Errorf("file id %q is given twice: %w", f.ID, ErrInvalid)
		}
		files[f.ID] = f.Href
	}
	byID := map[string]*Disk{}
	var order []*Disk
	for _, sec := range env.DiskSections {
		for _, d := range sec.Disks {
			if d.ID == "" {
				return nil, fmt.Errorf("a disk has no diskId: %w", ErrInvalid)
			}
			if byID[d.ID] != nil {
				return nil, fmt.Errorf("disk id %q is given twice: %w", d.ID, ErrInvalid)
			}
			href, ok := files[d.FileRef]
			if !ok {
				return nil, fmt.Errorf("disk %s: fileRef %q names no file of References (an empty disk is not supported): %w",
					d.ID, d.FileRef, ErrInvalid)
			}
			capacity, err := parseCapacity(d.Capacity, d.Units)
			if err != nil {
				return nil, fmt.Errorf("disk %s: %v: %w", d.ID, err, ErrInvalid)
			}
			disk := &Disk{ID: d.ID, File: href, Capacity: capacity, Format: d.Format}
			byID[d.ID] = disk
			order = append(order, disk)
		}
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("OVF descriptor names no disk: %w", ErrInvalid)
	}
	if len(order) > MaxDisks {
		return nil, fmt.Errorf("OVF descriptor names %d disks, at most %d: %w", len(order), MaxDisks, ErrInvalid)
	}
	sys := env.Systems[0]
	desc := &Descriptor{VM: strings.TrimSpace(sys.Name)}
	if desc.VM == "" {
		desc.VM = sys.ID
	}
	// The VM's order is its hardware items'; disks no item uses come last.
	placed := map[string]bool{}
	for _, it := range sys.Items {
		id, ok := diskRef(it.HostResource)
		if !ok {
			continue
		}
		d := byID[id]
		if d == nil {
			return nil, fmt.Errorf("hardware item %q uses disk %q, which DiskSection does not describe: %w",
				it.ElementName, id, ErrInvalid)
		}
		if placed[id] {
			return nil, fmt.Errorf("disk %s is used by two hardware items: %w", id, ErrInvalid)
		}
		placed[id] = true
		d.Name = label(it.ElementName)
		desc.Disks = append(desc.Disks, *d)
	}
	for _, d := range order {
		if !placed[d.ID] {
			desc.Disks = append(desc.Disks, *d)
		}
	}
	if len(names) > 0 && len(names) != len(desc.Disks) {
		return nil, fmt.Errorf("%d disk names given for %d disks: %w", len(names), len(desc.Disks), ErrInvalid)
	}
	seen := map[string]string{}
	for i := range desc.Disks {
		d := &desc.Disks[i]
		switch {
		case len(names) > 0:
			d.Name = names[i]
		case d.Name == "":
			d.Name = label(d.ID)
		}
		if !dnsLabel.MatchString(d.Name) {
			return nil, fmt.Errorf("disk %s: name %q is not a DNS label (lower-case letters, digits and '-'; rename with --disk-names): %w",
				d.ID, d.Name, ErrInvalid)
		}
		if other, dup := seen[d.Name]; dup {
			return nil, fmt.Errorf("disks %s and %s would both be named %q (rename with --disk-names): %w", other, d.ID, d.Name, ErrInvalid)
		}
		seen[d.Name] = d.ID
	}
	return desc, nil
}

// diskRef returns the disk ID of a HostResource "ovf:/disk/<id>" (also
// "/disk/<id>"), or false for any other resource.
func diskRef(hostResource string) (string, bool) {
	s := strings.TrimSpace(hostResource)
	s = strings.TrimPrefix(s, "ovf:")
	id, ok := strings.CutPrefix(s, "/disk/")
	return id, ok && id != ""
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// label makes a DNS label of a display name: "Hard disk 1" is hard-disk-1.
func label(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(r)
			dash = false
		default:
			dash = true
		}
	}
	out := b.String()
	if len(out) > 63 {
		out = strings.TrimRight(out[:63], "-")
	}
	return out
}

// plainName refuses a file reference that is not a plain file name: a
// path, "..", an absolute name or a URL would reach outside the package.
func plainName(href string) error {
	switch {
	case href == "":
		return errors.New("empty file name")
	case strings.ContainsAny(href, `/\`) || href == "." || href == "..":
		return errors.New("not a plain file name (paths are refused)")
	case strings.Contains(href, ":"):
		return errors.New("not a file of the package (URLs are refused)")
	case strings.ContainsFunc(href, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return errors.New("control characters in the file name")
	}
	return nil
}

// units reads capacityAllocationUnits: "byte", or "byte * 2^N" (DSP0004
// programmatic units); the default is bytes.
var units = regexp.MustCompile(`^byte\s*(?:\*\s*2\^(\d+))?$`)

// parseCapacity returns a capacity in bytes.
func parseCapacity(value, unit string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("capacity %q: want a positive integer", value)
	}
	shift := 0
	if u := strings.TrimSpace(unit); u != "" {
		m := units.FindStringSubmatch(u)
		if m == nil {
			return 0, fmt.Errorf("capacityAllocationUnits %q: want byte or byte * 2^N", unit)
		}
		if m[1] != "" {
			shift, _ = strconv.Atoi(m[1])
		}
	}
	if shift > 62 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("capacity %s %s does not fit in 64 bits", value, unit)
	}
	return n << shift, nil
}
