package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func init() {
	extraCommands = append(extraCommands, newSchedCmd)
}

func newSchedCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sched",
		Short: "Inspect and manage scheduled delivery (pub --delay / --at schedules)",
	}
	var topic string
	var limit int
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List live schedules (pending or firing), earliest first",
		Long: `list prints every live schedule (pending or firing), earliest first
(by deliver_at, then shard and id), those spilled to disk beyond the RAM
window included, reading each shard a page of at most 1,000 at a time;
--limit stops after that many.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return fmt.Errorf("--limit %d: want 0 (every schedule) or more", limit)
			}
			c, _, err := dial(cmd.Context(), cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			out := cmd.OutOrStdout()
			n := 0
			pageSize := 0 // the broker's page, 1,000
			if limit > 0 && limit < 1000 {
				pageSize = limit
			}
			for s, err := range c.ListSchedules(cmd.Context(), topic, pageSize) {
				if err != nil {
					return err
				}
				if asJSON {
					s.DeliverAt = s.DeliverAt.UTC()
					b, _ := json.Marshal(s)
					fmt.Fprintln(out, string(b))
				} else {
					fmt.Fprintf(out, "%d/%d\t%s\t%s/%d\t%s\n", s.Shard, s.ID, s.DeliverAt.UTC().Format(time.RFC3339Nano), s.Topic, s.Partition, s.State)
				}
				if n++; n == limit {
					break
				}
			}
			return nil
		},
	}
	list.Flags().StringVar(&topic, "topic", "", "only schedules to this topic")
	list.Flags().IntVar(&limit, "limit", 0, "at most this many (0 = every one)")
	list.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")

	status := &cobra.Command{
		Use:   "status",
		Short: "Show the schedule shards (lifecycle, owner, counts) and the lanes (gate, readiness)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := dial(cmd.Context(), cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.SchedulerStatus(cmd.Context(), topic)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				for _, s := range st.Shards {
					b, _ := json.Marshal(map[string]any{"shard": s})
					fmt.Fprintln(out, string(b))
				}
				for _, l := range st.Lanes {
					b, _ := json.Marshal(map[string]any{"lane": l})
					fmt.Fprintln(out, string(b))
				}
				return nil
			}
			for _, s := range st.Shards {
				next := "-"
				if !s.NextDue.IsZero() {
					next = s.NextDue.UTC().Format(time.RFC3339Nano)
				}
				fmt.Fprintf(out, "shard %d\t%s\towner=%s epoch=%d\tpending=%d next_due=%s fired=%d unknown=%d cancelled=%d\n",
					s.Shard, s.Lifecycle, s.Owner, s.OwnerEpoch, s.Pending, next, s.Fired, s.Unknown, s.Cancelled)
			}
			for _, l := range st.Lanes {
				fmt.Fprintf(out, "lane %s (shard %d)\t%s\t%s\tpending=%d\n", l.Topic, l.Shard, l.Gate, l.Readiness, l.Pending)
			}
			return nil
		},
	}
	status.Flags().StringVar(&topic, "topic", "", "only this topic's lanes")
	status.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")

	cancel := &cobra.Command{
		Use:   "cancel SHARD/ID",
		Short: "Cancel a pending schedule (as printed by pub --delay and sched list)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			shardS, idS, ok := strings.Cut(args[0], "/")
			shard, err1 := strconv.ParseUint(shardS, 10, 32)
			id, err2 := strconv.ParseUint(idS, 10, 64)
			if !ok || err1 != nil || err2 != nil {
				return fmt.Errorf("schedule %q: want SHARD/ID, e.g. 0/17", args[0])
			}
			c, _, err := dial(cmd.Context(), cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.CancelSchedule(cmd.Context(), uint32(shard), id); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cancelled %d/%d\n", shard, id)
			return nil
		},
	}

	lane := &cobra.Command{
		Use:   "lane pause|resume|close|retire TOPIC",
		Short: "Change a destination lane's admission gate",
		Long: `pause holds the lane's due messages (new schedules are still taken);
resume opens it again; close refuses new schedules and holds the due ones;
retire ends the lane for good, cancelling its pending schedules.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd.Context(), cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.LaneCommand(cmd.Context(), args[1], args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lane %s: %s\n", args[1], args[0])
			return nil
		},
	}
	cmd.AddCommand(list, status, cancel, lane)
	return cmd
}
