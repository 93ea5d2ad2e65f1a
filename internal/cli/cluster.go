package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
	"github.com/quiverstorage/quiver/internal/tlscert"
)

func (a *app) clusterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Set up a cluster's nodes (docs/cluster.md)",
	}
	cmd.AddCommand(a.clusterCertsCommand())
	return cmd
}

// The files of `quiver cluster certs` in its --out directory.
const (
	caCertFile, caKeyFile = "ca.crt", "ca.key"
	adminName             = "admin"
)

func (a *app) clusterCertsCommand() *cobra.Command {
	var (
		out          string
		nodes        []string
		days, caDays int
	)
	cmd := &cobra.Command{
		Use:   "certs --out DIR --node NAME=HOST[,HOST...] [--node ...]",
		Short: "Make the CA and the certificates that secure a cluster's etcd with TLS",
		Long: `Make, in DIR, the certificates that put a cluster's etcd on TLS with client
certificates (docs/cluster.md, "Securing etcd"), with no server running:

  ca.crt, ca.key          the cluster's CA (made once: an existing pair in DIR
                          is reused, so later nodes get certificates of the
                          same CA)
  NAME.crt, NAME.key      each --node's certificate, for its etcd member's
                          client and peer listeners and for its etcd client
                          (server and client use); its names are the HOSTs
                          given (IP addresses or DNS names) and loopback
                          (127.0.0.1, ::1, localhost)
  admin.crt, admin.key    a client certificate for etcdctl and other tools

Keys are written 0600, certificates 0644, each atomically (temporary file,
fsync, rename). Copy NAME.crt, NAME.key and ca.crt to the node NAME and start
it with
  quiver server --etcd-cert NAME.crt --etcd-key NAME.key --etcd-ca ca.crt ...
Keep ca.key off the nodes: it makes certificates that etcd accepts.`,
		Example: `  quiver cluster certs --out ./certs --node n1=10.0.0.11,store1.example --node n2=10.0.0.12 --node n3=10.0.0.13`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("--out DIR is required")
			}
			if len(nodes) == 0 {
				return errors.New("give at least one --node NAME=HOST[,HOST...]")
			}
			if days <= 0 || caDays <= 0 {
				return errors.New("--days and --ca-days must be positive")
			}
			reqs, err := parseCertNodes(nodes)
			if err != nil {
				return err
			}
			return makeClusterCerts(cmd.OutOrStdout(), out, reqs, time.Duration(days)*24*time.Hour,
				time.Duration(caDays)*24*time.Hour)
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "directory of the CA and the certificates (made 0700 if absent)")
	f.StringArrayVar(&nodes, "node", nil,
		"a node and the addresses its etcd is reached at: NAME=HOST[,HOST...] (repeat for each node)")
	f.IntVar(&days, "days", 3*365, "days the node and admin certificates are valid")
	f.IntVar(&caDays, "ca-days", 10*365, "days a new CA is valid")
	return cmd
}

// certNode is one --node: a node name and its certificate's hosts.
type certNode struct {
	name  string
	hosts []string
}

// parseCertNodes reads the --node values.
func parseCertNodes(values []string) ([]certNode, error) {
	var out []certNode
	seen := map[string]bool{adminName: true, "ca": true}
	for _, v := range values {
		name, list, ok := strings.Cut(v, "=")
		if !ok || list == "" {
			return nil, fmt.Errorf("--node %q: want NAME=HOST[,HOST...]", v)
		}
		if len(validation.IsDNS1123Label(name)) > 0 {
			return nil, fmt.Errorf("--node %q: the name %q must be a DNS label (the node's --node-name)", v, name)
		}
		if seen[name] {
			return nil, fmt.Errorf("--node %q: the name %q is given twice or is reserved (admin, ca)", v, name)
		}
		seen[name] = true
		n := certNode{name: name}
		for h := range strings.SplitSeq(list, ",") {
			h = strings.TrimSpace(h)
			if h == "" || strings.ContainsAny(h, "/:= ") && net.ParseIP(h) == nil {
				return nil, fmt.Errorf("--node %q: host %q: want an IP address or a DNS name", v, h)
			}
			n.hosts = append(n.hosts, h)
		}
		out = append(out, n)
	}
	return out, nil
}

// loopbackHosts are in every node's certificate: a node's client reaches
// its own embedded member on loopback.
var loopbackHosts = []string{"127.0.0.1", "::1", "localhost"}

// makeClusterCerts writes the CA (or reuses the one in dir), a certificate
// per node and the admin's into dir, and says what it wrote on w.
func makeClusterCerts(w io.Writer, dir string, nodes []certNode, validFor, caValidFor time.Duration) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	fsys, err := storage.OpenOS(dir)
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	defer fsys.Close()
	ca, made, err := loadOrMakeCA(fsys, dir, caValidFor)
	if err != nil {
		return err
	}
	if made {
		fmt.Fprintf(w, "CA %s (%s, %s) made, valid until %s\n", ca.Cert.Subject.CommonName,
			filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile), ca.Cert.NotAfter.Format(time.DateOnly))
	} else {
		fmt.Fprintf(w, "CA %s (%s) reused\n", ca.Cert.Subject.CommonName, filepath.Join(dir, caCertFile))
	}
	issue := func(name string, hosts []string, usage tlscert.Usage) error {
		cert, key, err := ca.Issue(name, hosts, usage, validFor)
		if err != nil {
			return err
		}
		if err := writePair(fsys, name+".crt", cert, name+".key", key); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s: %s, %s", name, filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
		if len(hosts) > 0 {
			fmt.Fprintf(w, " for %s", strings.Join(hosts, ", "))
		}
		fmt.Fprintln(w)
		return nil
	}
	for _, n := range nodes {
		if err := issue(n.name, slices.Concat(n.hosts, loopbackHosts), tlscert.ServerAuth|tlscert.ClientAuth); err != nil {
			return err
		}
	}
	if err := issue(adminName, nil, tlscert.ClientAuth); err != nil {
		return err
	}
	fmt.Fprintf(w, "start each node NAME with --etcd-cert NAME.crt --etcd-key NAME.key --etcd-ca %s (copied to it)\n", caCertFile)
	return nil
}

// loadOrMakeCA reads dir's CA, or makes one when dir has neither of its
// files. It says whether it made it.
func loadOrMakeCA(fsys storage.FS, dir string, validFor time.Duration) (*tlscert.Authority, bool, error) {
	certPEM, cerr := os.ReadFile(filepath.Join(dir, caCertFile))
	keyPEM, kerr := os.ReadFile(filepath.Join(dir, caKeyFile))
	switch {
	case cerr == nil && kerr == nil:
		ca, err := tlscert.LoadAuthority(certPEM, keyPEM)
		if err != nil {
			return nil, false, fmt.Errorf("the CA in %s: %w", dir, err)
		}
		return ca, false, nil
	case errors.Is(cerr, fs.ErrNotExist) && errors.Is(kerr, fs.ErrNotExist):
	case cerr != nil && !errors.Is(cerr, fs.ErrNotExist):
		return nil, false, fmt.Errorf("read the CA: %w", cerr)
	case kerr != nil && !errors.Is(kerr, fs.ErrNotExist):
		return nil, false, fmt.Errorf("read the CA key: %w", kerr)
	default:
		return nil, false, fmt.Errorf("%s holds only one of %s and %s: restore the other, or move both away to make a new CA",
			dir, caCertFile, caKeyFile)
	}
	ca, key, err := tlscert.NewAuthority("quiver etcd CA "+time.Now().UTC().Format(time.DateOnly), validFor)
	if err != nil {
		return nil, false, err
	}
	if err := writePair(fsys, caCertFile, ca.CertPEM, caKeyFile, key); err != nil {
		return nil, false, err
	}
	return ca, true, nil
}

// writePair writes a key (0600) and then its certificate (0644), each
// atomically and durably.
func writePair(fsys storage.FS, certName string, cert []byte, keyName string, key []byte) error {
	if err := durable.WriteFile(fsys, keyName, key, 0o600); err != nil {
		return err
	}
	return durable.WriteFile(fsys, certName, cert, 0o644)
}
