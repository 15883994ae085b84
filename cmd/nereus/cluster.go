package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/client"
)

func init() {
	extraCommands = append(extraCommands, newClusterCmd)
}

func newClusterCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "Inspect the cluster"}
	cmd.AddCommand(newClusterStatusCmd())
	return cmd
}

// nodeView is what one node answered.
type nodeView struct {
	addr   string
	err    error
	topics []client.TopicInfo
}

func newClusterStatusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show nodes, partitions, leaders, epochs, commit points, replica states and degraded modes",
		Long: `Ask every address of --server (give all the nodes: a,b,c) for its view and
merge them: for each partition the view of the node that leads it wins,
since only a leader knows its followers' states (InSync, CatchingUp,
NeedsRebuild); a node that does not answer is shown as down.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := clientOptions(cmd)
			if err != nil {
				return err
			}
			views := make([]nodeView, len(opts.Servers))
			for i, addr := range opts.Servers {
				views[i] = askNode(cmd.Context(), opts, addr)
			}
			merged := mergeViews(views)
			if asJSON {
				return writeClusterJSON(cmd.OutOrStdout(), views, merged)
			}
			return writeClusterTable(cmd.OutOrStdout(), views, merged)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line: nodes first, then partitions")
	return cmd
}

func askNode(ctx context.Context, opts client.Options, addr string) nodeView {
	o := opts
	o.Servers = []string{addr}
	ctx, cancel := withTimeout(ctx, opts.RequestTimeout)
	defer cancel()
	c, err := client.Dial(ctx, o)
	if err != nil {
		return nodeView{addr: addr, err: err}
	}
	defer c.Close()
	topics, err := c.Topics(ctx)
	return nodeView{addr: addr, err: err, topics: topics}
}

// partitionView is one partition as the best-informed node reported it.
type partitionView struct {
	Topic  string `json:"topic"`
	Factor int    `json:"replication"`
	Ack    string `json:"ack"`
	partitionJSON
}

// mergeViews picks, per partition, the answer of the node that knows the
// most replica states (its leader), then the highest epoch.
func mergeViews(views []nodeView) []partitionView {
	type key struct {
		topic string
		p     int
	}
	best := map[key]partitionView{}
	known := func(p partitionJSON) int {
		n := 0
		for _, r := range p.Replicas {
			if r.State != "" {
				n++
			}
		}
		return n
	}
	for _, v := range views {
		for _, t := range v.topics {
			for _, p := range t.Partitions {
				k := key{t.Config.Name, p.Partition}
				pv := partitionView{Topic: t.Config.Name, Factor: t.Config.Replicas, Ack: t.Config.Ack, partitionJSON: toPartitionJSON(p)}
				old, ok := best[k]
				if !ok || known(pv.partitionJSON) > known(old.partitionJSON) ||
					(known(pv.partitionJSON) == known(old.partitionJSON) && pv.Epoch > old.Epoch) {
					best[k] = pv
				}
			}
		}
	}
	out := make([]partitionView, 0, len(best))
	for _, pv := range best {
		out = append(out, pv)
	}
	slices.SortFunc(out, func(a, b partitionView) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return a.Partition - b.Partition
	})
	return out
}

func writeClusterJSON(w io.Writer, views []nodeView, parts []partitionView) error {
	enc := json.NewEncoder(w)
	for _, v := range views {
		obj := map[string]any{"node_addr": v.addr, "up": v.err == nil}
		if v.err != nil {
			obj["error"] = v.err.Error()
		}
		if err := enc.Encode(obj); err != nil {
			return err
		}
	}
	for _, p := range parts {
		if err := enc.Encode(p); err != nil {
			return err
		}
	}
	return nil
}

func writeClusterTable(w io.Writer, views []nodeView, parts []partitionView) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATUS")
	for _, v := range views {
		status := "up"
		if v.err != nil {
			status = "down: " + v.err.Error()
		}
		fmt.Fprintf(tw, "%s\t%s\n", v.addr, status)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tLEADER\tEPOCH\tCOMMIT_SEQ\tMODE\tREPLICAS")
	for _, p := range parts {
		mode := "read-write"
		switch {
		case p.State == "corrupt":
			mode = "DATA_CORRUPT"
		case p.ReadOnly:
			mode = "READ_ONLY_DEGRADED"
		case p.Leader == "":
			mode = "no leader"
		}
		var reps []string
		for _, r := range p.Replicas {
			s := r.Node
			if r.State != "" {
				s += fmt.Sprintf("(%s@%d)", r.State, r.FlushedSeq)
			}
			reps = append(reps, s)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t%s\n", p.Topic, p.Partition, p.Leader, p.Epoch, p.CommitSeq, mode, strings.Join(reps, " "))
	}
	return tw.Flush()
}
