package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/client"
)

func newTopicCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "topic", Short: "Create, list, update and delete topics"}
	cmd.AddCommand(newTopicCreateCmd(), newTopicListCmd(), newTopicUpdateCmd(), newTopicDeleteCmd())
	return cmd
}

func newTopicUpdateCmd() *cobra.Command {
	var u client.TopicUpdate
	var retention time.Duration
	var retentionBytes int64
	cmd := &cobra.Command{
		Use:   "update NAME",
		Short: "Change a topic's retention",
		Long: "Change a topic's retention: --retention, --retention-bytes or both (0 = unlimited); what is not\n" +
			"given keeps its value. Every partition applies it at its next retention check: a shorter retention\n" +
			"deletes then what it no longer keeps. Partitions, replicas and the ack policy cannot change.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("retention") {
				u.Retention = &retention
			}
			if cmd.Flags().Changed("retention-bytes") {
				u.RetentionBytes = &retentionBytes
			}
			if u.Retention == nil && u.RetentionBytes == nil {
				return fmt.Errorf("topic update %s: give --retention, --retention-bytes or both", args[0])
			}
			return withKV(cmd, func(ctx context.Context, c *client.Client) error { // (dial and a request context: not KV's own)
				cfg, incarnation, err := c.UpdateTopic(ctx, args[0], u)
				if err != nil {
					return err
				}
				age, bytes := retentionText(cfg)
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "updated topic %s (incarnation %d): retention %s, retention-bytes %s\n",
					cfg.Name, incarnation, age, bytes)
				return err
			})
		},
	}
	f := cmd.Flags()
	f.DurationVar(&retention, "retention", 0, "retention age (0 = unlimited)")
	f.Int64Var(&retentionBytes, "retention-bytes", 0, "retention size per partition in bytes (0 = unlimited)")
	f.Uint64Var(&u.Incarnation, "incarnation", 0, "update only this incarnation of the topic (0 = the current one)")
	return cmd
}

func newTopicDeleteCmd() *cobra.Command {
	var incarnation uint64
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a topic: its messages, its groups' progress on it and its data on every node",
		Long: "Delete a topic. Every node stops its partitions and removes their data; consumer groups lose its\n" +
			"partitions; publishes and pulls get NOT_FOUND. Creating the name again makes a new, empty topic with\n" +
			"the next incarnation. Schedules into the deleted topic stay pending: their lane is blocked, and\n" +
			"ORDERING_BROKEN once the name is created again, until `sched lane resume` (docs/OPERATIONS.md).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withKV(cmd, func(ctx context.Context, c *client.Client) error { // (dial and a request context: not KV's own)
				deleted, err := c.DeleteTopic(ctx, args[0], incarnation)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "deleted topic %s (incarnation %d)\n", args[0], deleted)
				return err
			})
		},
	}
	cmd.Flags().Uint64Var(&incarnation, "incarnation", 0, "delete only this incarnation of the topic (0 = the current one)")
	return cmd
}

func newTopicCreateCmd() *cobra.Command {
	var cfg client.TopicConfig
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a topic (succeeds if an identical one exists)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.Name = args[0]
			c, opts, err := dial(cmd.Context(), cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := withTimeout(cmd.Context(), opts.RequestTimeout)
			defer cancel()
			created, err := c.DeclareTopic(ctx, cfg)
			if err != nil {
				return err
			}
			if created {
				fmt.Fprintf(cmd.OutOrStdout(), "created topic %s (%d partitions)\n", cfg.Name, cfg.Partitions)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "topic %s exists\n", cfg.Name)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Partitions, "partitions", 1, "number of partitions")
	f.DurationVar(&cfg.Retention, "retention", 0, "retention age (0 = unlimited)")
	f.Int64Var(&cfg.RetentionBytes, "retention-bytes", 0, "retention size per partition in bytes (0 = unlimited)")
	f.IntVar(&cfg.Replicas, "replicas", 0, "replication factor 1, 3 or 5 (0 = the broker's default: 3 in a cluster of 3 or more, else 1)")
	f.StringVar(&cfg.Ack, "ack", "quorum", "when a replicated record is acknowledged: quorum or all")
	return cmd
}

func newTopicListCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [NAME...]",
		Short: "List topics and the state of their partitions",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, opts, err := dial(cmd.Context(), cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := withTimeout(cmd.Context(), opts.RequestTimeout)
			defer cancel()
			topics, err := c.Topics(ctx, args...)
			if err != nil {
				return err
			}
			if asJSON {
				err = writeTopicsJSON(cmd.OutOrStdout(), topics)
			} else {
				err = writeTopicsTable(cmd.OutOrStdout(), topics)
			}
			if err != nil {
				return err
			}
			return missingTopics(args, topics)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per topic per line")
	return cmd
}

// missingTopics fails when a topic asked for by name does not exist, after
// the ones that do were listed.
func missingTopics(names []string, topics []client.TopicInfo) error {
	var missing []string
	for _, name := range names {
		if !slices.ContainsFunc(topics, func(t client.TopicInfo) bool { return t.Config.Name == name }) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("no such topic: %s", strings.Join(missing, ", "))
	}
	return nil
}

// topicJSON is the --json form of a topic.
type topicJSON struct {
	Name           string          `json:"name"`
	Incarnation    uint64          `json:"incarnation"`
	Partitions     int             `json:"partitions"`
	Replicas       int             `json:"replicas"`
	Ack            string          `json:"ack"`
	RetentionMs    int64           `json:"retention_ms"`
	RetentionBytes int64           `json:"retention_bytes"`
	State          []partitionJSON `json:"partition_state"`
}

type partitionJSON struct {
	Partition int    `json:"partition"`
	Epoch     uint64 `json:"epoch"`
	StartSeq  uint64 `json:"start_seq"`
	CommitSeq uint64 `json:"commit_seq"`
	Leader    string `json:"leader"`
	ReadOnly  bool   `json:"read_only"`
	// State is "ok", "read_only" or "corrupt".
	State    string        `json:"state"`
	Replicas []replicaJSON `json:"replicas,omitempty"`
}

type replicaJSON struct {
	Node       string `json:"node"`
	State      string `json:"state,omitempty"`
	FlushedSeq uint64 `json:"flushed_seq"`
}

func toPartitionJSON(p client.PartitionInfo) partitionJSON {
	out := partitionJSON{Partition: p.Partition, Epoch: p.Epoch, StartSeq: p.StartSeq, CommitSeq: p.CommitSeq,
		Leader: p.Leader, ReadOnly: p.ReadOnly, State: "ok"}
	switch {
	case p.Corrupt:
		out.State = "corrupt"
	case p.ReadOnly:
		out.State = "read_only"
	}
	for _, r := range p.Replicas {
		out.Replicas = append(out.Replicas, replicaJSON{Node: r.Node, State: r.State, FlushedSeq: r.FlushedSeq})
	}
	return out
}

func writeTopicsJSON(w io.Writer, topics []client.TopicInfo) error {
	enc := json.NewEncoder(w)
	for _, t := range topics {
		obj := topicJSON{
			Name: t.Config.Name, Incarnation: t.Incarnation, Partitions: t.Config.Partitions, Replicas: t.Config.Replicas, Ack: t.Config.Ack,
			RetentionMs: t.Config.Retention.Milliseconds(), RetentionBytes: t.Config.RetentionBytes,
			State: []partitionJSON{},
		}
		for _, p := range t.Partitions {
			obj.State = append(obj.State, toPartitionJSON(p))
		}
		if err := enc.Encode(obj); err != nil {
			return err
		}
	}
	return nil
}

// retentionText is a topic's retention as the CLI prints it.
func retentionText(c client.TopicConfig) (age, bytes string) {
	age, bytes = "unlimited", "unlimited"
	if c.Retention > 0 {
		age = c.Retention.String()
	}
	if c.RetentionBytes > 0 {
		bytes = strconv.FormatInt(c.RetentionBytes, 10)
	}
	return age, bytes
}

func writeTopicsTable(w io.Writer, topics []client.TopicInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tINCARNATION\tPARTITION\tLEADER\tEPOCH\tSTART_SEQ\tCOMMIT_SEQ\tRETENTION\tRETENTION_BYTES")
	for _, t := range topics {
		retention, retentionBytes := retentionText(t.Config)
		fmt.Fprintf(tw, "%s\t%d\t%d partitions × %d replicas (ack %s)\t\t\t\t\t%s\t%s\n", t.Config.Name, t.Incarnation, t.Config.Partitions,
			t.Config.Replicas, t.Config.Ack, retention, retentionBytes)
		for _, p := range t.Partitions {
			fmt.Fprintf(tw, "\t\t%d\t%s\t%d\t%d\t%d\t\t\n", p.Partition, p.Leader, p.Epoch, p.StartSeq, p.CommitSeq)
		}
	}
	return tw.Flush()
}
