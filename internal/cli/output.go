package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/quantity"
)

// Values of --output, as kubectl names them.
const (
	outputTable = "table" // columns for people
	outputWide  = "wide"  // the table with more columns
	outputJSON  = "json"
	outputYAML  = "yaml"
	outputName  = "name" // kind/name, a line each, for scripts
)

var outputFormats = []string{outputTable, outputWide, outputJSON, outputYAML, outputName}

// checkOutput refuses an --output value quiver does not know.
func checkOutput(format string) error {
	if slices.Contains(outputFormats, format) {
		return nil
	}
	return fmt.Errorf("--output %q: want one of %s", format, strings.Join(outputFormats, ", "))
}

// forPeople says the output is a table, so confirmations and hints print;
// the other formats print only the objects.
func (a *app) forPeople() bool { return a.output == outputTable || a.output == outputWide }

// wide says tables get their extra columns.
func (a *app) wide() bool { return a.output == outputWide }

// none stands for an empty cell.
const none = "<none>"

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printYAML writes v as YAML, with the field names of its JSON form.
func printYAML(w io.Writer, v any) error {
	out, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}

// printObject writes v in a machine format: json, yaml or name.
func (a *app) printObject(w io.Writer, v any) error {
	switch a.output {
	case outputYAML:
		return printYAML(w, v)
	case outputName:
		names, err := objectNames(v)
		if err != nil {
			return err
		}
		for _, n := range names {
			if _, err := fmt.Fprintln(w, n); err != nil {
				return err
			}
		}
		return nil
	}
	return printJSON(w, v)
}

// show prints v in the format of --output: for people, what table writes
// (an empty list says so on stderr, as kubectl does, and prints nothing on
// stdout); else v as JSON, YAML or kind/name lines.
func (a *app) show(w io.Writer, v any, table func(io.Writer) error) error {
	if !a.forPeople() {
		return a.printObject(w, v)
	}
	if kind, n := listOf(v); kind != "" && n == 0 {
		_, err := fmt.Fprintf(a.env.Stderr, "No %ss found.\n", kind)
		return err
	}
	return table(w)
}

// errNoName is -o name for an answer that is not a named object.
var errNoName = errors.New("-o name needs objects with names; use -o json or -o yaml here")

// listOf returns the kind of the items and their count when v is an
// api.List, else "".
func listOf(v any) (kind string, n int) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Struct || !strings.HasPrefix(rv.Type().Name(), "List[") {
		return "", 0
	}
	items := rv.FieldByName("Items")
	if !items.IsValid() || items.Kind() != reflect.Slice {
		return "", 0
	}
	return kindOf(items.Type().Elem()), items.Len()
}

// kindOf names the kind of an API object for people and for -o name.
func kindOf(t reflect.Type) string { return strings.ToLower(t.Name()) }

// objectNames renders v, an API object or an api.List of them, as
// kind/name lines: volume/web01, snapshot/web01@nightly,
// attachment/web01/<id>, job/<id>.
func objectNames(v any) ([]string, error) {
	rv := reflect.ValueOf(v)
	if _, n := listOf(v); n > 0 || rv.Kind() == reflect.Struct && strings.HasPrefix(rv.Type().Name(), "List[") {
		items := rv.FieldByName("Items")
		names := make([]string, 0, items.Len())
		for i := range items.Len() {
			name, err := objectName(items.Index(i).Interface())
			if err != nil {
				return nil, err
			}
			names = append(names, name)
		}
		return names, nil
	}
	name, err := objectName(v)
	if err != nil {
		return nil, err
	}
	return []string{name}, nil
}

func objectName(v any) (string, error) {
	switch o := v.(type) {
	case api.Volume:
		return "volume/" + o.Name, nil
	case api.Snapshot:
		return "snapshot/" + o.Volume + "@" + o.Name, nil
	case api.Attachment:
		return "attachment/" + o.Volume + "/" + o.ID, nil
	case api.Job:
		return "job/" + o.ID, nil
	case api.Token:
		return "token/" + o.ID, nil
	case api.Tenant:
		return "tenant/" + o.Name, nil
	}
	return "", errNoName
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
