package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/quantity"
)

// qosLimit is one of the six QoS limits as the command line names it.
type qosLimit struct {
	flag   string // without the "qos-" prefix that `volume create` adds
	header string // table column
	help   string
	field  func(*api.QoS) *int64
}

// bandwidth says the limit is in MB/s (else in operations per second).
func (l qosLimit) bandwidth() bool { return strings.HasSuffix(l.flag, "-mbytes") }

// limitValue is a QoS flag's value. A plain number is the limit in the
// flag's unit (operations, or MB = 10^6 bytes, per second). A bandwidth
// also takes a size per second as people write it ("48Mi", "1G"), which is
// rounded to the nearest MB/s (1 at least); a rate of operations also takes
// a quantity ("2k" is 2000).
type limitValue struct {
	p         *int64
	bandwidth bool
}

func (v limitValue) String() string { return strconv.FormatInt(*v.p, 10) }

func (v limitValue) Type() string {
	if v.bandwidth {
		return "MB/s"
	}
	return "IOPS"
}

func (v limitValue) Set(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return fmt.Errorf("%d: must be 0 (unlimited) or more", n)
		}
		*v.p = n
		return nil
	}
	n, err := quantity.Parse(s)
	if err != nil {
		if v.bandwidth {
			return fmt.Errorf("%q: want MB per second (e.g. 50) or a size per second (e.g. 50M, 48Mi)", s)
		}
		return fmt.Errorf("%q: want operations per second (e.g. 500 or 2k)", s)
	}
	if v.bandwidth {
		mb := (n + 500_000) / 1_000_000
		if mb == 0 && n > 0 {
			mb = 1
		}
		n = mb
	}
	*v.p = n
	return nil
}

// qosLimits lists the limits in the order they are shown.
var qosLimits = []qosLimit{
	{"rw-iops", "RW IOPS", "operations per second, reads and writes together",
		func(q *api.QoS) *int64 { return &q.RWIOPS }},
	{"rw-mbytes", "RW MB/S", "MB (10^6 bytes) per second, reads and writes together",
		func(q *api.QoS) *int64 { return &q.RWMBytes }},
	{"read-iops", "READ IOPS", "read operations per second",
		func(q *api.QoS) *int64 { return &q.ReadIOPS }},
	{"write-iops", "WRITE IOPS", "write operations per second (trim and zero count as writes)",
		func(q *api.QoS) *int64 { return &q.WriteIOPS }},
	{"read-mbytes", "READ MB/S", "MB (10^6 bytes) read per second",
		func(q *api.QoS) *int64 { return &q.ReadMBytes }},
	{"write-mbytes", "WRITE MB/S", "MB (10^6 bytes) written per second",
		func(q *api.QoS) *int64 { return &q.WriteMBytes }},
}

// qosFlags binds the six limits to flags named prefix+limit.flag.
type qosFlags struct {
	prefix string
	values api.QoS
}

func addQoSFlags(cmd *cobra.Command, prefix, scope string) *qosFlags {
	q := &qosFlags{prefix: prefix}
	for _, l := range qosLimits {
		cmd.Flags().Var(limitValue{p: l.field(&q.values), bandwidth: l.bandwidth()}, prefix+l.flag, l.help+scope+" (0: unlimited)")
	}
	return q
}

// changed returns the limits whose flags were given, in qosLimits order.
func (q *qosFlags) changed(cmd *cobra.Command) []qosLimit {
	var out []qosLimit
	for _, l := range qosLimits {
		if cmd.Flags().Changed(q.prefix + l.flag) {
			out = append(out, l)
		}
	}
	return out
}

// spec returns the limits for a VolumeSpec: nil when none is set.
func (q *qosFlags) spec() *api.QoS {
	if q.values == (api.QoS{}) {
		return nil
	}
	v := q.values
	return &v
}

func (a *app) volumeQoSCommand() *cobra.Command {
	var clearAll bool
	var flags *qosFlags
	cmd := &cobra.Command{
		Use:   "qos NAME [--rw-iops N] [--rw-mbytes N] [--read-iops N] [--write-iops N] [--read-mbytes N] [--write-mbytes N] [--clear]",
		Short: "Show or change the I/O limits of a volume (one budget for all its disks)",
		Long: `Show or change the QoS limits of a volume. The limits are one budget for the
whole VM: all its disks together. They change live: requests not yet admitted
run at the new rate at once.

With no flag, show the limits. Each flag given sets that limit and keeps the
others (0 removes it); --clear removes every limit not given with it.`,
		Example: `  quiver volume qos web01                            # show
  quiver volume qos web01 --rw-iops 500 --rw-mbytes 50
  quiver volume qos web01 --rw-mbytes 0              # remove one limit
  quiver volume qos web01 --clear                    # remove all limits`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			changed := flags.changed(cmd)
			c, err := a.client()
			if err != nil {
				return err
			}
			var limits api.QoS
			if !clearAll {
				v, err := c.GetVolume(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if v.QoS != nil {
					limits = *v.QoS
				}
				if len(changed) == 0 {
					return a.show(cmd.OutOrStdout(), limits, qosTable(v.Name, limits))
				}
			}
			// The API replaces all limits at once: start from the current
			// ones (or none with --clear) and apply the flags given.
			for _, l := range changed {
				*l.field(&limits) = *l.field(&flags.values)
			}
			v, err := c.UpdateVolume(cmd.Context(), args[0], api.VolumeUpdate{QoS: &limits})
			if err != nil {
				return err
			}
			if v.QoS != nil {
				limits = *v.QoS
			} else {
				limits = api.QoS{}
			}
			return a.show(cmd.OutOrStdout(), limits, qosTable(v.Name, limits))
		},
	}
	flags = addQoSFlags(cmd, "", "")
	cmd.Flags().BoolVar(&clearAll, "clear", false, "remove every limit not given with it")
	return cmd
}

// qosTable prints a volume's limits as a one-row table.
func qosTable(volume string, q api.QoS) func(io.Writer) error {
	return func(w io.Writer) error {
		header := []string{"VOLUME"}
		row := []string{volume}
		for _, l := range qosLimits {
			header = append(header, l.header)
			row = append(row, limitCell(*l.field(&q)))
		}
		t := newTable(w, header...)
		t.row(row...)
		return t.flush()
	}
}

func limitCell(v int64) string {
	if v == 0 {
		return "unlimited"
	}
	return fmt.Sprint(v)
}

// formatQoS renders limits as the flags that set them, e.g.
// "rw-iops=500,rw-mbytes=50", or "unlimited".
func formatQoS(q *api.QoS) string {
	if q == nil || *q == (api.QoS{}) {
		return "unlimited"
	}
	var parts []string
	for _, l := range qosLimits {
		if v := *l.field(q); v != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", l.flag, v))
		}
	}
	return strings.Join(parts, ",")
}
