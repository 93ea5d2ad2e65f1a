package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

func (a *app) rollbackCommand() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rollback VOLUME SNAPSHOT",
		Short: "Return every disk of a volume to a snapshot",
		Long: `Return every disk of a volume to a snapshot. What was written since is lost.

While writers are connected to the volume (a running VM: a rollback under it
corrupts its filesystems) the server refuses; stop them first, or pass --force.

The command waits for the rollback, showing its progress on a terminal.
Ctrl-C cancels it on the server.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			vol, snap := args[0], args[1]
			c, err := a.client()
			if err != nil {
				return err
			}
			job, err := c.StartRollback(cmd.Context(), vol, snap, forceOpts(force)...)
			if err != nil {
				return err
			}
			if _, err := a.wait(cmd.Context(), c, job); err != nil {
				return err
			}
			if a.forPeople() {
				return a.printDone(cmd.OutOrStdout(), "volume %s rolled back to snapshot %s", vol, snap)
			}
			v, err := c.GetVolume(cmd.Context(), vol)
			if err != nil {
				return fmt.Errorf("volume %s was rolled back, but reading it back failed: %w", vol, err)
			}
			return a.printObject(cmd.OutOrStdout(), v)
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "roll back even while writers are connected to the volume")
	return cmd
}

// forceOpts turns a --force flag into the request option.
func forceOpts(force bool) []client.CallOption {
	if force {
		return []client.CallOption{client.Force()}
	}
	return nil
}

func (a *app) cloneCommand() *cobra.Command {
	var labels []string
	cmd := &cobra.Command{
		Use:   "clone SOURCE NAME...",
		Short: "Make volumes from a snapshot (VOLUME@SNAPSHOT) or a live volume",
		Long: `Make one or many new volumes from a snapshot (VOLUME@SNAPSHOT) or from a live
volume (VOLUME, through an implicit snapshot).

Names take bash-like brace ranges, padded as written: vdi-{001..500} is
vdi-001 … vdi-500. Quote them so that the shell leaves them to quiver.
One clone makes at most ` + fmt.Sprint(api.MaxBulkClones) + ` volumes.

The command waits for the clones, showing their progress on a terminal.
Ctrl-C cancels the job on the server.`,
		Example: `  quiver clone golden@v1 'vdi-{001..500}' --label pool=vdi
  quiver clone web01 web01-test`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := parseSource(args[0])
			if err != nil {
				return err
			}
			names, err := expandAll(args[1:])
			if err != nil {
				return err
			}
			spec := api.CloneSpec{Source: src, Names: names}
			if spec.Labels, err = parseLabels(labels); err != nil {
				return fmt.Errorf("--label: %w", err)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			job, err := c.StartClone(cmd.Context(), spec)
			if err != nil {
				return err
			}
			if _, err := a.wait(cmd.Context(), c, job); err != nil {
				return err
			}
			vols, err := clonedVolumes(cmd, c, names)
			if err != nil {
				return fmt.Errorf("%d clones were made, but reading them back failed: %w", len(names), err)
			}
			return a.show(cmd.OutOrStdout(), api.List[api.Volume]{Items: vols}, a.volumeTable(vols...))
		},
	}
	cmd.Flags().StringArrayVar(&labels, "label", nil, "a label of every clone, as KEY=VALUE (repeatable)")
	return cmd
}

// clonedVolumes reads back the volumes a clone made, in the order of names,
// with one list request rather than one request per clone (and one for
// each clone the list lacks).
func clonedVolumes(cmd *cobra.Command, c *client.Client, names []string) ([]api.Volume, error) {
	all, err := c.ListVolumes(cmd.Context(), "")
	if err != nil {
		return nil, err
	}
	byName := make(map[string]api.Volume, len(all))
	for _, v := range all {
		byName[v.Name] = v
	}
	vols := make([]api.Volume, 0, len(names))
	for _, n := range names {
		v, ok := byName[n]
		if !ok {
			// A cluster node lists its own copies: a clone placed on
			// other nodes (made by the source's primary) is read by name.
			if v, err = c.GetVolume(cmd.Context(), n); err != nil {
				return nil, fmt.Errorf("volume %q: %w", n, err)
			}
		}
		vols = append(vols, v)
	}
	return vols, nil
}
