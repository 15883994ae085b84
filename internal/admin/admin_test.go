package admin

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

func TestEndpoints(t *testing.T) {
	n, err := node.Open(node.Config{DataDir: "/d", Env: env.Env{FS: vfs.NewMem()}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Declare(wire.TopicConfig{Name: "orders", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	n.Publish(&wire.Pub{Topic: "orders", Partition: 1, Value: []byte("hello")}, func(wire.PubOK, *wire.Error) { close(done) })
	<-done
	var ready atomic.Bool
	srv := httptest.NewServer(Handler(n, &ready))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	if code, _ := get("/readyz"); code != 503 {
		t.Fatalf("readyz before ready: %d", code)
	}
	ready.Store(true)
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("readyz when ready: %d", code)
	}
	_, metrics := get("/metrics")
	for _, want := range []string{`nereus_publish_records_total{topic="orders"} 1`, `nereus_partition_commit_seq{partition="1",topic="orders"} 1`, "nereus_fsync_seconds_bucket"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	_, body := get("/api/v1/topics")
	var out struct {
		Topics []struct {
			Name       string `json:"name"`
			Partitions []struct {
				CommitSeq uint64 `json:"commit_seq"`
			} `json:"partitions"`
		} `json:"topics"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Topics) != 1 || out.Topics[0].Name != "orders" || out.Topics[0].Partitions[1].CommitSeq != 1 {
		t.Fatalf("topics API: %s", body)
	}
	var joinErr error
	n.JoinGroup(&wire.Join{Group: "billing", Member: "m1", Topics: []string{"orders"}, JoinID: 1}, noSink{},
		func(_ *wire.JoinOK, err error) { joinErr = err })
	if joinErr != nil {
		t.Fatal(joinErr)
	}
	_, metrics = get("/metrics")
	for _, want := range []string{`nereus_group_members{group="billing"} 1`, `nereus_group_pending_notices{group="billing"} 1`, `nereus_group_assignment_epoch{group="billing"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	_, body = get("/api/v1/groups")
	var groups struct {
		Groups []struct {
			Name    string `json:"name"`
			Mode    string `json:"mode"`
			Members []struct {
				ID         string `json:"id"`
				Partitions []struct {
					Partition int `json:"partition"`
				} `json:"partitions"`
			} `json:"members"`
			Pending []struct {
				Kind string `json:"kind"`
			} `json:"pending_notices"`
		} `json:"groups"`
	}
	if err := json.Unmarshal([]byte(body), &groups); err != nil {
		t.Fatal(err)
	}
	g := groups.Groups
	if len(g) != 1 || g[0].Name != "billing" || g[0].Mode != "exclusive" || len(g[0].Members) != 1 || len(g[0].Members[0].Partitions) != 2 ||
		len(g[0].Pending) != 1 || g[0].Pending[0].Kind != "ASSIGN" {
		t.Fatalf("groups API: %s", body)
	}

	// The settings in force of each group running here, as its first
	// subscriber set them (a later one asking others does not change them).
	for _, opts := range []node.GroupOptions{{AckWaitMs: 5000, MaxDeliver: 3}, {AckWaitMs: 9000}} {
		sub, err := n.Subscribe("orders", "audit", opts, noSink{})
		if err != nil {
			t.Fatal(err)
		}
		sub.Close()
	}
	_, body = get("/api/v1/group-settings")
	var settings struct {
		Groups []struct {
			Group      string `json:"group"`
			Topic      string `json:"topic"`
			AckWaitMs  int64  `json:"ack_wait_ms"`
			MaxDeliver uint32 `json:"max_deliver"`
		} `json:"groups"`
	}
	if err := json.Unmarshal([]byte(body), &settings); err != nil {
		t.Fatal(err)
	}
	if s := settings.Groups; len(s) != 1 || s[0].Group != "audit" || s[0].Topic != "orders" || s[0].AckWaitMs != 5000 || s[0].MaxDeliver != 3 {
		t.Fatalf("group settings API: %s", body)
	}
}

type noSink struct{}

func (noSink) SendNotice(*wire.Notice) {}
func (noSink) SendMsg(*wire.Msg)       {}
func (noSink) End(*wire.Error)         {}

// /api/v1/schedules refuses a malformed cursor or limit (400), lists
// nothing on a node without schedule shards (and does not create them),
// and pages through a node's schedules with its cursor, each once,
// earliest first.
func TestSchedulesEndpoint(t *testing.T) {
	n, err := node.Open(node.Config{DataDir: "/d", Env: env.Env{FS: vfs.NewMem()}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var ready atomic.Bool
	srv := httptest.NewServer(Handler(n, &ready))
	defer srv.Close()
	type page struct {
		Schedules []struct {
			Shard uint32 `json:"shard"`
			ID    uint64 `json:"id"`
			Topic string `json:"topic"`
		} `json:"schedules"`
		Cursor   string `json:"cursor"`
		Complete bool   `json:"complete"`
	}
	get := func(query string) (int, page) {
		resp, err := http.Get(srv.URL + "/api/v1/schedules" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p page
		if resp.StatusCode == 200 {
			if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, p
	}
	for _, q := range []string{"?cursor=x", "?cursor=0:1", "?cursor=0:5:0", "?limit=-1", "?limit=x"} {
		if code, _ := get(q); code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", q, code)
		}
	}
	if code, p := get(""); code != 200 || len(p.Schedules) != 0 || p.Cursor != "" || !p.Complete {
		t.Fatalf("no shards: %d %+v", code, p)
	}
	if len(n.Metadata([]string{wire.SchedTopic})) != 0 {
		t.Fatal("a GET created the schedule shards")
	}
	if _, err := n.Declare(wire.TopicConfig{Name: "orders", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	const total = 25
	for i := range total {
		done := make(chan *wire.Error, 1)
		n.Schedule(&wire.Schedule{Pub: wire.Pub{Topic: "orders", Partition: wire.PartitionAuto, Key: []byte{byte(i)}, Value: []byte("v")},
			DeliverAtMs: 4_000_000_000_000 + int64(i%7)}, func(_ wire.ScheduleOK, err *wire.Error) { done <- err })
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	seen := map[[2]uint64]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		code, p := get("?limit=4&topic=orders&cursor=" + cursor)
		if code != 200 || !p.Complete || len(p.Schedules) > 4 || pages > total {
			t.Fatalf("page %d: %d %+v", pages, code, p)
		}
		for _, s := range p.Schedules {
			k := [2]uint64{uint64(s.Shard), s.ID}
			if seen[k] || s.Topic != "orders" {
				t.Fatalf("page %d: %+v listed twice", pages, s)
			}
			seen[k] = true
		}
		if p.Cursor == "" {
			break
		}
		cursor = p.Cursor
	}
	if len(seen) != total {
		t.Fatalf("listed %d of %d", len(seen), total)
	}
}
