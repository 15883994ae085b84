package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
)

// TestCLISchedListListsTheSpill: on a node whose lanes keep 4 pending
// schedules in RAM, `sched list` prints every one of 2,500 pending
// schedules (far more than a page of 1,000 per shard, almost all
// spilled), each once, earliest first; --limit stops after that many,
// --topic filters; /api/v1/schedules pages through the same schedules
// with its cursor.
func TestCLISchedListListsTheSpill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dir := t.TempDir()
	srv := startServe(t, "--data", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--insecure-no-auth", "--log-level", "warn", "--sched-window", "4")
	run := func(args ...string) (string, error) {
		cmd := exec.Command(nereusBinary(t), args...)
		cmd.Env = append(os.Environ(), "NEREUS_SERVER="+srv.addr)
		out, err := cmd.Output()
		return string(out), err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Servers: []string{srv.addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, topic := range []string{"later", "other"} {
		if _, err := c.DeclareTopic(ctx, client.TopicConfig{Name: topic, Partitions: 2}); err != nil {
			t.Fatal(err)
		}
	}
	const total = 2500
	base := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	want := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += 16 {
				topic := "later"
				if i%10 == 0 {
					topic = "other"
				}
				s, err := c.Schedule(ctx, topic, client.Message{Value: []byte(fmt.Sprint(i))}, base.Add(time.Duration(i%700)*time.Second))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				want[fmt.Sprintf("%d/%d %s", s.Shard, s.ID, topic)] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	type line struct {
		Shard     uint32    `json:"shard"`
		ID        uint64    `json:"id"`
		DeliverAt time.Time `json:"deliver_at"`
		Topic     string    `json:"topic"`
		State     string    `json:"state"`
	}
	parse := func(out string) []line {
		t.Helper()
		var ls []line
		for _, s := range strings.Split(strings.TrimSpace(out), "\n") {
			if s == "" {
				continue
			}
			var l line
			if err := json.Unmarshal([]byte(s), &l); err != nil {
				t.Fatalf("sched list printed %q: %v", s, err)
			}
			ls = append(ls, l)
		}
		return ls
	}
	earlier := func(a, b line) bool {
		return a.DeliverAt.Before(b.DeliverAt) || a.DeliverAt.Equal(b.DeliverAt) && (a.Shard < b.Shard || a.Shard == b.Shard && a.ID < b.ID)
	}
	check := func(ls []line, topic string) {
		t.Helper()
		seen := map[string]bool{}
		for i, l := range ls {
			k := fmt.Sprintf("%d/%d %s", l.Shard, l.ID, l.Topic)
			if !want[k] || seen[k] || l.State != "PENDING" || (topic != "" && l.Topic != topic) || (i > 0 && !earlier(ls[i-1], l)) {
				t.Fatalf("listing %d: %+v (listed before: %v)", i, l, seen[k])
			}
			seen[k] = true
		}
		n := 0
		for k := range want {
			if topic == "" || strings.HasSuffix(k, " "+topic) {
				n++
			}
		}
		if len(seen) != n {
			t.Fatalf("listed %d schedules of %q, want %d", len(seen), topic, n)
		}
	}
	out, err := run("sched", "list", "--json")
	if err != nil {
		t.Fatalf("sched list: %v", err)
	}
	check(parse(out), "")
	out, err = run("sched", "list", "--json", "--topic", "other")
	if err != nil {
		t.Fatalf("sched list --topic: %v", err)
	}
	check(parse(out), "other")
	out, err = run("sched", "list", "--limit", "7")
	if err != nil || len(strings.Split(strings.TrimSpace(out), "\n")) != 7 {
		t.Fatalf("sched list --limit 7: %v\n%s", err, out)
	}
	st, err := c.SchedulerStatus(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	pending := 0
	for _, s := range st.Shards {
		pending += int(s.Pending)
	}
	if pending != total {
		t.Fatalf("sched status counts %d pending, want %d", pending, total)
	}

	// The HTTP API, 600 a page, following its cursor.
	var all []line
	cursor := ""
	for pages := 0; ; pages++ {
		resp, err := http.Get("http://" + srv.httpAddr + "/api/v1/schedules?limit=600&cursor=" + cursor)
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Schedules []line `json:"schedules"`
			Cursor    string `json:"cursor"`
			Complete  bool   `json:"complete"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || !page.Complete || len(page.Schedules) > 600 || pages > total/600+1 {
			t.Fatalf("page %d: %d schedules, complete %v (%v)", pages, len(page.Schedules), page.Complete, err)
		}
		all = append(all, page.Schedules...)
		if page.Cursor == "" {
			break
		}
		cursor = page.Cursor
	}
	check(all, "")
	if !slices.EqualFunc(all, parse(func() string { s, _ := run("sched", "list", "--json"); return s }()), func(a, b line) bool {
		return a.Shard == b.Shard && a.ID == b.ID
	}) {
		t.Fatal("the HTTP listing and the CLI's differ in order")
	}
}
