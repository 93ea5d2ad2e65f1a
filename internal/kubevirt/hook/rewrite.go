package hook

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"slices"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// A primary disk served by the endpoint changes in three places of its
// <disk> element, and KubeVirt's text is edited there only, as insertDisks
// does for new disks: re-encoding the domain (or even the whole <disk>)
// through libvirtxml would drop what libvirtxml models as empty
// (TestRoundTrip) and reorder the rest. So:
//
//   - the <disk> start tag's type attribute becomes "network" (device,
//     model and the other attributes stay as written);
//   - the <source> element is replaced by the network source, encoded by
//     libvirtxml;
//   - the <driver> start tag gets type="raw" and loses io (networkDriver);
//     its other attributes and its children stay.
//
// Target, serial, boot order, alias, address and anything else in the
// element stay byte for byte.

// primaryRewrite is the new <source> of the disk whose alias is alias.
// With block set the disk stays a block disk (its type and driver as
// written) and gets <shareable/> after its source: the slices of one
// device are opened by several of QEMU's nodes, which must share writes.
type primaryRewrite struct {
	alias  string
	source *libvirtxml.DomainDiskSource
	block  bool
}

// edit replaces doc[from:to] with text.
type edit struct {
	from, to int
	text     []byte
}

// diskTags are the parts of one <disk> element of <devices> that a
// rewrite edits, as byte ranges of the document.
type diskTags struct {
	start, source, driver [2]int // driver[1] == 0: no <driver>
	sourceIndent          string
	alias                 string
	shareable             bool // has <shareable/>
}

// rewritePrimaries applies rewrites to the document; every disk of
// rewrites must be found, with a <source>.
func rewritePrimaries(doc []byte, rewrites []primaryRewrite) ([]byte, error) {
	disks, err := scanDisks(doc)
	if err != nil {
		return nil, err
	}
	var edits []edit
	for _, rw := range rewrites {
		i := slices.IndexFunc(disks, func(d diskTags) bool { return d.alias == rw.alias })
		if i < 0 || disks[i].source[1] == 0 {
			return nil, fmt.Errorf("domain XML: no disk with alias %s and a <source>: %w", rw.alias, kubevirt.ErrInvalid)
		}
		d := disks[i]
		if !rw.block {
			tag, err := setAttr(doc[d.start[0]:d.start[1]], "type", "network")
			if err != nil {
				return nil, err
			}
			edits = append(edits, edit{d.start[0], d.start[1], tag})
		}
		var src bytes.Buffer
		enc := xml.NewEncoder(&src)
		enc.Indent(d.sourceIndent, "  ")
		if err := enc.EncodeElement(rw.source, xml.StartElement{Name: xml.Name{Local: "source"}}); err != nil {
			return nil, fmt.Errorf("domain XML: encode the source of %s: %v: %w", rw.alias, err, kubevirt.ErrInvalid)
		}
		text := bytes.TrimLeft(src.Bytes(), " \t")
		if rw.block {
			if !d.shareable {
				text = append(text, "\n"+d.sourceIndent+"<shareable/>"...)
			}
			edits = append(edits, edit{d.source[0], d.source[1], text})
			continue
		}
		edits = append(edits, edit{d.source[0], d.source[1], text})
		if d.driver[1] != 0 {
			tag := doc[d.driver[0]:d.driver[1]]
			if tag, err = setAttr(tag, "type", "raw"); err == nil {
				tag, err = removeAttr(tag, "io")
			}
			if err != nil {
				return nil, err
			}
			edits = append(edits, edit{d.driver[0], d.driver[1], tag})
		}
	}
	// The edits of one disk do not overlap (start tag, then its children),
	// nor do disks: apply them from the end, so offsets stay true.
	slices.SortFunc(edits, func(a, b edit) int { return b.from - a.from })
	out := slices.Clone(doc)
	for _, e := range edits {
		out = slices.Concat(out[:e.from], e.text, out[e.to:])
	}
	return out, nil
}

// scanDisks returns the byte ranges of the <disk> elements of
// <domain><devices>: their start tags, and their <source> elements and
// <driver> start tags.
func scanDisks(doc []byte) ([]diskTags, error) {
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var out []diskTags
	var cur *diskTags
	depth := 0
	var inDevices bool
	for {
		off := int(dec.InputOffset())
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("domain XML: %v: %w", err, kubevirt.ErrInvalid)
		}
		end := int(dec.InputOffset())
		switch tok := tok.(type) {
		case xml.StartElement:
			depth++
			inDevices = inDevices || (depth == 2 && tok.Name.Local == "devices")
			switch {
			case inDevices && depth == 3 && tok.Name.Local == "disk":
				out = append(out, diskTags{start: [2]int{off, end}})
				cur = &out[len(out)-1]
			case cur != nil && depth == 4 && tok.Name.Local == "source":
				cur.source[0] = off
				line := doc[:off]
				cur.sourceIndent = string(line[bytes.LastIndexByte(line, '\n')+1:])
				if strings.Trim(cur.sourceIndent, " \t") != "" {
					cur.sourceIndent = ""
				}
			case cur != nil && depth == 4 && tok.Name.Local == "shareable":
				cur.shareable = true
			case cur != nil && depth == 4 && tok.Name.Local == "driver":
				cur.driver = [2]int{off, end}
			case cur != nil && depth == 4 && tok.Name.Local == "alias":
				for _, a := range tok.Attr {
					if a.Name.Space == "" && a.Name.Local == "name" {
						cur.alias = a.Value
					}
				}
			}
		case xml.EndElement:
			switch {
			case cur != nil && depth == 4 && tok.Name.Local == "source":
				cur.source[1] = end
			case cur != nil && depth == 3:
				cur = nil
			case inDevices && depth == 2:
				inDevices = false
			}
			depth--
		}
	}
	return out, nil
}

// attrSpan is one attribute of a raw start tag: tag[from:to] is the
// attribute with the blanks before it, tag[valFrom:valTo] its value.
type attrSpan struct {
	name                     string
	from, to, valFrom, valTo int
}

// scanTag splits a start tag the XML decoder has already accepted
// (`<name a="v" b='w'>` or `.../>`) into its attributes, and returns where
// the tag's closing (blanks, then > or />) begins.
func scanTag(tag []byte) ([]attrSpan, int, error) {
	bad := fmt.Errorf("domain XML: cannot read start tag %q: %w", tag, kubevirt.ErrInvalid)
	isBlank := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	i := 1
	for i < len(tag) && !isBlank(tag[i]) && tag[i] != '/' && tag[i] != '>' {
		i++
	}
	var attrs []attrSpan
	for {
		from := i
		for i < len(tag) && isBlank(tag[i]) {
			i++
		}
		if i >= len(tag) {
			return nil, 0, bad
		}
		if tag[i] == '/' || tag[i] == '>' {
			return attrs, from, nil
		}
		a := attrSpan{from: from}
		n := i
		for i < len(tag) && !isBlank(tag[i]) && tag[i] != '=' {
			i++
		}
		a.name = string(tag[n:i])
		for i < len(tag) && isBlank(tag[i]) {
			i++
		}
		if i >= len(tag) || tag[i] != '=' {
			return nil, 0, bad
		}
		i++
		for i < len(tag) && isBlank(tag[i]) {
			i++
		}
		if i >= len(tag) || (tag[i] != '"' && tag[i] != '\'') {
			return nil, 0, bad
		}
		q := tag[i]
		a.valFrom = i + 1
		j := bytes.IndexByte(tag[a.valFrom:], q)
		if j < 0 {
			return nil, 0, bad
		}
		a.valTo = a.valFrom + j
		i = a.valTo + 1
		a.to = i
		attrs = append(attrs, a)
	}
}

// setAttr returns the start tag with attribute name set to value (which
// needs no escaping), added before the tag's end if missing.
func setAttr(tag []byte, name, value string) ([]byte, error) {
	attrs, closing, err := scanTag(tag)
	if err != nil {
		return nil, err
	}
	for _, a := range attrs {
		if a.name == name {
			return slices.Concat(tag[:a.valFrom], []byte(value), tag[a.valTo:]), nil
		}
	}
	return slices.Concat(tag[:closing], []byte(fmt.Sprintf(` %s="%s"`, name, value)), tag[closing:]), nil
}

// removeAttr returns the start tag without attribute name.
func removeAttr(tag []byte, name string) ([]byte, error) {
	attrs, _, err := scanTag(tag)
	if err != nil {
		return nil, err
	}
	for _, a := range attrs {
		if a.name == name {
			return slices.Concat(tag[:a.from], tag[a.to:]), nil
		}
	}
	return tag, nil
}
