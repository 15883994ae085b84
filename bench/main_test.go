package main

import (
	"io"
	"regexp"
	"slices"
	"testing"
)

func TestSelectCases(t *testing.T) {
	all := selectCases(systemSpecs, workloadSpecs, nil)
	// Seven brokers run every workload but failover and the group ones;
	// the disk anchor runs pub_sync only, the floor's two modes pub_sync
	// and pub_async (4 rows each); the two killable R3 systems run
	// failover, last; the group workloads run on the systems they list
	// (consume 1 and 3: nereus r1-proc and r3, jetstream r3; join and
	// leave: nereus r1-proc and r3).
	// The sched workloads run on nereus r1 and r3, the pending one on r1.
	// The KV workloads run on nereus r1 and r3 and on the four JetStream
	// modes. The idle row runs first, on nereus r3 and jetstream r3.
	groupCases, schedCases, schedSpecs, kvCases, kvSpecs := 0, 0, 0, 0, 0
	for _, w := range workloadSpecs {
		switch {
		case w.Workload == workloadIdle:
		case w.Workload.isSched():
			schedCases += len(w.systems)
			schedSpecs++
		case w.Workload.isKV():
			kvCases += len(w.systems)
			kvSpecs++
		default:
			groupCases += len(w.systems)
		}
	}
	if groupCases != 10 {
		t.Fatalf("%d group cases, want 10", groupCases)
	}
	if schedSpecs != 4 || schedCases != 7 {
		t.Fatalf("%d sched workloads in %d cases, want 4 in 7", schedSpecs, schedCases)
	}
	if kvSpecs != 4 || kvCases != 24 {
		t.Fatalf("%d KV workloads in %d cases, want 4 in 24", kvSpecs, kvCases)
	}
	if want := 2 + 7*(len(workloadSpecs)-1-1-4-schedSpecs-kvSpecs) + 1 + 2*4 + 2 + groupCases + schedCases + kvCases; len(all) != want {
		t.Fatalf("%d cases, want %d", len(all), want)
	}
	if got := []string{all[0].ID(), all[1].ID()}; !slices.Equal(got, []string{"nereus/r3/idle/0", "jetstream/r3/idle/0"}) {
		t.Errorf("the idle row runs first, on the R3 clusters only: %v", got)
	}
	var first []string
	for _, c := range all[2:10] {
		first = append(first, c.ID())
	}
	if want := []string{"nereus/r1/pub_sync/1024", "nereus/r1-proc/pub_sync/1024", "nereus/r3/pub_sync/1024",
		"jetstream/r1/pub_sync/1024", "jetstream/r1-always/pub_sync/1024", "jetstream/r3/pub_sync/1024",
		"jetstream/r3-always/pub_sync/1024", "disk/fsync/pub_sync/1024"}; !slices.Equal(first, want) {
		t.Errorf("the systems of one row run back to back: %v", first)
	}
	var last []string
	for _, c := range all[len(all)-2:] {
		last = append(last, c.ID())
	}
	if want := []string{"nereus/r3/failover/1024", "jetstream/r3/failover/1024"}; !slices.Equal(last, want) {
		t.Errorf("failover runs last, on the killable systems only: %v", last)
	}
	tests := []struct {
		only string
		want int
	}{
		{"pub_async", 27},
		{"^nereus/", 43},
		{"^nereus/r3/", 19},
		{"/idle/", 2},
		{"sched_", 7},
		{"^nereus/r1/sched_", 4},
		{"^nereus/r1-proc/sched_", 0},
		{"^jetstream/.*/sched_", 0},
		{"sched_pending", 1},
		{"jetstream/r1/", 10},
		{"^jetstream/r3", 24},
		{"kv_", 24},
		{"/kv_put", 12},
		{"^nereus/r1-proc/kv_", 0},
		{"^disk/.*kv_", 0},
		{"^(nereus|jetstream)/r1/kv_", 8},
		{"group", 10},
		{"group_consume", 6},
		{"group_(join|leave)", 4},
		{"^jetstream/.*/group_join", 0},
		{"^nereus/r1/group", 0},
		{"r1-always/e2e", 1},
		{"/65536$", 9},
		{"^disk/", 1},
		{"pub_sync", 10},
		{"^floor/", 8},
		{"^floor/r3/", 4},
		{"^floor/.*/(consume|e2e|kv_|group|sched|failover)", 0},
		{"failover", 2},
		{"nothing", 0},
	}
	for _, tt := range tests {
		if got := selectCases(systemSpecs, workloadSpecs, regexp.MustCompile(tt.only)); len(got) != tt.want {
			t.Errorf("-only %q: %d cases, want %d", tt.only, len(got), tt.want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	f, only, err := parseFlags([]string{"-quick", "-only", "e2e", "-count", "2", "-out", "x", "-profile", "p"}, io.Discard)
	if err != nil || !f.quick || f.count != 2 || f.outDir != "x" || f.profileDir != "p" || only == nil || !only.MatchString("nereus/r1/e2e/1024") {
		t.Fatalf("parseFlags: %+v %v %v", f, only, err)
	}
	for _, bad := range [][]string{{"-count", "-1"}, {"-only", "("}, {"extra"}} {
		if _, _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

func TestParseReadyAddr(t *testing.T) {
	addr, err := parseReadyAddr("nereus ready client=127.0.0.1:41234 http=")
	if err != nil || addr != "127.0.0.1:41234" {
		t.Fatalf("got %q, %v", addr, err)
	}
	if _, err := parseReadyAddr("nereus ready http=127.0.0.1:1"); err == nil {
		t.Fatal("a ready line without client= was accepted")
	}
}

func TestFSTypeOf(t *testing.T) {
	mounts := "/dev/vda / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\ntmpfs /tmpx tmpfs rw 0 0\n/dev/vdb /data/disk xfs rw 0 0\n"
	tests := map[string]string{
		"/tmp/nereus-bench-1":   "tmpfs",
		"/tmpfoo/x":             "ext4",
		"/data/disk/a":          "xfs",
		"/data/diskette":        "ext4",
		"/home/user/nereus/tmp": "ext4",
	}
	for path, want := range tests {
		if got := fsTypeOf(mounts, path); got != want {
			t.Errorf("fsTypeOf(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestNereusCommitFormat(t *testing.T) {
	got := nereusCommit(t.Context())
	if got == "" {
		t.Skip("no git repository above bench/")
	}
	if !regexp.MustCompile(`^[0-9a-f]{12}(\+dirty)?$`).MatchString(got) {
		t.Fatalf("nereusCommit() = %q", got)
	}
}
