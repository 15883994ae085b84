package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/client"
)

func init() {
	extraCommands = append(extraCommands, newGroupCmd)
}

func newGroupCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "group", Short: "List and describe consumer groups with members; update and delete groups"}
	cmd.AddCommand(newGroupListCmd(), newGroupDescribeCmd(), newGroupUpdateCmd(), newGroupDeleteCmd())
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

func newGroupUpdateCmd() *cobra.Command {
	var u client.GroupUpdate
	var ackWait time.Duration
	var maxDeliver uint32
	cmd := &cobra.Command{
		Use:   "update GROUP",
		Short: "Set a group's ack wait and max deliveries on every topic and node",
		Long: `Set a group's ack wait, max deliveries or both, for every topic it consumes:
what is not given keeps the value an earlier update gave, else the broker's
default — not what the group's consumers asked (give both the first time).
They hold on every node that delivers one of the group's partitions, from
the next delivery on, whatever its consumers ask; a lowered max deliveries
sends a message that used it up to the dead letters rather than out again.
Without an update, each node keeps the settings the group's first consumer
there asked. A group deleted and used again starts afresh.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("ack-wait") {
				u.AckWait = &ackWait
			}
			if cmd.Flags().Changed("max-deliver") {
				u.MaxDeliver = &maxDeliver
			}
			if u.AckWait == nil && u.MaxDeliver == nil {
				return fmt.Errorf("group update %s: give --ack-wait, --max-deliver or both", args[0])
			}
			return withKV(cmd, func(ctx context.Context, c *client.Client) error { // (dial and a request context: not KV's own)
				st, err := c.UpdateGroup(ctx, args[0], u)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "updated group %s (incarnation %d): ack wait %v, max deliveries %d\n",
					st.Group, st.Incarnation, st.AckWait, st.MaxDeliver)
				return err
			})
		},
	}
	f := cmd.Flags()
	f.DurationVar(&ackWait, "ack-wait", 0, "how long a delivery waits for its ack before it goes out again (whole milliseconds)")
	f.Uint32Var(&maxDeliver, "max-deliver", 0, "deliveries of a message before it goes to the dead letters (at least 1)")
	f.Uint64Var(&u.Incarnation, "incarnation", 0, "update only this incarnation of the group (0 = the current one)")
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
