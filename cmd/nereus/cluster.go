package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
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
		Long: `Ask every address of --server for its view, and then every partition leader
those answers name (by its client address) that was not asked yet, and
merge the views: one address of a cluster finds every node that leads a
partition; give all the nodes (a,b,c) to see those that lead none. For
each partition the view of the node that leads it wins,
since only a leader knows its followers' states (InSync, CatchingUp,
NeedsRebuild, Unreachable: not heard from for 2 election timeouts). A node
that does not answer is shown unreachable, and a partition whose leader is
none of the nodes that answered has no leader (NO_LEADER), whoever the
others last heard of.

Exit status: 0 when the cluster is healthy — every node answered, and every
partition has a leader among them, takes writes (not READ_ONLY_DEGRADED nor
DATA_CORRUPT), and has every replica InSync; 2 when it is degraded (the
reasons go to stderr); 1 on errors.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := clientOptions(cmd)
			if err != nil {
				return err
			}
			views := gatherViews(opts.Servers, func(addr string) nodeView { return askNode(cmd.Context(), opts, addr) })
			merged := mergeViews(views)
			write := writeClusterTable
			if asJSON {
				write = writeClusterJSON
			}
			if err := write(cmd.OutOrStdout(), views, merged); err != nil {
				return err
			}
			if reasons := degradedReasons(views, merged); len(reasons) > 0 {
				return &exitError{code: exitDegraded, msg: "cluster degraded: " + strings.Join(reasons, "; ")}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line: nodes first, then partitions")
	return cmd
}

// askedNodesMax bounds the nodes cluster status asks.
const askedNodesMax = 256

// gatherViews asks each of servers, then each partition leader the
// answers name that was not asked yet, in the order they are found, at
// most askedNodesMax in all. A node is asked once: its own address, as
// the partitions it leads name it, counts as asked once it answered
// under another (localhost against 127.0.0.1).
func gatherViews(servers []string, ask func(addr string) nodeView) []nodeView {
	var views []nodeView
	asked := map[string]bool{}
	queue := slices.Clone(servers)
	for len(queue) > 0 && len(views) < askedNodesMax {
		addr := queue[0]
		queue = queue[1:]
		if asked[addr] {
			continue
		}
		asked[addr] = true
		v := ask(addr)
		views = append(views, v)
		for _, t := range v.topics {
			for _, p := range t.Partitions {
				if p.LeaderAddr != "" && leaderAnswered(toPartitionJSON(p)) {
					asked[p.LeaderAddr] = true // the answering node itself
				}
			}
		}
		for _, t := range v.topics {
			for _, p := range t.Partitions {
				if p.LeaderAddr != "" && !asked[p.LeaderAddr] {
					queue = append(queue, p.LeaderAddr)
				}
			}
		}
	}
	return views
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
// Leader is empty unless a node that answered leads it; Mode says whether
// the partition takes writes.
type partitionView struct {
	Topic  string `json:"topic"`
	Factor int    `json:"replication"`
	Ack    string `json:"ack"`
	Mode   string `json:"mode"`
	partitionJSON
}

// Partition modes.
const (
	modeReadWrite = "read-write"
	modeReadOnly  = "READ_ONLY_DEGRADED"
	modeNoLeader  = "NO_LEADER" // no node that answered leads it
	modeCorrupt   = "DATA_CORRUPT"
)

// exitDegraded is cluster status's exit status for a degraded cluster.
const exitDegraded = 2

// exitError is an error with its own exit status (main uses it).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }
func (e *exitError) ExitCode() int { return e.code }

// leaderAnswered reports whether p is its leader's own view: a leader
// reports its own replica's state, a follower never reports the leader's;
// a single node (no replica list) answers for itself.
func leaderAnswered(p partitionJSON) bool {
	if p.Leader == "" {
		return false
	}
	if len(p.Replicas) == 0 {
		return true
	}
	for _, r := range p.Replicas {
		if r.Node == p.Leader {
			return r.State != ""
		}
	}
	return false
}

// degradedReasons lists why the cluster is degraded; none when every node
// answered and every partition has a leader that answered, takes writes,
// and has every replica InSync.
func degradedReasons(views []nodeView, parts []partitionView) []string {
	var out []string
	for _, v := range views {
		if v.err != nil {
			out = append(out, fmt.Sprintf("node %s unreachable", v.addr))
		}
	}
	for _, p := range parts {
		name := fmt.Sprintf("%s/%d", p.Topic, p.Partition)
		switch p.Mode {
		case modeNoLeader:
			out = append(out, name+" has no reachable leader")
			continue // the followers know no replica's state
		case modeReadOnly, modeCorrupt:
			out = append(out, name+" is "+p.Mode)
		}
		for _, r := range p.Replicas {
			if r.State != replicaInSync {
				out = append(out, fmt.Sprintf("%s replica %s is %s", name, r.Node, r.State))
			}
		}
	}
	return out
}

const replicaInSync = "InSync"

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
		switch {
		case pv.State == "corrupt":
			pv.Mode = modeCorrupt
		case !leaderAnswered(pv.partitionJSON):
			// Who the others last heard of did not answer here: it may be
			// dead, so it is nobody's leader in this report.
			pv.Mode, pv.Leader = modeNoLeader, ""
		case pv.ReadOnly:
			pv.Mode = modeReadOnly
		default:
			pv.Mode = modeReadWrite
		}
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
			status = "unreachable: " + v.err.Error()
		}
		fmt.Fprintf(tw, "%s\t%s\n", v.addr, status)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tLEADER\tEPOCH\tCOMMIT_SEQ\tMODE\tREPLICAS")
	for _, p := range parts {
		var reps []string
		for _, r := range p.Replicas {
			s := r.Node
			if r.State != "" {
				s += fmt.Sprintf("(%s@%d)", r.State, r.FlushedSeq)
			}
			reps = append(reps, s)
		}
		leader := p.Leader
		if leader == "" {
			leader = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t%s\n", p.Topic, p.Partition, leader, p.Epoch, p.CommitSeq, p.Mode, strings.Join(reps, " "))
	}
	if counts := leaderCounts(parts); len(counts) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "NODE_ID\tLEADS")
		for _, c := range counts {
			fmt.Fprintf(tw, "%s\t%d\n", c.node, c.leads)
		}
	}
	return tw.Flush()
}

type leaderCount struct {
	node  string
	leads int
}

// leaderCounts is how many partitions each replica node leads (0 for one
// that leads none), by node id: whether leadership is balanced.
func leaderCounts(parts []partitionView) []leaderCount {
	leads := map[string]int{}
	for _, p := range parts {
		for _, r := range p.Replicas {
			leads[r.Node] += 0
		}
		if p.Leader != "" {
			leads[p.Leader]++
		}
	}
	out := make([]leaderCount, 0, len(leads))
	for _, n := range slices.Sorted(maps.Keys(leads)) {
		out = append(out, leaderCount{n, leads[n]})
	}
	return out
}
