package replog

import (
	"testing"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// TestAReadyLargerThanABatchIsWritten: a Ready may hold more than one
// storage batch may (a follower steps many Appends of 64 KiB records
// before it writes: 280 of them are 17.5 MiB, over the default
// BatchBytesMax of 16 MiB); the store writes it in several batches
// instead of failing, which would stop the member.
func TestAReadyLargerThanABatchIsWritten(t *testing.T) {
	m := openTestMember(t)
	data := storage.AppendRecord(nil, &storage.Record{Value: make([]byte, 64<<10)})
	var entries []replica.Entry
	for seq := uint64(1); seq <= 300; seq++ {
		epoch := uint64(1)
		if seq > 280 {
			epoch = 2
		}
		entries = append(entries, replica.Entry{Seq: seq, Epoch: epoch, Data: data})
	}
	if err := (memberStore{m}).Append(entries); err != nil {
		t.Fatal(err)
	}
	if err := m.log.Sync(); err != nil {
		t.Fatal(err)
	}
	for from := uint64(1); from <= 300; {
		got, err := m.log.Read(from, 1000, 64<<20)
		if err != nil || len(got) == 0 {
			t.Fatalf("read from %d: %d entries, %v", from, len(got), err)
		}
		for _, e := range got {
			want := uint64(1)
			if e.Seq > 280 {
				want = 2
			}
			if e.Seq != from || e.Epoch != want || len(e.Record.Value) != 64<<10 {
				t.Fatalf("entry %d: seq %d, epoch %d, %d bytes", from, e.Seq, e.Epoch, len(e.Record.Value))
			}
			from++
		}
	}
}

// A replicated member's files sync parked (vfs.ParkedSync), a
// single-replica member's as every other log's.
func TestOnlyReplicatedMembersSyncParked(t *testing.T) {
	for _, tc := range []struct {
		members []replica.NodeID
		want    vfs.FS
	}{
		{[]replica.NodeID{1, 2, 3}, vfs.ParkedSync(vfs.OS())},
		{[]replica.NodeID{1}, vfs.OS()},
	} {
		m, err := OpenMember(Config{ID: 1, Members: tc.members, Dir: t.TempDir(), FS: vfs.OS(), Logger: quiet, Clock: env.Wall{},
			Send: func(replica.Message) {}})
		if err != nil {
			t.Fatal(err)
		}
		if m.cfg.FS != tc.want {
			t.Errorf("%d members: the member's file system is %#v, want %#v", len(tc.members), m.cfg.FS, tc.want)
		}
		m.Close()
	}
}
