package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/quantity"
)

// Values of --output.
const (
	outputTable = "table"
	outputJSON  = "json"
)

// none stands for an empty cell.
const none = "<none>"

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// show prints v as JSON with -o json, else what table writes for people.
func (a *app) show(w io.Writer, v any, table func(io.Writer) error) error {
	if a.output == outputJSON {
		return printJSON(w, v)
	}
	return table(w)
}

// table writes aligned columns; call flush when done.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// fields writes "Key:  value" lines, aligned.
type fields struct{ tw *tabwriter.Writer }

func newFields(w io.Writer) *fields {
	return &fields{tw: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
}

func (f *fields) add(key, value string) {
	fmt.Fprintf(f.tw, "%s:\t%s\n", key, value)
}

func (f *fields) flush() error { return f.tw.Flush() }

// formatLabels renders labels as k=v,k2=v2 in key order.
func formatLabels(labels map[string]string) string {
	if len(labels) == 0 {
		return none
	}
	parts := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}

// formatDisks renders disks as name=size,… the way `volume create` takes them.
func formatDisks(disks []api.Disk) string {
	if len(disks) == 0 {
		return none
	}
	parts := make([]string, 0, len(disks))
	for _, d := range disks {
		p := d.Name + "=" + quantity.Format(d.Size)
		if d.Shared {
			p += "(shared)"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ",")
}

// diskTotal is the sum of the disks' virtual sizes.
func diskTotal(disks []api.Disk) int64 {
	var total int64
	for _, d := range disks {
		total += d.Size
	}
	return total
}

// age renders how long ago t was, in its largest unit: 45s, 12m, 5h, 3d.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
}

// timestamp renders t with how long ago it was.
func timestamp(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%s (%s ago)", t.Local().Format(time.RFC3339), age(now, t))
}

// source renders where a clone came from: vol@snap, or vol for a live clone.
func source(s *api.Source) string {
	if s == nil {
		return none
	}
	if s.Snapshot == "" {
		return s.Volume
	}
	return s.Volume + "@" + s.Snapshot
}
