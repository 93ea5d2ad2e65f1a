package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/quantity"
)

func (a *app) diskCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "disk",
		Aliases: []string{"disks"},
		Short:   "Add, grow and remove the disks of a volume",
	}
	cmd.AddCommand(a.diskAddCommand(), a.diskGrowCommand(), a.diskRemoveCommand())
	return cmd
}

func (a *app) diskAddCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "add VOLUME NAME=SIZE",
		Short:   "Add a disk to a volume",
		Example: "  quiver disk add web01 logs=20Gi",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := parseDisk(args[1])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.AddDisk(cmd.Context(), args[0], spec)
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), v, a.volumeDetail(v))
		},
	}
}

func (a *app) diskGrowCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "grow VOLUME NAME SIZE",
		Short:   "Grow a disk to SIZE (it cannot shrink)",
		Example: "  quiver disk grow web01 data 150Gi",
		Args:    cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := quantity.Parse(args[2])
			if err != nil {
				return fmt.Errorf("disk %s: %w", args[1], err)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.GrowDisk(cmd.Context(), args[0], args[1], size)
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), v, a.volumeDetail(v))
		},
	}
}

func (a *app) diskRemoveCommand() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:     "remove VOLUME NAME",
		Aliases: []string{"rm"},
		Short:   "Remove a disk and its data from a volume",
		Long: `Remove a disk and its data from a volume. While writers are connected to the
volume the server refuses; stop them first, or pass --force.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.RemoveDisk(cmd.Context(), args[0], args[1], forceOpts(force)...)
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), v, a.volumeDetail(v))
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove the disk even while writers are connected to the volume")
	return cmd
}
