// Package admin serves a node's HTTP endpoints: health, readiness,
// Prometheus metrics and a small JSON admin API.
package admin

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Handler returns the HTTP handler for n. ready reports whether the node
// accepts client traffic (false while starting or shutting down).
func Handler(n *node.Node, ready *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		if damaged := n.Damaged(); len(damaged) > 0 {
			// Serving, but an operator must repair these partitions.
			http.Error(w, "not ready: data corrupt:\n"+strings.Join(damaged, "\n"), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.Metrics().Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /api/v1/topics", func(w http.ResponseWriter, _ *http.Request) {
		type replica struct {
			Node       string `json:"node"`
			State      string `json:"state,omitempty"`
			FlushedSeq uint64 `json:"flushed_seq"`
		}
		type partition struct {
			Partition uint32    `json:"partition"`
			Epoch     uint64    `json:"epoch"`
			StartSeq  uint64    `json:"start_seq"`
			CommitSeq uint64    `json:"commit_seq"`
			Leader    string    `json:"leader"`
			ReadOnly  bool      `json:"read_only"`
			State     string    `json:"state"`
			Replicas  []replica `json:"replicas,omitempty"`
		}
		type topic struct {
			Name           string      `json:"name"`
			Incarnation    uint64      `json:"incarnation"`
			RetentionMs    int64       `json:"retention_ms"`
			RetentionBytes int64       `json:"retention_bytes"`
			Replicas       uint8       `json:"replicas"`
			Ack            string      `json:"ack"`
			Partitions     []partition `json:"partitions"`
		}
		out := []topic{}
		for _, t := range n.Metadata(nil) {
			tt := topic{Name: t.Config.Name, Incarnation: t.Incarnation, RetentionMs: t.Config.RetentionMs, RetentionBytes: t.Config.RetentionBytes,
				Replicas: t.Config.Replicas, Ack: t.Config.Ack.String()}
			for _, p := range t.Partitions {
				pp := partition{Partition: p.Partition, Epoch: p.Epoch, StartSeq: p.StartSeq, CommitSeq: p.CommitSeq,
					Leader: p.Leader, ReadOnly: p.ReadOnly, State: node.PartitionState(p)}
				for _, r := range p.Replicas {
					pp.Replicas = append(pp.Replicas, replica(r))
				}
				tt.Partitions = append(tt.Partitions, pp)
			}
			out = append(out, tt)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"node": n.NodeID(), "topics": out})
	})
	mux.HandleFunc("GET /api/v1/groups", func(w http.ResponseWriter, _ *http.Request) {
		infos, err := n.GroupInfos("")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"node": n.NodeID(), "groups": groupsJSON(infos)})
	})
	mux.HandleFunc("GET /api/v1/group-settings", func(w http.ResponseWriter, _ *http.Request) {
		out := []map[string]any{}
		for _, s := range n.GroupSettings() {
			out = append(out, map[string]any{"group": s.Group, "topic": s.Topic, "ack_wait_ms": s.AckWaitMs, "max_deliver": s.MaxDeliver})
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"node": n.NodeID(), "groups": out})
	})
	mux.HandleFunc("GET /api/v1/schedules", schedulesHandler(n))
	return mux
}

// groupsJSON is the API's form of the groups (the CLI's --json shape).
func groupsJSON(infos []wire.GroupInfo) []map[string]any {
	held := func(hs []wire.HeldPartition) []map[string]any {
		out := []map[string]any{}
		for _, h := range hs {
			out = append(out, map[string]any{"topic": h.Topic, "partition": h.Partition, "epoch": h.Epoch})
		}
		return out
	}
	out := []map[string]any{}
	for _, g := range infos {
		mode := "exclusive"
		if g.Mode == wire.GroupShared {
			mode = "shared"
		}
		members, pending, parts := []map[string]any{}, []map[string]any{}, []map[string]any{}
		for _, m := range g.Members {
			members = append(members, map[string]any{"id": m.Member, "incarnation": m.Incarnation, "topics": m.Topics, "partitions": held(m.Partitions)})
		}
		for _, p := range g.Pending {
			kind := "ASSIGN"
			if p.Kind == wire.NoticeRevoke {
				kind = "REVOKE"
			}
			pending = append(pending, map[string]any{"id": p.NoticeID, "kind": kind, "member": p.Member, "partitions": held(p.Partitions)})
		}
		for _, p := range g.Partitions {
			parts = append(parts, map[string]any{"topic": p.Topic, "partition": p.Partition, "ack_floor": p.AckFloor,
				"commit_seq": p.CommitSeq, "lag": p.CommitSeq + 1 - min(p.AckFloor, p.CommitSeq+1)})
		}
		out = append(out, map[string]any{"name": g.Group, "mode": mode, "membership_epoch": g.MembershipEpoch,
			"assignment_epoch": g.AssignmentEpoch, "members": members, "pending_notices": pending, "partitions": parts})
	}
	return out
}
