package main

import (
	"fmt"
	"strings"
)

// isKVRatio selects the ratio rows of the KV workloads.
func isKVRatio(rr ratioRow) bool { return rr.Workload.isKV() }

// writeKVMarkdown writes the KV section of the report: what each KV
// workload does and what an acknowledged put means on each side, then
// Nereus r1 against NATS KV with one replica and Nereus r3 against NATS KV
// R3, from the ratio rows.
func writeKVMarkdown(b *strings.Builder, ratios []ratioRow, cfg runConfig) {
	r1 := func(rr ratioRow) bool { return isKVRatio(rr) && (rr.Nereus > 0 || len(rr.Versus) > 0) }
	r3 := func(rr ratioRow) bool { return isKVRatio(rr) && len(rr.R3Versus) > 0 }
	if !anyRatio(ratios, r1) && !anyRatio(ratios, r3) {
		return
	}
	b.WriteString("## KV buckets: Nereus ÷ NATS KV\n\n")
	fmt.Fprintf(b, "Buckets keeping one revision per key, %d B values, driven through each system's SDK (Nereus `client.KV`, nats.go `jetstream.KeyValue`); neither has an asynchronous put, so concurrency is goroutines sharing one connection, each waiting for its answer. "+
		"**kv_put_sync**: one put at a time over %d keys; p50/p99 from the put to its acknowledgement. "+
		"**kv_put**: %d goroutines on one connection put the %d keys in turn. "+
		"**kv_get**: the %d keys are put (untimed), then %d goroutines on one connection get them in turn; each get must return the value put. "+
		"**kv_watch**: %d watchers, each on its own connection, watch every key from the current revision; one writer connection keeps %d puts in flight, each update under a key of its own (none overwrites another), up to %d updates or the time limit. "+
		"updates/s counts the updates delivered to all %d watchers (deliveries are %d× that), from the first put until the last watcher received the last update; p50/p99 run from a put's send to a watcher's receipt, one sample per update and watcher, under that saturating writer. "+
		"Every watcher must receive every acknowledged update exactly once, in revision order, or the row fails.\n\n",
		kvValueBytes, cfg.KVKeys, cfg.KVConcurrency, cfg.KVKeys, cfg.KVKeys, cfg.KVConcurrency,
		cfg.KVWatchers, cfg.KVConcurrency, cfg.KVWatchCountMax, cfg.KVWatchers, cfg.KVWatchers)
	b.WriteString("What an acknowledged put is: Nereus r1 fsynced it (group commit); Nereus r3 fsynced it on two of three replicas. NATS KV r1 stored it in the page cache, fsynced within 2 min (the default sync_interval); r1-always fsynced it. NATS KV r3 stored it on two of three replicas, none fsynced within 2 min; r3-always fsyncs every write on each replica. " +
		"What a get reads: Nereus answers from the bucket leader's applied state under its lease (linearizable); a NATS KV get is a direct get (AllowDirect, the KV default) answered by a replica on the server the client is connected to — the stream leader's here, but any replica's in general, so it may be stale in R3.\n\n")
	b.WriteString("For ops/s and updates/s a ratio above 1 means Nereus is faster; for latencies (µs) a ratio below 1 means Nereus is faster.\n\n")
	if anyRatio(ratios, r1) {
		b.WriteString("One replica, both brokers in the harness process:\n\n")
		writeVersusTable(b, ratios, r1, "nereus r1", "nereus",
			func(rr ratioRow) (float64, []ratioVersus) { return rr.Nereus, rr.Versus })
	}
	if anyRatio(ratios, r3) {
		b.WriteString("Three replicas, three child processes of each broker:\n\n")
		writeVersusTable(b, ratios, r3, "nereus r3", "nereus r3",
			func(rr ratioRow) (float64, []ratioVersus) { return *rr.NereusR3, rr.R3Versus })
	}
}
