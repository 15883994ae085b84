package sim

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

// The KV workload of a cluster run (ClusterOptions.KV): kvClients clients
// put, get, compare-and-set and delete kvKeys keys of one bucket
// replicated on every node, each through a connection to every node (a
// request goes to the node the bucket's leader is believed to be;
// NOT_LEADER moves it on to the next node). Each client has one
// operation in flight at a time, and records its invocation and return in
// virtual time with its outcome. After the final power loss a client
// reads every key once more (acknowledged writes survive it). The history
// is then checked for linearizability with porcupine against kvModel, a
// map whose keys carry their revisions, partitioned by key.
//
// What a client records:
//   - a write answered with its revision, a CAS refused with
//     REVISION_MISMATCH (and the key's current revision), a read's value
//     and revision: definite outcomes;
//   - a write whose outcome is unknown (OUTCOME_UNKNOWN, a timeout, its
//     connection closed, any other error after it may have been proposed):
//     never returning (its return after everything), so it may or may not
//     have taken effect;
//   - a write refused before the leader proposed it (NOT_LEADER,
//     UNAVAILABLE, NOT_FOUND, QUORUM_LOST, DATA_CORRUPT: a KV write's
//     definite refusals) is not recorded and is sent again, a new
//     operation;
//   - a read that failed or was not answered is not recorded (it changed
//     nothing and observed nothing).

const (
	kvBucket     = "simkv"
	kvClients    = 3
	kvKeys       = 5
	kvBucketHist = 2
	// kvTombstoneTTLMs: deletes are purged this soon, so compaction
	// raises the bucket's floor within a run (the watcher may then meet
	// CURSOR_EXPIRED).
	kvTombstoneTTLMs = 300
	// kvOpTimeoutMs: a request unanswered this long has an unknown
	// outcome; the client moves on.
	kvOpTimeoutMs = 2000
	// Checkpoints and truncation of the bucket's log in a run: a
	// checkpoint once kvCheckpointMinBytes of log follow the last one (or
	// the state's size, if larger), segments of kvSegmentBytesMax, the
	// log compacted every kvRetentionCheckMs.
	kvCheckpointMinBytes = 2048
	kvSegmentBytesMax    = 1024
	kvRetentionCheckMs   = 100
	// kvReservation: how long a leader keeps the log a silent follower
	// needs (node.ClusterConfig.Reservation) in KV runs.
	kvReservation = 500 * time.Millisecond
)

type kvOpKind uint8

const (
	kvGet kvOpKind = iota
	kvPut
	kvCAS
	kvDel
)

func (k kvOpKind) String() string { return [...]string{"get", "put", "cas", "del"}[k] }

// kvInput is an operation as invoked: Value for put and CAS (unique per
// write), Expected for CAS (0: the key must be absent).
type kvInput struct {
	Op       kvOpKind
	Key      string
	Value    string
	Expected uint64
}

// kvOutput is its outcome: Unknown (never returned), or a read's Found,
// Value and Rev, a write's Rev, a refused CAS's Mismatch with the key's
// current revision in Rev.
type kvOutput struct {
	Unknown  bool
	Found    bool
	Value    string
	Rev      uint64
	Mismatch bool
}

// kvOp is a client's operation in flight.
type kvOp struct {
	in     kvInput
	create bool // the bucket's creation (not recorded)
	final  bool // a read after the final power loss: read until answered
	callMs int64
	corr   uint64
	conn   *conn
}

type kvWorkload struct {
	s       *sim
	clients []*kvClient
	watcher *kvWatcher
	history []porcupine.Operation
	unknown int // writes recorded with an unknown outcome
	// finalReads: the keys a client reads after the final power loss.
	finalReads []string
	// At the end (kvFinal): the highest log start and checkpoint base of
	// the bucket's replicas; over the run: how often replicas rebuilt it
	// from a checkpoint in their log, and how often because their log was
	// reset under them (countRebuilds).
	logStartMax, checkpointMax uint64
	rebuilds, resets           int
	// losses: what a bucket of one replica lost, in time order; operator:
	// who creates it again when it cannot be rebuilt (kvloss.go).
	losses   []kvLoss
	operator *kvRecreator
}

// countRebuilds adds an incarnation's rebuilds (as it crashes, and at the
// end).
func (kw *kvWorkload) countRebuilds(n *node.Node) {
	if st, ok := n.KVStateOf(kvBucket); ok {
		kw.rebuilds += st.Rebuilds
		kw.resets += st.Resets
	}
}

type kvClient struct {
	kw    *kvWorkload
	id    int
	total int // operations to run
	next  int // operations drawn so far
	kvConns
	at int // the node the bucket's leader is believed to be
	// created: the bucket was confirmed (KV_BUCKET_OK) to this client.
	created bool
	cur     *kvOp
	retry   *kvInput // a write refused before it was proposed, to send again
	corr    uint64
	lastRev map[string]uint64 // the revision the client last saw per key
	values  int
	// readsTo, when not 0, sends every read to node readsTo-1 (scripted
	// scenarios: a client that keeps reading from one node). casTo makes
	// the client a refuser (addRefuser): its CASes go to node casTo-1,
	// which can only refuse them (a read of its state), its puts to the
	// other nodes.
	readsTo, casTo int
}

func newKVWorkload(s *sim, opsPerClient int) *kvWorkload {
	kw := &kvWorkload{s: s}
	for i := range kvClients {
		c := kw.newClient(opsPerClient, i%len(s.nodes))
		for at := range s.nodes {
			s.w.after(s.w.between(0, 10), func() { c.connect(s, c, at) })
		}
		s.w.after(s.w.between(10, 50), c.issue)
	}
	kw.watcher = newKVWatcher(kw)
	kw.operator = &kvRecreator{kw: kw, kvConns: kvConns{make([]*conn, len(s.nodes))}}
	return kw
}

// newClient adds client number len(clients)+1, with total operations,
// starting at node at; the caller connects it.
func (kw *kvWorkload) newClient(total, at int) *kvClient {
	c := &kvClient{kw: kw, id: len(kw.clients) + 1, total: total, kvConns: kvConns{make([]*conn, len(kw.s.nodes))}, at: at,
		lastRev: map[string]uint64{}}
	kw.clients = append(kw.clients, c)
	return c
}

// addRefuser adds a client (scripted scenarios) that puts its own keys
// at the other nodes and sends node zombie CASes of them it can only
// refuse (drawRefusal). It joins at once, with no operation in flight
// that could hold it up behind the zombie.
func (kw *kvWorkload) addRefuser(zombie int) *kvClient {
	s := kw.s
	c := kw.newClient(kvRefuserOps, (zombie+1)%len(s.nodes))
	c.casTo, c.created = zombie+1, true
	for at := range s.nodes {
		c.connect(s, c, at)
	}
	s.w.tracef("scenario: %s joins, its CASes to n%d", c.name(), zombie+1)
	s.w.after(5, c.issue)
	return c
}

// kvRefuserOps bounds a refuser's operations (addRefuser).
const kvRefuserOps = 60

func kvKey(i int) string { return fmt.Sprintf("k%d", i) }

func (c *kvClient) name() string { return fmt.Sprintf("kv%d", c.id) }

// kvConns are a KV client's connections, one to every node.
type kvConns struct{ conns []*conn }

// connect dials node at for cl and says hello.
func (k *kvConns) connect(s *sim, cl client, at int) {
	k.conns[at] = s.dial(cl, at)
	if c := k.conns[at]; c.open {
		c.send(0, &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, ClientName: cl.name()})
	}
}

// closed dials again, later, the node of a connection that closed, and
// reports whether it was one of these.
func (k *kvConns) closed(s *sim, cl client, c *conn) bool {
	at := slices.Index(k.conns, c)
	if at >= 0 {
		s.w.after(s.w.between(10, 200), func() { k.connect(s, cl, at) })
	}
	return at >= 0
}

func (c *kvClient) onClose(cn *conn) {
	if c.closed(c.kw.s, c, cn) && c.cur != nil && c.cur.conn == cn {
		c.fail(c.cur, "connection closed")
	}
}

// issue starts the client's next operation, unless one is in flight:
// the bucket's creation first, then a refused write again, then a new
// operation, then the final reads.
func (c *kvClient) issue() {
	if c.cur != nil {
		return
	}
	var in kvInput
	final := false
	switch {
	case !c.created:
		c.send(&kvOp{create: true}, &wire.KVBucketCreate{Config: wire.KVBucketConfig{Bucket: kvBucket, History: kvBucketHist,
			TombstoneTTLMs: kvTombstoneTTLMs, Replicas: c.kw.s.replicas}})
		return
	case c.retry != nil:
		in, c.retry = *c.retry, nil
	case c.next < c.total:
		c.next++
		in = c.draw()
	case c.id == 1 && len(c.kw.finalReads) > 0:
		in, final = kvInput{Op: kvGet, Key: c.kw.finalReads[0]}, true
		c.kw.finalReads = c.kw.finalReads[1:]
	default:
		return
	}
	op := &kvOp{in: in, final: final}
	switch in.Op {
	case kvGet:
		c.send(op, &wire.KVGet{Bucket: kvBucket, Key: []byte(in.Key)})
	case kvPut, kvCAS:
		c.send(op, &wire.KVWrite{Bucket: kvBucket, Op: wire.KVOpPut, Key: []byte(in.Key), Value: []byte(in.Value),
			Conditional: in.Op == kvCAS, Expected: in.Expected})
	case kvDel:
		c.send(op, &wire.KVWrite{Bucket: kvBucket, Op: wire.KVOpDelete, Key: []byte(in.Key)})
	}
}

// kvUnheldRevisionStep puts a refuser's expected revision past any the
// run reaches (drawRefusal).
const kvUnheldRevisionStep = 1 << 40

// drawRefusal is a refuser's next operation (addRefuser), in pairs: a put
// of one of its own two keys, which no other client writes, then a CAS of
// that key expecting a revision no state holds. The zombie can only
// refuse it, naming the put's revision as current — unless it answers
// from a state that misses the put.
func (c *kvClient) drawRefusal() kvInput {
	key := fmt.Sprintf("r%d", (c.next-1)/2%2)
	c.values++
	in := kvInput{Op: kvPut, Key: key, Value: fmt.Sprintf("c%d-%d", c.id, c.values)}
	c.kw.watcher.keyOf[in.Value] = key
	if c.next%2 == 0 {
		in.Op, in.Expected = kvCAS, c.lastRev[key]+kvUnheldRevisionStep
	}
	return in
}

// draw picks the next operation: a key, and get, put, CAS (expecting the
// revision the client last saw of the key, or absence) or delete.
func (c *kvClient) draw() kvInput {
	if c.casTo != 0 {
		return c.drawRefusal()
	}
	w := c.kw.s.w
	in := kvInput{Key: kvKey(w.rng.IntN(kvKeys))}
	switch r := w.rng.IntN(100); {
	case r < 35:
		in.Op = kvGet
	case r < 60:
		in.Op = kvPut
	case r < 85:
		in.Op = kvCAS
		if !w.chance(0.2) {
			in.Expected = c.lastRev[in.Key]
		}
	default:
		in.Op = kvDel
	}
	if in.Op == kvPut || in.Op == kvCAS {
		c.values++
		in.Value = fmt.Sprintf("c%d-%d", c.id, c.values)
		c.kw.watcher.keyOf[in.Value] = in.Key
	}
	return in
}

// send sends op's request to the node believed to lead, and arms its
// timeout. With no open connection there it tries the next node later.
//
// A read goes to a random node one time in three instead (a client whose
// idea of the leader is stale): any node but the bucket's leader under
// its lease must refuse it.
func (c *kvClient) send(op *kvOp, f wire.Frame) {
	w := c.kw.s.w
	at := c.at
	switch {
	case op.create:
	case c.readsTo != 0 && op.in.Op == kvGet:
		at = c.readsTo - 1
	case c.casTo != 0 && op.in.Op == kvCAS:
		at = c.casTo - 1
	case c.casTo != 0 && at == c.casTo-1:
		at = (at + 1) % len(c.conns) // a refuser's puts go to the others
	case op.in.Op != kvGet:
	case w.rng.IntN(3) == 0:
		at = w.rng.IntN(len(c.conns))
	}
	cn := c.conns[at]
	if cn == nil || !cn.open {
		if at == c.at {
			c.at = (c.at + 1) % len(c.conns)
		}
		c.again(op)
		return
	}
	c.corr++
	op.corr, op.conn, op.callMs = c.corr, cn, w.nowMs
	c.cur = op
	w.tracef("%s -> n%d %s", c.name(), at+1, op)
	cn.send(op.corr, f)
	w.after(kvOpTimeoutMs, func() {
		if c.cur == op {
			c.fail(op, "timeout")
		}
	})
}

func (op *kvOp) String() string {
	if op.create {
		return "create bucket"
	}
	return op.in.String()
}

func (in kvInput) String() string {
	switch in.Op {
	case kvGet, kvDel:
		return fmt.Sprintf("%s %s", in.Op, in.Key)
	case kvCAS:
		return fmt.Sprintf("cas %s=%s if rev %d", in.Key, in.Value, in.Expected)
	}
	return fmt.Sprintf("put %s=%s", in.Key, in.Value)
}

func (c *kvClient) onFrame(cn *conn, corr uint64, f wire.Frame) {
	op := c.cur
	if op == nil || corr != op.corr || cn != op.conn {
		return // a late answer to an operation already recorded unknown
	}
	w := c.kw.s.w
	switch f := f.(type) {
	case *wire.KVBucketOK:
		c.created = true
		c.done(op, "bucket ok")
	case *wire.KVGetOK:
		out := kvOutput{Found: f.Found}
		if f.Found {
			out.Value, out.Rev = string(f.Entry.Value), f.Entry.Revision
			c.lastRev[op.in.Key] = out.Rev
		}
		c.record(op, out)
	case *wire.KVWriteOK:
		c.lastRev[op.in.Key] = f.Revision
		c.kw.watcher.acknowledged(f.Revision, op.in)
		c.record(op, kvOutput{Rev: f.Revision})
	case *wire.Err:
		code := f.Code
		switch {
		case code == wire.CodeRevisionMismatch && op.in.Op == kvCAS:
			current, ok := wire.MismatchCurrent(f.AsError())
			if !ok {
				c.kw.s.chk.violate(KVLinearizable, "%s: REVISION_MISMATCH without the current revision: %s", c.name(), f.AsError())
				return
			}
			c.lastRev[op.in.Key] = current
			c.record(op, kvOutput{Mismatch: true, Rev: current})
		case code == wire.CodeNotLeader || code == wire.CodeUnavailable || code == wire.CodeNotFound || code == wire.CodeQuorumLost || code == wire.CodeDataCorrupt:
			// Refused before anything was proposed: nothing happened. A
			// leader without a quorum may have been replaced elsewhere; a
			// bucket of one replica found damaged answers nothing until
			// its node is repaired.
			if (code == wire.CodeNotLeader || code == wire.CodeQuorumLost) && c.at == slices.Index(c.conns, cn) {
				c.at = (c.at + 1) % len(c.conns)
			}
			c.cur = nil
			if code == wire.CodeDataCorrupt {
				w.tracef("%s <- %s: %v", c.name(), op, f.AsError())
				if strings.Contains(f.Message, kvRecreateAdvice) {
					c.kw.operator.start(slices.Index(c.conns, cn), op.callMs)
				}
			} else {
				w.tracef("%s <- %s: %s", c.name(), op, code)
			}
			c.again(op)
		default:
			c.fail(op, f.AsError().Error())
		}
	}
}

// record keeps op's definite outcome and starts the next operation.
func (c *kvClient) record(op *kvOp, out kvOutput) {
	c.kw.history = append(c.kw.history, porcupine.Operation{ClientId: c.id - 1, Input: op.in, Call: op.callMs, Output: out, Return: c.kw.s.w.nowMs})
	c.done(op, fmt.Sprintf("%+v", out))
}

// fail ends op without an answer: a write may or may not have taken
// effect (recorded as never returning); a read is dropped (a final read
// is tried again); the bucket's creation is tried again.
func (c *kvClient) fail(op *kvOp, why string) {
	if !op.create && op.in.Op != kvGet {
		c.kw.history = append(c.kw.history, porcupine.Operation{ClientId: c.id - 1, Input: op.in, Call: op.callMs, Output: kvOutput{Unknown: true}, Return: math.MaxInt64})
		c.kw.unknown++
	} else if op.final {
		c.kw.finalReads = append(c.kw.finalReads, op.in.Key)
	}
	if op.conn != nil && !op.conn.open || why == "timeout" {
		c.at = (c.at + 1) % len(c.conns) // (an error answer leaves it: NOT_LEADER moves it)
	}
	c.done(op, "unknown: "+why)
}

// again sends what was refused before it took effect once more, later: a
// write (a new operation), a final read; the bucket's creation is sent
// again by issue until confirmed.
func (c *kvClient) again(op *kvOp) {
	switch {
	case op.final:
		c.kw.finalReads = append(c.kw.finalReads, op.in.Key)
	case !op.create && op.in.Op != kvGet:
		c.retry = &op.in
	}
	w := c.kw.s.w
	w.after(w.between(5, 50), c.issue)
}

func (c *kvClient) done(op *kvOp, what string) {
	w := c.kw.s.w
	c.cur = nil
	w.tracef("%s <- %s: %s", c.name(), op, what)
	w.after(w.between(0, 20), c.issue)
}

// done reports whether every client ran its operations and the final
// reads were answered.
func (kw *kvWorkload) done() bool {
	return kw.opsDone() && len(kw.finalReads) == 0 && kw.watcher.caughtUp()
}

// opsDone reports whether every client ran its operations.
func (kw *kvWorkload) opsDone() bool {
	for _, c := range kw.clients {
		if c.cur != nil || c.retry != nil || c.next < c.total {
			return false
		}
	}
	return true
}

// missing counts the operations not run yet (and a watcher behind).
func (kw *kvWorkload) missing() int {
	n := len(kw.finalReads)
	if !kw.watcher.caughtUp() {
		n++
	}
	for _, c := range kw.clients {
		n += c.total - c.next
		if c.cur != nil || c.retry != nil {
			n++
		}
	}
	return n
}

// kvFinal reads every key once more after the final power loss (until
// answered, within the deadline), then checks the whole history.
func (s *sim) kvFinal(deadline int64) {
	kw := s.kv
	for k := range kvKeys {
		kw.finalReads = append(kw.finalReads, kvKey(k))
	}
	kw.clients[0].issue()
	for s.chk.violation == nil && !kw.done() {
		if s.w.nowMs > deadline || !s.step() {
			if owed := kw.watcher.owed; owed != "" {
				s.chk.violate(LossExpiresEveryCursor, "30 s after the final power loss, the watcher was still not told: %s", owed)
				return
			}
			s.chk.violate(Liveness, "30 s after the final power loss, %d KV reads not answered", kw.missing())
			return
		}
	}
	for _, b := range s.nodes {
		if !b.up {
			continue
		}
		if infos, err := b.node.KVBuckets(kvBucket); err == nil {
			s.w.tracef("kv: %s applied the bucket to revision %d, floor %d", b.id, infos[0].Revision, infos[0].Floor)
		}
	}
	s.kvReplicasAgree(deadline)
	for _, b := range s.nodes {
		if b.up {
			kw.countRebuilds(b.node)
		}
	}
	if s.chk.violation == nil {
		kw.check()
	}
}

// KVReplicasAgree: once every replica applied the bucket's log to the
// same seq, every replica holds the same bucket (equal snapshot encodings) —
// whether it applied the whole log or rebuilt from a checkpoint in it
// after its log was truncated or reset to its leader's snapshot point.
const KVReplicasAgree = "KVReplicasAgree"

// kvReplicasAgree waits until every replica of the bucket applied it to
// the same seq, then compares their buckets.
func (s *sim) kvReplicasAgree(deadline int64) {
	kw := s.kv
	for s.chk.violation == nil {
		var states []node.KVState
		var ids []string
		for _, b := range s.nodes {
			if !b.up {
				continue
			}
			if st, ok := b.node.KVStateOf(kvBucket); ok {
				states, ids = append(states, st), append(ids, b.id)
			}
		}
		agreed := len(states) == int(s.replicas) // the bucket's replicas: every node, or some

		for _, st := range states {
			agreed = agreed && st.Applied == states[0].Applied && st.Snapshot != nil
		}
		if agreed {
			for i, st := range states {
				s.w.tracef("kv: %s: applied %d, log from %d, latest checkpoint %d, %d rebuilds from a checkpoint", ids[i], st.Applied, st.LogStart, st.Checkpoint, st.Rebuilds)
				kw.logStartMax, kw.checkpointMax = max(kw.logStartMax, st.LogStart), max(kw.checkpointMax, st.Checkpoint)
				if !bytes.Equal(st.Snapshot, states[0].Snapshot) {
					s.chk.violate(KVReplicasAgree, "at seq %d, %s's bucket (%d bytes) differs from %s's (%d bytes)", st.Applied, ids[i], len(st.Snapshot), ids[0], len(states[0].Snapshot))
					return
				}
			}
			return
		}
		if s.w.nowMs > deadline || !s.step() {
			for i, st := range states {
				s.w.tracef("kv: %s: applied %d, log from %d, latest checkpoint %d, bucket %v", ids[i], st.Applied, st.LogStart, st.Checkpoint, st.Snapshot != nil)
			}
			s.chk.violate(KVReplicasAgree, "30 s after the final power loss, the bucket's replicas have not all applied it to the same seq")
			return
		}
	}
}
