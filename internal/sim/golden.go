package sim

import (
	"fmt"
	"strings"

	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// GoldenVariants are the recorded publish → fsync → PUB_OK → PULL → MSG →
// ACK traces: the clean path, and kill -9 at each step of it.
var GoldenVariants = []string{
	"clean",
	"kill-before-append",    // before the record is written to the partition log
	"kill-before-flush",     // written, not yet fsynced
	"kill-before-pub-ok",    // fsynced and visible, PUB_OK not yet sent
	"kill-before-ack-flush", // ACK received, ledger not yet fsynced
}

// RunGolden runs the scripted golden scenario: one producer publishes one
// message; once it is acknowledged one consumer pulls it and acks it; the
// run ends when the ack is confirmed. Disk writes and fsyncs are traced.
// The variant arms one kill -9. The whole trace is returned.
func RunGolden(variant string) (Result, error) {
	opts := Options{Seed: 1, Producers: 1, MessagesPerProducer: 1, Consumers: 1, Partitions: 2, KeepTrace: true}
	opts.setDefaults()
	s := newSim(opts)
	s.b.traceDisk = true
	isLog := func(name string) bool { return strings.HasPrefix(name, "topics/") && strings.HasSuffix(name, ".log") }
	isLedger := func(name string) bool {
		return strings.HasPrefix(name, "groups/") && strings.Contains(name, "/ledger/")
	}
	switch variant {
	case "clean":
	case "kill-before-append":
		s.b.killOnDisk = func(op vfs.Op, name string) bool { return op == vfs.OpWrite && isLog(name) }
	case "kill-before-flush":
		s.b.killOnDisk = syncAfterWrite(isLog)
	case "kill-before-pub-ok":
		s.b.killOnSend = func(f wire.Frame) bool { return f.Type() == wire.TypePubOK }
	case "kill-before-ack-flush":
		s.b.killOnDisk = syncAfterWrite(isLedger)
	default:
		return Result{}, fmt.Errorf("unknown golden variant %q (know %s)", variant, strings.Join(GoldenVariants, ", "))
	}
	s.w.tracef("golden %s", variant)
	s.b.start()
	p := &producer{s: s, id: 7, window: 1, messagesMax: 1, nextSeq: 1, inflight: map[uint64]string{}, partition: wire.PartitionAuto}
	s.producers = append(s.producers, p)
	p.connect()
	s.w.after(tickMs, s.tick)
	const eventsMax = 10_000
	for !p.done() && s.w.events < eventsMax && s.chk.violation == nil && s.step() {
	}
	c := newConsumer(s, 1, 1)
	c.polite = true
	s.consumers = append(s.consumers, c)
	c.connect()
	for len(s.chk.undelivered()) > 0 && s.w.events < eventsMax && s.chk.violation == nil && s.step() {
	}
	if s.chk.violation == nil && len(s.chk.undelivered()) > 0 {
		s.chk.violate(Liveness, "golden run did not finish in %d events", eventsMax)
	}
	if s.chk.violation == nil {
		s.finalPhase()
	}
	return s.result(), nil
}

// syncAfterWrite matches the first fsync of a matching file after something
// was written to it: the flush of an append (not the fsync a log does when
// it is opened).
func syncAfterWrite(match func(name string) bool) func(op vfs.Op, name string) bool {
	written := false
	return func(op vfs.Op, name string) bool {
		if !match(name) {
			return false
		}
		if op == vfs.OpWrite {
			written = true
		}
		return op == vfs.OpSync && written
	}
}
