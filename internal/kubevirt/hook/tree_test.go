package hook

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
)

// node is a generic XML element: enough to compare two documents without
// knowing libvirt's schema.
type node struct {
	name     xml.Name
	attrs    []xml.Attr
	text     string
	children []*node
}

func parseTree(t *testing.T, b []byte) *node {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var stack []*node
	var root *node
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("parse XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			n := &node{name: tok.Name}
			for _, a := range tok.Attr {
				if a.Name.Space != "xmlns" && a.Name.Local != "xmlns" { // declarations, not data
					n.attrs = append(n.attrs, a)
				}
			}
			if len(stack) > 0 {
				parent := stack[len(stack)-1]
				parent.children = append(parent.children, n)
			} else {
				root = n
			}
			stack = append(stack, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				stack[len(stack)-1].text += strings.TrimSpace(string(tok))
			}
		}
	}
	return root
}

// canonical renders an element with its attributes and children sorted,
// so two trees compare equal whatever the order of attributes and of
// sibling elements (libvirtxml writes devices grouped by kind).
func (n *node) canonical() string {
	attrs := make([]string, 0, len(n.attrs))
	for _, a := range n.attrs {
		attrs = append(attrs, fmt.Sprintf("%s:%s=%q", a.Name.Space, a.Name.Local, a.Value))
	}
	slices.Sort(attrs)
	kids := make([]string, 0, len(n.children))
	for _, c := range n.children {
		kids = append(kids, c.canonical())
	}
	slices.Sort(kids)
	return fmt.Sprintf("<%s:%s %s>%q%s</>", n.name.Space, n.name.Local, strings.Join(attrs, " "), n.text, strings.Join(kids, ""))
}

// assertSameTree checks that out holds every element, attribute and text of
// in, and nothing else but `added` more <disk> elements at the end of the
// disks in <devices>; on failure it names the elements that differ.
func assertSameTree(t *testing.T, in, out []byte, added int) {
	t.Helper()
	a, b := parseTree(t, in), parseTree(t, out)
	for _, dev := range b.children {
		if dev.name.Local != "devices" {
			continue
		}
		for range added {
			last := -1
			for i, c := range dev.children {
				if c.name.Local == "disk" {
					last = i
				}
			}
			if last < 0 {
				t.Fatal("output has fewer disks than added")
			}
			dev.children = slices.Delete(dev.children, last, last+1)
		}
	}
	if a.canonical() == b.canonical() {
		return
	}
	diff(t, "", a, b)
	t.Fatal("the domain lost or changed elements on the way through the hook")
}

// diff reports the children of a and b that have no equal in the other.
func diff(t *testing.T, path string, a, b *node) {
	t.Helper()
	path += "/" + a.name.Local
	if a.canonical() == b.canonical() {
		return
	}
	ka, kb := map[string]*node{}, map[string]*node{}
	for _, c := range a.children {
		ka[c.canonical()] = c
	}
	for _, c := range b.children {
		kb[c.canonical()] = c
	}
	var onlyA, onlyB []*node
	for k, c := range ka {
		if kb[k] == nil {
			onlyA = append(onlyA, c)
		}
	}
	for k, c := range kb {
		if ka[k] == nil {
			onlyB = append(onlyB, c)
		}
	}
	if len(onlyA) == 1 && len(onlyB) == 1 && onlyA[0].name == onlyB[0].name {
		diff(t, path, onlyA[0], onlyB[0])
		return
	}
	if a.text != b.text || fmt.Sprint(a.attrs) != fmt.Sprint(b.attrs) {
		t.Errorf("%s: attributes or text %v %q became %v %q", path, a.attrs, a.text, b.attrs, b.text)
	}
	for _, c := range onlyA {
		t.Errorf("%s: lost %s", path, c.canonical())
	}
	for _, c := range onlyB {
		t.Errorf("%s: gained %s", path, c.canonical())
	}
}
