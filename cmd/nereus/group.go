package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/client"
)

func init() {
	extraCommands = append(extraCommands, newGroupCmd)
}

func newGroupCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "group", Short: "List and describe consumer groups with members; delete groups"}
	cmd.AddCommand(newGroupListCmd(), newGroupDescribeCmd(), newGroupDeleteCmd())
	return cmd
}

func groups(cmd *cobra.Command, name string) ([]client.GroupInfo, error) {
	c, opts, err := dial(cmd.Context(), cmd)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := withTimeout(cmd.Context(), opts.RequestTimeout)
	defer cancel()
	return c.Groups(ctx, name)
}

func newGroupListCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the groups with JOINed members",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			gs, err := groups(cmd, "")
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeGroupsJSON(out, gs)
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "GROUP\tMODE\tMEMBERS\tMEMBERSHIP EPOCH\tASSIGNMENT EPOCH\tPENDING NOTICES")
			for _, g := range gs {
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\n", g.Name, g.Mode, len(g.Members), g.MembershipEpoch, g.AssignmentEpoch, len(g.Pending))
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	return cmd
}

func newGroupDescribeCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "describe GROUP",
		Short: "Show a group's members, their partitions and epochs, pending notices, ack floors and lag",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			gs, err := groups(cmd, args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeGroupsJSON(out, gs)
			}
			for _, g := range gs {
				fmt.Fprintf(out, "group %s (%s): membership epoch %d, assignment epoch %d\n", g.Name, g.Mode, g.MembershipEpoch, g.AssignmentEpoch)
				w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "MEMBER\tINCARNATION\tTOPICS\tPARTITIONS (topic/partition@epoch)")
				for _, m := range g.Members {
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", m.ID, m.Incarnation, strings.Join(m.Topics, ","), heldList(m.Partitions))
				}
				if err := w.Flush(); err != nil {
					return err
				}
				for _, n := range g.Pending {
					fmt.Fprintf(out, "pending %s #%d to %s: %s\n", n.Kind, n.ID, n.Member, heldList(n.Partitions))
				}
				if len(g.Partitions) > 0 {
					w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
					fmt.Fprintln(w, "TOPIC\tPARTITION\tACK FLOOR\tCOMMIT\tLAG")
					for _, p := range g.Partitions {
						fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\n", p.Topic, p.Partition, p.AckFloor, p.CommitSeq, p.Lag)
					}
					if err := w.Flush(); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	return cmd
}

func newGroupDeleteCmd() *cobra.Command {
	var force bool
	var incarnation uint64
	cmd := &cobra.Command{
		Use:   "delete GROUP",
		Short: "Delete a group that has no members, and its acks: the name starts afresh",
		Long: `Delete a group that has no members, and its acks: the name starts afresh.

The delete names the group's incarnation (its life since the name was last
deleted; printed on success) and is retried within --timeout; a delete of
an incarnation already deleted is OK and deletes nothing more. To run a
delete again after a failure without risking the next incarnation, pass
--incarnation with the number the first run printed (or 1 for a group
never deleted).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, opts, err := dial(cmd.Context(), cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := withTimeout(cmd.Context(), opts.RequestTimeout)
			defer cancel()
			deleted, err := c.DeleteGroupIncarnation(ctx, args[0], incarnation, force)
			if err != nil {
				if !force && errors.Is(err, client.ErrNotFound) {
					return fmt.Errorf("%w\n(a group consumed only without --member is deleted with: nereus group delete --force %s)", err, args[0])
				}
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted group %s (incarnation %d)\n", args[0], deleted)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "also delete a group the coordinator does not know: one consumed only by consumers without --member (no typo check: any name is accepted)")
	cmd.Flags().Uint64Var(&incarnation, "incarnation", 0, "delete this incarnation of the group (0: the current one); OK if it is already deleted")
	return cmd
}

func heldList(hs []client.HeldPartition) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("%s/%d@%d", h.Topic, h.Partition, h.Epoch)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

func writeGroupsJSON(w io.Writer, gs []client.GroupInfo) error {
	enc := json.NewEncoder(w)
	for _, g := range gs {
		if err := enc.Encode(g); err != nil {
			return err
		}
	}
	return nil
}
