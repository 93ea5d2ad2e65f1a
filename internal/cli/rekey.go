package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/quantity"
)

func (a *app) volumeRekeyCommand() *cobra.Command {
	var deep bool
	var provider, rate string
	cmd := &cobra.Command{
		Use:   "rekey NAME [--deep [--rate SIZE]] [--provider NAME]",
		Short: "Put an encrypted volume under a new key: a new KEK, or with --deep a new data key",
		Long: `Rekey an encrypted volume.

Without --deep (a shallow rekey) the volume's data key is wrapped under a new
key-encryption key in the key manager, in --provider if given (moving the VM
from the key file to a KMIP server, say), and the old KEK is destroyed. No
block changes; it takes a round trip or two to the key manager.

With --deep, a new data key is drawn and every block of every disk is
re-encrypted under it while the VM runs, at most --rate per second; then the
old KEK is destroyed. Snapshots would keep the old key, so a volume with
snapshots is refused: delete them first. Clones keep their own copy of the old
data key. Meanwhile snapshots, clones and disk changes are refused. A crash or
a cancel midway leaves every block readable; run the command again to go on
where it stopped. The command waits, showing its progress on a terminal;
Ctrl-C cancels it on the server.`,
		Example: `  quiver volume rekey vault
  quiver volume rekey vault --provider kmip
  quiver volume rekey vault --deep --rate 200Mi`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := api.RekeySpec{Deep: deep, Provider: provider}
			if rate != "" {
				if !deep {
					return fmt.Errorf("--rate paces a deep rekey: give --deep too")
				}
				n, err := quantity.Parse(rate)
				if err != nil || n <= 0 {
					return fmt.Errorf("--rate %q: want a size per second, such as 100Mi", rate)
				}
				spec.Rate = n
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			name := args[0]
			if !deep {
				v, err := c.Rekey(cmd.Context(), name, spec)
				if err != nil {
					return err
				}
				if a.forPeople() {
					return a.printDone(cmd.OutOrStdout(), "volume %s: data key now wrapped by KEK %s of %s; the old KEK is destroyed",
						name, v.Encryption.KeyID, v.Encryption.Provider)
				}
				return a.printObject(cmd.OutOrStdout(), v)
			}
			job, err := c.StartRekey(cmd.Context(), name, spec)
			if err != nil {
				return err
			}
			if _, err := a.wait(cmd.Context(), c, job); err != nil {
				return err
			}
			v, err := c.GetVolume(cmd.Context(), name)
			if err != nil {
				return fmt.Errorf("volume %s was rekeyed, but reading it back failed: %w", name, err)
			}
			if a.forPeople() {
				return a.printDone(cmd.OutOrStdout(), "volume %s: every block re-encrypted under a new data key, wrapped by KEK %s of %s; the old KEK is destroyed",
					name, v.Encryption.KeyID, v.Encryption.Provider)
			}
			return a.printObject(cmd.OutOrStdout(), v)
		},
	}
	cmd.Flags().BoolVar(&deep, "deep", false, "draw a new data key and re-encrypt every block (online)")
	cmd.Flags().StringVar(&provider, "provider", "", "key provider of the new KEK (shallow only; default: the current one)")
	cmd.Flags().StringVar(&rate, "rate", "", "with --deep: re-encrypt at most this much per second (default 64Mi)")
	return cmd
}
