package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/quantity"
)

func (a *app) tokenCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "token",
		Aliases: []string{"tokens"},
		Short:   "Manage API tokens: each acts for a tenant with a role (admin only; docs/security.md)",
	}
	cmd.AddCommand(a.tokenCreateCommand(), a.tokenListCommand(), a.tokenRevokeCommand())
	return cmd
}

func (a *app) tokenCreateCommand() *cobra.Command {
	var spec api.TokenSpec
	var certFile string
	cmd := &cobra.Command{
		Use:   "create --role ROLE [--tenant TENANT] [--cert FILE]",
		Short: "Make a token; its secret is printed this once (the server keeps only its hash)",
		Long: `Make an API token. Roles:
  admin    everything, every tenant (no --tenant)
  tenant   manage the tenant's volumes: create, change, snapshot, clone, delete, attach
  attach   read the tenant's volumes, attach and detach, open NBD exports (a CSI node plugin)
  monitor  read only; without --tenant the whole node (pool, usage, jobs, metrics)

The secret is printed once, on the last line of the table (or as "secret" with
-o json/yaml); store it 0600 and pass it with --token-file.

With --cert, the token has no secret: the client certificate in FILE (PEM,
the client's own certificate), presented with mutual TLS (--nbd-tls-client-ca
on the server) over NBD or the HTTPS API (quiver --cert-file, --key-file),
acts for the tenant with the role, as the token would. Only its SHA-256
fingerprint is stored; revoking the token ends that certificate's NBD and API
connections.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if certFile != "" {
				b, err := os.ReadFile(certFile)
				if err != nil {
					return fmt.Errorf("--cert: %w", err)
				}
				spec.Certificate = string(b)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := c.CreateToken(cmd.Context(), spec)
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), t, func(w io.Writer) error {
				if err := a.tokenTable([]api.Token{t})(w); err != nil {
					return err
				}
				if t.CertSHA256 != "" {
					_, err := fmt.Fprintf(w, "certificate sha256: %s\n", t.CertSHA256)
					return err
				}
				_, err := fmt.Fprintf(w, "secret: %s\n", t.Secret)
				return err
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&spec.Role, "role", "", "admin, tenant, attach or monitor (required)")
	f.StringVar(&spec.Tenant, "tenant", "", "the tenant the token acts for (required for tenant and attach)")
	f.StringVar(&spec.Description, "description", "", "what the token is for (shown by token list)")
	f.StringVar(&certFile, "cert", "", "make a certificate token for the client certificate in this PEM file (no secret)")
	_ = cmd.MarkFlagRequired("role")
	return cmd
}

func (a *app) tokenListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the tokens: ID, tenant, role, description (never their secrets)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ts, err := c.ListTokens(cmd.Context())
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), api.List[api.Token]{Items: nonNil(ts)}, a.tokenTable(ts))
		},
	}
}

func (a *app) tokenRevokeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID...",
		Short: "Revoke tokens: their next request is refused and their API and NBD connections end",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.RevokeToken(cmd.Context(), id); err != nil {
					return fmt.Errorf("revoke %s: %w", id, err)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "token %s revoked\n", id)
			}
			return nil
		},
	}
}

func (a *app) tokenTable(ts []api.Token) func(io.Writer) error {
	return func(w io.Writer) error {
		t := newTable(w, "ID", "TENANT", "ROLE", "CREDENTIAL", "DESCRIPTION", "AGE")
		now := a.env.Now()
		for _, x := range ts {
			cred := "secret"
			if x.CertSHA256 != "" {
				cred = "cert " + x.CertSHA256[:min(16, len(x.CertSHA256))]
			}
			t.row(x.ID, dash(x.Tenant), x.Role, cred, dash(x.Description), age(now, x.CreatedAt))
		}
		return t.flush()
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (a *app) tenantCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "tenant",
		Aliases: []string{"tenants"},
		Short:   "List tenants and set their quotas (admin only; docs/security.md)",
	}
	cmd.AddCommand(a.tenantListCommand(), a.tenantSetCommand())
	return cmd
}

func (a *app) tenantListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the tenants with what they use of their quotas",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ts, err := c.ListTenants(cmd.Context())
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), api.List[api.Tenant]{Items: nonNil(ts)}, tenantTable(ts))
		},
	}
}

func (a *app) tenantSetCommand() *cobra.Command {
	var volumes, snapshots, iops int64
	var capacity string
	cmd := &cobra.Command{
		Use:   "set TENANT [--volumes N] [--capacity SIZE] [--snapshots N] [--iops N]",
		Short: "Set a tenant's quotas (0: unlimited); each flag not given is set to 0",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			q := api.Quota{Volumes: volumes, Snapshots: snapshots, IOPS: iops}
			if capacity != "" {
				n, err := quantity.Parse(capacity)
				if err != nil {
					return fmt.Errorf("--capacity %q: %w", capacity, err)
				}
				q.Capacity = n
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := c.SetTenant(cmd.Context(), args[0], api.TenantSpec{Quota: q})
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), t, tenantTable([]api.Tenant{t}))
		},
	}
	f := cmd.Flags()
	f.Int64Var(&volumes, "volumes", 0, "most volumes")
	f.StringVar(&capacity, "capacity", "", "most capacity, summed over the volumes (e.g. 10Ti)")
	f.Int64Var(&snapshots, "snapshots", 0, "most snapshots, summed over the volumes")
	f.Int64Var(&iops, "iops", 0, "most QoS IOPS, summed over the volumes (each then needs an IOPS limit)")
	return cmd
}

func tenantTable(ts []api.Tenant) func(io.Writer) error {
	return func(w io.Writer) error {
		t := newTable(w, "TENANT", "VOLUMES", "CAPACITY", "SNAPSHOTS", "IOPS")
		for _, x := range ts {
			iops := fmt.Sprint(x.Used.IOPS)
			if x.Used.IOPS < 0 {
				iops = "unlimited"
			}
			q := x.Quota
			t.row(x.Name, used(fmt.Sprint(x.Used.Volumes), q.Volumes, fmt.Sprint(q.Volumes)),
				used(quantity.Format(x.Used.Capacity), q.Capacity, quantity.Format(q.Capacity)),
				used(fmt.Sprint(x.Used.Snapshots), q.Snapshots, fmt.Sprint(q.Snapshots)),
				used(iops, q.IOPS, fmt.Sprint(q.IOPS)))
		}
		return t.flush()
	}
}

// used renders "use/limit", or "use" when the quota is unlimited (0).
func used(use string, limit int64, limitText string) string {
	if limit <= 0 {
		return use
	}
	return use + "/" + limitText
}
