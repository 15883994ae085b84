package sim

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// The faults a cluster run injects (ClusterFaults): one is drawn every 50
// to 400 ms of the fault phase from those enabled, weighted; each heals by
// itself after a while, and the liveness phase heals them all.

// ClusterFaults selects the faults a cluster run injects.
type ClusterFaults struct {
	// Crash: kill -9 of one node, its unsynced writes lost, the last
	// maybe torn; with topic churn or group deletes also the heir fault
	// (coordcheck.go: the metadata leader as it applies their entry).
	Crash     bool
	PowerLoss bool // every node loses its unsynced writes at once
	KillPoint bool // kill -9 of one node just before a chosen disk write or fsync
	Partition bool // a node cut off from its peers (both ways or one way), or from all but one (a bridge)
	Network   bool // peer frames dropped and duplicated for a while
	Fsync     bool // bursts of failing fsyncs, or failing writes, on one node
	Clients   bool // client connections broken
	Clock     bool // one node's clock jumps forward or back
	Pause     bool // one node stops (SIGSTOP, a VM pause) and resumes where it was
	// Stall holds up every replica group member of one node (its disk's
	// fsyncs hang) while the rest of it runs: its sessions, runners and
	// network go on, its published statuses stand still.
	Stall bool
	// BitFlip flips a bit in a partition segment, a replica's hard state,
	// meta.json, a group's state file or any other file, of a minority of
	// the nodes only (minority) — a damaged minority, which must cost no
	// acknowledged record.
	BitFlip bool
	// Outage makes one destination topic of the scheduled-delivery
	// workload unreachable for a while (schedghost.go; runs without
	// schedules draw no outage).
	Outage bool
}

// ClusterFaultNames lists the names ParseClusterFaults accepts.
var ClusterFaultNames = []string{"crash", "powerloss", "killpoint", "partition", "network", "fsync", "clients", "clock", "pause", "stall", "bitflip", "outage"}

// AllClusterFaults enables every cluster fault.
var AllClusterFaults = ClusterFaults{Crash: true, PowerLoss: true, KillPoint: true, Partition: true, Network: true, Fsync: true, Clients: true,
	Clock: true, Pause: true, Stall: true, BitFlip: true, Outage: true}

// ParseClusterFaults reads "all", "none" or a comma-separated list of
// ClusterFaultNames.
func ParseClusterFaults(list string) (ClusterFaults, error) {
	var f ClusterFaults
	all := AllClusterFaults
	return f, parseFaultList(list, ClusterFaultNames, f.flags(), all.flags())
}

// flags are f's switches in the order of ClusterFaultNames.
func (f *ClusterFaults) flags() []*bool {
	return []*bool{&f.Crash, &f.PowerLoss, &f.KillPoint, &f.Partition, &f.Network, &f.Fsync, &f.Clients, &f.Clock, &f.Pause, &f.Stall, &f.BitFlip, &f.Outage}
}

func (f ClusterFaults) String() string { return faultListString(ClusterFaultNames, f.flags()) }

// injectClusterFault applies one randomly chosen enabled fault, then
// schedules the next. Faults stop when the run heals.
func (s *sim) injectClusterFault() {
	if s.healed {
		return
	}
	defer s.w.after(s.w.between(50, 400), s.injectClusterFault)
	s.faultsInjected++
	f := s.clusterFaults
	var kinds []func()
	add := func(on bool, weight int, fn func()) {
		for i := 0; on && i < weight; i++ {
			kinds = append(kinds, fn)
		}
	}
	n := s.nodes[s.w.rng.IntN(len(s.nodes))]
	add(f.Crash, 3, n.crash)
	add(f.PowerLoss, 1, s.powerLoss)
	add(f.KillPoint, 2, func() { s.armNodeKillPoint(n) })
	add(f.Partition, 3, func() { s.partitionNode(n) })
	add(f.Network, 2, s.flakyNetwork)
	add(f.Fsync, 2, func() { s.nodeFsyncBurst(n) })
	add(f.Clients, 2, s.disconnectClient)
	add(f.Clock, 2, func() { s.nodeClockJump(n) })
	add(f.Pause, 2, func() { s.pauseNode(n) })
	add(f.Stall, 2, func() { s.stallNode(n) })
	add(f.BitFlip, 1, s.flipMinority)
	if s.sched != nil {
		add(f.Outage, 3, s.sched.ghost.destinationOutage)
	}
	kinds[s.w.rng.IntN(len(kinds))]()
}

// powerLoss crashes every node at once: each loses its unsynced writes
// (the fault that, coordinated, loses acknowledged writes in brokers that
// acknowledge before fsync).
func (s *sim) powerLoss() {
	s.w.tracef("fault power loss: every node")
	for _, b := range s.nodes {
		if b.up {
			b.crashNow()
		}
	}
}

func (s *sim) armNodeKillPoint(b *broker) {
	op := []vfs.Op{vfs.OpWrite, vfs.OpSync}[s.w.rng.IntN(2)]
	prefix := []string{"topics/", "meta/"}[s.w.rng.IntN(2)]
	s.w.tracef("fault %s: arm kill -9 before next %s under %s", b.id, op, prefix)
	b.killOnDisk = func(o vfs.Op, name string) bool { return o == op && strings.HasPrefix(name, prefix) }
}

// partitionNode cuts a node off from its peers (both ways, or only what
// it sends, or only what it hears) for a while. Its clients still reach
// it.
func (s *sim) partitionNode(b *broker) {
	id := uint32(slices.Index(s.nodes, b) + 1)
	from, to := true, true
	switch s.w.rng.IntN(4) {
	case 1:
		to = false // it is heard by no one
	case 2:
		from = false // it hears no one
	case 3:
		if len(s.nodes) >= 3 { // a bridge needs two others
			s.bridgePartition(id)
			return
		}
	}
	s.w.tracef("fault partition %s (sends lost %v, receives lost %v)", b.id, from, to)
	s.holdCut(s.net.linksOf(id, from, to), "heal partition "+b.id)
}

// bridgePartition cuts node id off every other node but one, the bridge,
// which still reaches everybody: with three nodes, two that cannot hear
// each other and one that hears both (each side may see a leader the
// other does not).
func (s *sim) bridgePartition(id uint32) {
	bridge := uint32(s.w.rng.IntN(len(s.nodes)-1)) + 1
	if bridge >= id {
		bridge++
	}
	var cut [][2]uint32
	for other := uint32(1); other <= uint32(len(s.nodes)); other++ {
		if other != id && other != bridge {
			cut = append(cut, [2]uint32{id, other}, [2]uint32{other, id})
		}
	}
	s.w.tracef("fault bridge partition: n%d reaches only n%d, which reaches everyone", id, bridge)
	s.holdCut(cut, fmt.Sprintf("heal bridge partition of n%d", id))
}

// holdCut cuts links for 200-2000 ms. Faults overlap: a link stays cut
// until every fault holding it has healed.
func (s *sim) holdCut(links [][2]uint32, healed string) {
	s.net.cutLinks(links, 1)
	s.w.after(s.w.between(200, 2000), func() {
		if !s.healed {
			s.net.cutLinks(links, -1)
			s.w.tracef("%s", healed)
		}
	})
}

// flakyNetwork makes the peer network lossy for a while. Faults overlap:
// the network is healthy again once the last one has healed.
func (s *sim) flakyNetwork() {
	s.net.flakyStart()
	s.w.tracef("fault peer network drops 20%%, duplicates 10%%, delays 5%% by 50-600 ms")
	s.w.after(s.w.between(100, 1000), func() {
		if !s.healed && s.net.flakyEnd() {
			s.w.tracef("peer network healthy")
		}
	})
}

// flakyStart begins one lossy-network fault.
func (n *peerNet) flakyStart() {
	n.flaky++
	n.dropP, n.dupP, n.delayP = 0.2, 0.1, 0.05
}

// flakyEnd ends one; it reports whether the network is healthy again
// (no other is in force).
func (n *peerNet) flakyEnd() bool {
	if n.flaky--; n.flaky > 0 {
		return false
	}
	n.flaky, n.dropP, n.dupP, n.delayP = 0, 0, 0, 0
	return true
}

// nodeFsyncBurst makes one node's disk fail for a while: its fsyncs, or
// its writes.
func (s *sim) nodeFsyncBurst(b *broker) {
	if s.w.rng.IntN(2) == 0 {
		b.fsyncErrorP = 0.3
		s.w.tracef("fault %s fsync errors", b.id)
	} else {
		b.writeErrorP = 0.3
		s.w.tracef("fault %s write errors", b.id)
	}
	s.w.after(s.w.between(50, 400), func() { b.fsyncErrorP, b.writeErrorP = 0, 0 })
}

// nodeClockJump moves one node's wall clock forward (what falls due by it
// falls due early) or back by up to 3 s; its monotonic clock (ticks,
// leases) does not jump.
func (s *sim) nodeClockJump(b *broker) {
	d := s.w.between(-3000, 3000)
	b.skewMs += d
	s.w.tracef("fault %s clock jumps %+dms (skew %dms)", b.id, d, b.skewMs)
	if s.sched != nil {
		// At once: NeverEarly's bound must hold a skew the run heals
		// before the workload's sampled observation sees it.
		s.sched.maxSkewMs = max(s.sched.maxSkewMs, b.skewMs)
	}
}

// pauseNode stops a node for 100 ms to 2 s: nothing it is sent is handled,
// none of its timers fire, it takes no step; then it resumes where it was
// (its peers may have moved on).
func (s *sim) pauseNode(b *broker) {
	if !b.up || b.paused() {
		return
	}
	b.pausedUntil = s.w.nowMs + s.w.between(100, 2000)
	s.w.tracef("fault %s pauses until %d", b.id, b.pausedUntil-epochMs)
}

// stallNode holds up every replica group member of node b for a while
// (a disk whose fsyncs hang): its followers stop hearing it, its leaders'
// published statuses stand still while their leases run out on the
// clock, and everything else on the node runs on.
func (s *sim) stallNode(b *broker) {
	if !b.up || b.stalled() {
		return
	}
	b.stalledUntil = s.w.nowMs + s.w.between(100, 2000)
	n := b.node.HoldUpReplicas(b.stalledUntil)
	s.w.tracef("fault %s stalls %d replica members until %d", b.id, n, b.stalledUntil-epochMs)
}

// minority is the nodes whose disks bit flips may damage: the last
// R − quorum of them for the topics' replication factor R (one of three,
// two of five; none of one), so that the damage stays on a minority of
// every replica group whatever its placement — and of the metadata log's,
// which has every node.
func (s *sim) minority() []*broker { return s.nodes[len(s.nodes)-(int(s.replicas)-1)/2:] }

// flipMinority damages one minority node's disk (flipMinorityBit) or,
// with more than one minority node, now and then the hard states of one
// replica group on all of them at once (loseMinorityPromises).
func (s *sim) flipMinority() {
	m := s.minority()
	if len(m) == 0 {
		s.flipLoneReplica()
		return
	}
	if len(m) == 1 {
		s.flipMinorityBit(m[0])
		return
	}
	if s.w.rng.IntN(4) == 0 {
		s.loseMinorityPromises(m)
		return
	}
	s.flipMinorityBit(m[s.w.rng.IntN(len(m))])
}

// flipLoneReplica flips one bit of a segment of one of the workload
// topic's partitions on the node that holds its only replica (a topic of
// one replica): no healthy copy is left, so the partition may lose
// records (checker.damaged), but never silently — its node refuses the
// damage (DATA_CORRUPT) until the operator repairs it, and never serves
// a damaged record.
func (s *sim) flipLoneReplica() {
	if len(s.nodes) == 1 && s.w.rng.IntN(4) == 0 {
		s.flipLoneMeta(s.nodes[0])
		return
	}
	if s.kv != nil && s.w.rng.IntN(3) == 0 {
		s.flipLoneBucket()
		return
	}
	p := uint32(s.w.rng.IntN(int(s.opts.Partitions)))
	for _, b := range s.nodes {
		if files := segmentFiles(b.fs, p); len(files) > 0 {
			file := files[s.w.rng.IntN(len(files))]
			segment := s.w.rng.IntN(4) != 0
			if !segment {
				// Its hard state or snapshot point: the repair rewrites
				// them from the repaired log (replog.RepairAlone), and
				// neither holds an ack.
				file = path.Join(partitionDir(p), []string{"hardstate", "snapshot"}[s.w.rng.IntN(2)])
			}
			content, _ := b.fs.ReadFile(file) // before the flip: what its batches held
			if off, mask, ok := s.flipFileAt(b, file, 0, 0); ok {
				s.chk.damaged[p] = true
				s.flipped[b.id] = true
				if segment {
					// The group's acks of p live in p's log: those of the
					// flipped batch are lost if a repair drops it or a
					// restart cuts it (loneAcksDropped).
					s.ledgerFlipped(file, content, off, mask, partitionRecordAcks)
				}
			}
			return
		}
	}
}

// flipLoneBucket flips one bit of a segment of the KV bucket's log on
// the node holding its only replica. While that node is down, the bit
// is in the last batch of the newest segment: the batches written in the
// last period before a crash have no mark or snapshot to prove them
// durable, so the restart takes the flip for a torn write
// (TornSeqsNotReused: a watcher may have gone past them).
func (s *sim) flipLoneBucket() {
	dir := path.Join(dataDir, "topics", wire.KVTopic(kvBucket), "0")
	for _, b := range s.nodes {
		if files := logFiles(b.fs, dir); len(files) > 0 {
			file := files[s.w.rng.IntN(len(files))]
			var from, to int64 // the whole file
			if !b.up {
				file = slices.Max(files)
				if content, err := b.fs.ReadFile(file); err == nil {
					if batches := storage.SegmentBatches(content); len(batches) > 0 {
						from, to = batches[len(batches)-1].Offset, batches[len(batches)-1].End
					}
				}
			}
			if s.flipFileIn(b, file, from, to) {
				s.flipped[b.id] = true
				s.repaired["bucket flips"]++
			}
			return
		}
	}
}

// flipLoneMeta flips one bit of a segment or the hard state of a
// one-node cluster's metadata log, its only copy: the node cuts no entry
// it applied (MetaNotCutBelowApplied) — it refuses to start until
// `nereus repair --salvage --one-node-cluster` — and what it applied
// stays in meta.json; an entry cut above that was answered to no client.
func (s *sim) flipLoneMeta(b *broker) {
	dir := path.Join(dataDir, "meta")
	names, _ := b.fs.List(dir)
	var files []string
	for _, n := range names {
		if strings.HasSuffix(n, ".log") || n == "hardstate" {
			files = append(files, path.Join(dir, n))
		}
	}
	if len(files) > 0 && s.flipFile(b, files[s.w.rng.IntN(len(files))]) {
		s.flipped[b.id] = true
		s.repaired["metadata log flips"]++
	}
}

// flipMinorityBit flips one bit of a partition segment on node b's disk
// (current and durable content: media damage), one of its replicas'
// hard states, its meta.json or a group's state file (flipStateFile), or
// any other file of it (flipAnyFile).
func (s *sim) flipMinorityBit(b *broker) {
	if s.w.rng.IntN(4) == 0 {
		s.flipStateFile(b)
		return
	}
	if s.w.rng.IntN(3) == 0 {
		s.flipAnyFile(b)
		return
	}
	p := uint32(s.w.rng.IntN(int(s.opts.Partitions)))
	files := segmentFiles(b.fs, p)
	if len(files) == 0 {
		return
	}
	if s.flipFile(b, files[s.w.rng.IntN(len(files))]) {
		s.flipped[b.id] = true
	}
}

// flipAnyFile flips one bit of any file on node b's disk, its kind drawn
// first (fileKinds): the metadata log's segments and indexes, a KV
// bucket's or a schedule shard's log, a dedup or rebuild snapshot, the
// scheduler's checkpoint — what only a minority holding it damaged must
// not cost. A flipped segment counts as holding everything
// (s.flipped, see holds).
func (s *sim) flipAnyFile(b *broker) {
	kinds := fileKinds(durableFiles(b.fs, dataDir))
	if len(kinds) == 0 {
		return
	}
	files := kinds[s.w.rng.IntN(len(kinds))]
	file := files[s.w.rng.IntN(len(files))]
	if s.flipFile(b, file) && strings.HasSuffix(file, ".log") {
		s.flipped[b.id] = true
	}
}

// flipStateFile flips one bit of the hard state of one of node b's
// replicas (a partition's, or now and then its metadata member's), of its
// meta.json or of a consumer group's settings.json or incarnation file,
// and half the time kills it -9 at once: its restart finds the promises
// unknown (S24), rebuilds meta.json from the metadata log (N25c) or sets
// the group's file again (N25g), unless the file was written again
// first.
func (s *sim) flipStateFile(b *broker) {
	file := path.Join(partitionDir(uint32(s.w.rng.IntN(int(s.opts.Partitions)))), "hardstate")
	switch s.w.rng.IntN(8) {
	case 0:
		file = path.Join(dataDir, "meta", "hardstate")
	case 1:
		file = path.Join(dataDir, cluster.MetaStateFile)
	case 2, 3:
		if files := groupStateFiles(b.fs); len(files) > 0 {
			file = files[s.w.rng.IntN(len(files))]
		}
	}
	if s.flipFile(b, file) && s.w.rng.IntN(2) == 0 {
		b.crash()
	}
}

// loseMinorityPromises flips a bit of one replica group's hard state (a
// partition's, or now and then the metadata member's) on every node of
// the minority and kills each -9 at once: each restarts with its promise
// unknown, and the group's lost replicas are more than one (S24:
// LostPeersFewerThanAQuorum — they take part again on each other's
// PROMISE_UNKNOWN). Result.MinorityPromiseLosses counts the times it hit
// more than one node.
func (s *sim) loseMinorityPromises(m []*broker) {
	file := path.Join(partitionDir(uint32(s.w.rng.IntN(int(s.opts.Partitions)))), "hardstate")
	if s.w.rng.IntN(4) == 0 {
		file = path.Join(dataDir, "meta", "hardstate")
	}
	hit := 0
	for _, b := range m {
		if s.flipFile(b, file) {
			hit++
			b.crash()
		}
	}
	if hit > 1 {
		s.minorityPromiseLosses++
	}
}

// flipFile flips one bit of node b's state file (current and durable
// content), keeping the promise a hard state held as ghost state: it was
// made, and InstallNeedsQuorumPromise counts it (promiseOf). It reports
// whether a bit was flipped.
func (s *sim) flipFile(b *broker, file string) bool { return s.flipFileIn(b, file, 0, 0) }

// flipFileIn is flipFile with the bit in bytes [from, to) of the file
// (to 0: anywhere).
func (s *sim) flipFileIn(b *broker, file string, from, to int64) bool {
	_, _, ok := s.flipFileAt(b, file, from, to)
	return ok
}

// flipFileAt is flipFileIn, returning where the bit went: the offset and
// the mask of the flipped byte.
func (s *sim) flipFileAt(b *broker, file string, from, to int64) (off int64, mask byte, ok bool) {
	size, err := b.fs.Stat(file)
	if err != nil || size == 0 || to > size {
		return 0, 0, false
	}
	if key := b.id + ":" + file; path.Base(file) == "hardstate" {
		s.lostPromises[key] = max(s.lostPromises[key], hardStatePromise(b.fs, file))
	}
	if to == 0 {
		from, to = 0, size
	}
	off = from + s.w.rng.Int64N(to-from)
	bit := uint(s.w.rng.IntN(8))
	if err := b.fs.FlipBit(file, off, bit); err != nil {
		return 0, 0, false
	}
	s.w.tracef("fault %s bit flip %s@%d", b.id, strings.TrimPrefix(file, dataDir+"/"), off)
	return off, byte(1) << bit, true
}

// groupStateFiles lists the consumer groups' settings.json and
// incarnation files (both copies) on fs (groups/<group>/<topic>/), in
// order.
func groupStateFiles(fs *vfs.MemFS) []string {
	var files []string
	groups, _ := fs.List(path.Join(dataDir, "groups"))
	for _, g := range groups {
		topics, _ := fs.List(path.Join(dataDir, "groups", g))
		for _, t := range topics {
			for _, name := range []string{"settings.json", "incarnation", "incarnation.copy"} {
				if f := path.Join(dataDir, "groups", g, t, name); fileExists(fs, f) {
					files = append(files, f)
				}
			}
		}
	}
	return files
}

func fileExists(fs *vfs.MemFS, file string) bool {
	_, err := fs.Stat(file)
	return err == nil
}

// promiseOf is the promise node b's hard-state file holds, or held before
// a bit flip took it (flipStateFile), whichever is higher.
func (s *sim) promiseOf(b *broker, file string) uint64 {
	return max(hardStatePromise(b.fs, file), s.lostPromises[b.id+":"+file])
}

// heal ends every network fault.
func (n *peerNet) heal() {
	clear(n.cut)
	clear(n.cuts)
	n.flaky, n.dropP, n.dupP, n.delayP = 0, 0, 0, 0
	n.outTopic = ""
}

// partitionDir is the directory of the workload topic's partition p on
// a node's file system.
func partitionDir(p uint32) string {
	return path.Join(dataDir, "topics", simTopic, fmt.Sprint(p))
}

// segmentFiles lists the paths of partition p's log segments on fs, in
// seq order (none when it cannot list them).
func segmentFiles(fs *vfs.MemFS, p uint32) []string {
	return logFiles(fs, partitionDir(p))
}

// logFiles lists the segment files of the log in dir on fs.
func logFiles(fs *vfs.MemFS, dir string) []string {
	names, err := fs.List(dir)
	if err != nil {
		return nil
	}
	var files []string
	for _, n := range names {
		if strings.HasSuffix(n, ".log") {
			files = append(files, path.Join(dir, n))
		}
	}
	return files
}

// durableFiles lists every file under dir on fs (dir itself when it is a
// file), in order.
func durableFiles(fs *vfs.MemFS, dir string) []string {
	names, err := fs.List(dir)
	if err != nil {
		return []string{dir}
	}
	var files []string
	for _, n := range names {
		files = append(files, durableFiles(fs, path.Join(dir, n))...)
	}
	return files
}

// fileKinds groups files by their path with every number taken out (a
// kind: every partition's segments of one topic, say), in order.
func fileKinds(files []string) [][]string {
	var kinds [][]string
	index := map[string]int{}
	for _, f := range files {
		k := strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return '#'
			}
			return r
		}, f)
		i, ok := index[k]
		if !ok {
			i = len(kinds)
			index[k] = i
			kinds = append(kinds, nil)
		}
		kinds[i] = append(kinds[i], f)
	}
	return kinds
}
