package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

// GET /api/v1/schedules[?topic=T][&limit=N][&cursor=C]: one page of the
// live schedules of the shards this node owns, earliest first (by
// deliver_at, then shard and id), at most limit (0 or above 1,000:
// 1,000). The answer's cursor, given back, continues the listing; it is
// "" once every shard is listed to its end. A shard this node cannot
// list (another node leads it, or it is taking office) is named under
// "unavailable" with the reason — never left out silently — and
// "complete" is false. The cursor is per shard: "S:DELIVER_AT_MS:ID"
// (after that schedule) or "S:end", comma separated; a shard it does not
// name is listed from its start.

// shardCursor is where one shard's listing stands.
type shardCursor struct {
	afterMs int64
	afterID uint64
	done    bool
}

func parseScheduleCursor(s string) (map[uint32]shardCursor, error) {
	out := map[uint32]shardCursor{}
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		fields := strings.Split(part, ":")
		shard, err := strconv.ParseUint(fields[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("cursor %q: shard %q", part, fields[0])
		}
		switch {
		case len(fields) == 2 && fields[1] == "end":
			out[uint32(shard)] = shardCursor{done: true}
		case len(fields) == 3:
			at, err1 := strconv.ParseInt(fields[1], 10, 64)
			id, err2 := strconv.ParseUint(fields[2], 10, 64)
			if err1 != nil || err2 != nil || id == 0 {
				return nil, fmt.Errorf("cursor %q: want SHARD:DELIVER_AT_MS:ID", part)
			}
			out[uint32(shard)] = shardCursor{afterMs: at, afterID: id}
		default:
			return nil, fmt.Errorf("cursor %q: want SHARD:DELIVER_AT_MS:ID or SHARD:end", part)
		}
	}
	return out, nil
}

// listPage asks the node for one page of a shard, waiting for its
// answer until the request ends.
func listPage(r *http.Request, n *node.Node, f *wire.SchedListPage) (*wire.SchedListPageOK, error) {
	type result struct {
		ok  *wire.SchedListPageOK
		err *wire.Error
	}
	ch := make(chan result, 1)
	n.SchedListPage(f, func(ok *wire.SchedListPageOK, err *wire.Error) { ch <- result{ok, err} })
	select {
	case res := <-ch:
		if res.err != nil {
			return nil, res.err
		}
		return res.ok, nil
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
}

func schedulesHandler(n *node.Node) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		topic := q.Get("topic")
		limit := wire.SchedListLimitMax
		if s := q.Get("limit"); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v < 0 {
				http.Error(w, fmt.Sprintf("limit %q: want a count", s), http.StatusBadRequest)
				return
			}
			if v > 0 && v < limit {
				limit = v
			}
		}
		cursors, err := parseScheduleCursor(q.Get("cursor"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		type schedule struct {
			Shard     uint32    `json:"shard"`
			ID        uint64    `json:"id"`
			DeliverAt time.Time `json:"deliver_at"`
			Topic     string    `json:"topic"`
			Partition uint32    `json:"partition"`
			State     string    `json:"state"`
		}
		type unavailable struct {
			Shard uint32 `json:"shard"`
			Error string `json:"error"`
		}
		var shards uint32
		if infos := n.Metadata([]string{wire.SchedTopic}); len(infos) == 1 {
			shards = uint32(len(infos[0].Partitions)) // none before the first schedule: nothing to list
		}
		// One page of every shard still to list, merged: the limit
		// earliest among them.
		pages := map[uint32][]wire.ScheduleInfo{}
		more := map[uint32]bool{}
		out := struct {
			Node        string        `json:"node"`
			Schedules   []schedule    `json:"schedules"`
			Cursor      string        `json:"cursor"`
			Complete    bool          `json:"complete"`
			Unavailable []unavailable `json:"unavailable,omitempty"`
		}{Node: n.NodeID(), Schedules: []schedule{}, Complete: true}
		for shard := range shards {
			c := cursors[shard]
			if c.done {
				continue
			}
			ok, err := listPage(r, n, &wire.SchedListPage{Shard: shard, Topic: topic, AfterDeliverAtMs: c.afterMs, AfterID: c.afterID, Limit: uint32(limit)})
			if err != nil {
				if r.Context().Err() != nil {
					return
				}
				out.Unavailable = append(out.Unavailable, unavailable{Shard: shard, Error: err.Error()})
				out.Complete = false
				continue
			}
			pages[shard], more[shard] = ok.Schedules, ok.More
		}
		for len(out.Schedules) < limit {
			var next *wire.ScheduleInfo
			for shard := range shards {
				if p := pages[shard]; len(p) > 0 && (next == nil || p[0].DeliverAtMs < next.DeliverAtMs ||
					(p[0].DeliverAtMs == next.DeliverAtMs && (p[0].Shard < next.Shard || (p[0].Shard == next.Shard && p[0].ID < next.ID)))) {
					next = &p[0]
				}
			}
			if next == nil {
				break
			}
			s := *next
			pages[s.Shard] = pages[s.Shard][1:]
			cursors[s.Shard] = shardCursor{afterMs: s.DeliverAtMs, afterID: s.ID}
			out.Schedules = append(out.Schedules, schedule{Shard: s.Shard, ID: s.ID, DeliverAt: time.UnixMilli(s.DeliverAtMs).UTC(), Topic: s.Topic, Partition: s.Partition, State: s.State})
		}
		var parts []string
		finished := true
		for shard := range shards {
			c := cursors[shard]
			if _, answered := more[shard]; answered && len(pages[shard]) == 0 && !more[shard] {
				c = shardCursor{done: true} // listed to its end
			}
			switch {
			case c.done:
				parts = append(parts, fmt.Sprintf("%d:end", shard))
			case c.afterID != 0:
				parts = append(parts, fmt.Sprintf("%d:%d:%d", shard, c.afterMs, c.afterID))
				finished = false
			default:
				finished = false // from its start
			}
		}
		if !finished {
			out.Cursor = strings.Join(parts, ",")
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	}
}
