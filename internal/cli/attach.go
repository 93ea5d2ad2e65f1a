package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

func (a *app) attachCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "attach",
		Aliases: []string{"attachment", "attachments"},
		Short:   "Attach volumes to nodes for NBD access, with a single writer per volume",
		Long: `An attachment lets one node reach every disk of a volume over NBD. Its
clients present the attachment's token in the export name:

    <volume>/<disk>/<token>

A volume has one writer at a time. A newer rw attachment may connect and read
at any time; its first write makes it the writer (the epoch grows by one) and
fences every older attachment: their writes fail and are never applied. See
docs/live-migration.md.`,
	}
	cmd.AddCommand(a.attachCreateCommand(), a.attachListCommand(), a.attachGetCommand(),
		a.attachDeleteCommand(), a.attachWriterCommand())
	return cmd
}

func (a *app) attachCreateCommand() *cobra.Command {
	var mode string
	cmd := &cobra.Command{
		Use:   "create VOLUME NODE",
		Short: "Attach every disk of a volume for a node and print its token",
		Long: `Attach every disk of a volume for a node and print the attachment's token
and the NBD URI of each disk (nbd://host:port/<volume>/<disk>/<token>), ready
for qemu-img, qemu-io, nbdinfo or QEMU's -blockdev. A node attached already is
refused ("already exists"): quiver attach list VOLUME shows it.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			att, err := c.Attach(cmd.Context(), args[0], api.AttachmentSpec{Node: args[1], Mode: mode})
			if err != nil {
				return err
			}
			vol, err := c.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.show(cmd.OutOrStdout(), att, func(w io.Writer) error {
				f := newFields(w)
				f.add("ID", att.ID)
				f.add("Node", att.Node)
				f.add("Mode", att.Mode)
				f.add("Token", att.Token)
				for _, d := range vol.Disks {
					if uri, ok := att.URIs[d.Name]; ok {
						f.add("URI "+d.Name, uri)
					} else { // a server that predates URIs, or serves no NBD
						f.add("Export "+d.Name, args[0]+"/"+d.Name+"/"+att.Token)
					}
				}
				return f.flush()
			})
		},
	}
	cmd.Flags().StringVar(&mode, "mode", api.ModeReadWrite, "rw (may become the writer) or ro (never writes)")
	return cmd
}

func (a *app) attachListCommand() *cobra.Command {
	var selector string
	cmd := a.getter(&cobra.Command{
		Use:     "list [VOLUME] [-l KEY=VALUE,...]",
		Aliases: []string{"ls"},
		Short:   "List the attachments of a volume, or of every volume, with the writer and who is fenced",
		Args:    volumeOrSelector(&selector),
	}, func(ctx context.Context, c *client.Client, args []string) (any, func(io.Writer) error, error) {
		var atts []api.Attachment
		var err error
		if len(args) == 1 {
			atts, err = c.ListAttachments(ctx, args[0])
		} else {
			atts, err = c.FindAttachments(ctx, selector)
		}
		return api.List[api.Attachment]{Items: nonNil(atts)}, a.attachTable(len(args) == 0, atts...), err
	})
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "with no VOLUME: only volumes matching KEY=VALUE[,KEY=VALUE...]")
	return cmd
}

func (a *app) attachGetCommand() *cobra.Command {
	return a.getter(&cobra.Command{
		Use:   "get VOLUME ID",
		Short: "Show one attachment",
		Args:  cobra.ExactArgs(2),
	}, func(ctx context.Context, c *client.Client, args []string) (any, func(io.Writer) error, error) {
		att, err := c.GetAttachment(ctx, args[0], args[1])
		return att, a.attachTable(false, att), err
	})
}

func (a *app) attachDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "delete VOLUME ID",
		Aliases: []string{"rm", "detach"},
		Short:   "Detach: close the attachment's connections and refuse its token",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.Detach(cmd.Context(), args[0], args[1]); err != nil {
				return err
			}
			return a.printDone(cmd.OutOrStdout(), "attachment %s of volume %s detached", args[1], args[0])
		},
	}
}

func (a *app) attachWriterCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "writer VOLUME ID",
		Short: "Give the writer role to an attachment and fence every other",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			att, err := c.TransferWriter(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			vol, err := c.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !a.forPeople() {
				return a.printObject(cmd.OutOrStdout(), att)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "attachment %s (node %s) is the writer of volume %s, epoch %d; every other attachment is fenced\n",
				att.ID, att.Node, args[0], vol.Writer.Epoch)
			return err
		},
	}
}

// attachTable prints attachments as a table.
// With allVolumes (a list across volumes) a VOLUME column comes first.
func (a *app) attachTable(allVolumes bool, atts ...api.Attachment) func(io.Writer) error {
	return func(w io.Writer) error {
		now := a.env.Now()
		header := []string{"ID", "NODE", "MODE", "STATE", "CONNECTIONS", "AGE"}
		if allVolumes {
			header = append([]string{"VOLUME"}, header...)
		}
		if a.wide() {
			header = append(header, "CREATED")
		}
		t := newTable(w, header...)
		for _, at := range atts {
			state := at.State
			if state == "" { // a server that predates the field
				state = api.AttachmentStandby
				switch {
				case at.Mode == api.ModeReadOnly:
					state = api.AttachmentReadOnly
				case at.Fenced:
					state = api.AttachmentFenced
				case at.Writer:
					state = api.AttachmentWriter
				}
			}
			if at.Implicit {
				state += " (implicit)"
			}
			row := []string{at.ID, at.Node, at.Mode, state, fmt.Sprint(at.Conns), age(now, at.CreatedAt)}
			if allVolumes {
				row = append([]string{at.Volume}, row...)
			}
			if a.wide() {
				row = append(row, at.CreatedAt.UTC().Format(time.RFC3339))
			}
			t.row(row...)
		}
		return t.flush()
	}
}
