package sim

import (
	"bytes"
	"fmt"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/wire"
)

// peerNet is the simulated network between cluster members
// (env.PeerNetwork): every frame crosses it encoded (the codec runs), as
// a World event after a random delay, so frames reorder; links can be cut
// one way or both (partitions), and frames dropped or duplicated. A
// member's frames arrive on the simulator's goroutine, inside its
// broker's guard (a kill point in the handler is a kill -9).
type peerNet struct {
	w       *World
	members map[uint32]*peerLink // the current incarnation of each member
	brokers map[uint32]*broker
	// cut holds the directed links that lose everything: scripted
	// scenarios set and clear links outright (setCut); random faults
	// overlap, so each counts its links in and out (cutLinks), and a link
	// heals only when the last fault holding it ends.
	cut  map[[2]uint32]bool
	cuts map[[2]uint32]int
	// flaky counts the lossy-network faults in force (flakyNetwork).
	flaky int
	dropP float64
	dupP  float64
	// delayP: a frame arrives 50-600 ms late, as one queued on a link
	// that was reconnecting does — after frames sent later, and maybe at
	// a later incarnation of its addressee (S18's stale FLUSHED).
	delayP float64
	sent   int // frames put on the network (for campaign statistics)
	// hold, set by scripted scenarios only (nil otherwise), takes the
	// frames it matches off the network as they are sent: kept in held,
	// neither lost nor delivered, until the scenario releases them (a
	// frame stuck in a queue for as long as the scenario needs).
	hold func(from, to uint32, f wire.Frame) bool
	held []heldFrame
	// inOrder, set by scripted scenarios only, makes every link deliver
	// in the order sent (one TCP connection's way); lastAt is when each
	// link's last frame arrives.
	inOrder bool
	lastAt  map[[2]uint32]int64
	// outTopic, when set, is a destination topic in outage (schedghost.go):
	// its replication frames and the publishes forwarded to its leaders
	// are lost.
	outTopic string
}

// heldFrame is a frame hold took off the network: f is its decoded copy,
// for the scenario to look at.
type heldFrame struct {
	from, to uint32
	f        wire.Frame
	frame    []byte
}

func newPeerNet(w *World) *peerNet {
	return &peerNet{w: w, members: map[uint32]*peerLink{}, brokers: map[uint32]*broker{}, cut: map[[2]uint32]bool{}, cuts: map[[2]uint32]int{}}
}

// peerLink is one incarnation of a member on the network.
type peerLink struct {
	net    *peerNet
	ep     env.PeerEndpoint
	closed bool
}

// Join attaches a member's new incarnation; the previous one's link stops.
func (n *peerNet) Join(ep env.PeerEndpoint) (env.PeerLink, error) {
	if _, ok := n.brokers[ep.ID]; !ok {
		return nil, fmt.Errorf("sim: member %d has no broker on the peer network", ep.ID)
	}
	if old := n.members[ep.ID]; old != nil {
		old.closed = true
	}
	l := &peerLink{net: n, ep: ep}
	n.members[ep.ID] = l
	return l, nil
}

// Send puts f on the network; it reports false only for a closed link or
// an unknown member (loss in flight is silent).
func (l *peerLink) Send(to uint32, f wire.Frame) bool {
	n := l.net
	if l.closed || n.brokers[to] == nil {
		return false
	}
	n.sent++
	if n.hold != nil && n.hold(l.ep.ID, to, f) {
		frame := wire.AppendFrame(nil, 0, f)
		n.held = append(n.held, heldFrame{from: l.ep.ID, to: to, f: decodePeerFrame(frame), frame: frame})
		return true
	}
	if n.isCut(l.ep.ID, to) || n.isOut(f) || n.w.chance(n.dropP) {
		return true
	}
	frame := wire.AppendFrame(nil, 0, f)
	copies := 1
	if n.w.chance(n.dupP) {
		copies = 2
	}
	from := l.ep.ID
	for range copies {
		delay := n.w.between(1, 8)
		if n.w.chance(n.delayP) {
			delay = n.w.between(50, 600)
		}
		if n.inOrder {
			link := [2]uint32{from, to}
			if n.lastAt == nil {
				n.lastAt = map[[2]uint32]int64{}
			}
			delay = max(delay, n.lastAt[link]-n.w.nowMs)
			n.lastAt[link] = n.w.nowMs + delay
		}
		n.w.after(delay, func() { n.deliver(from, to, frame) })
	}
	return true
}

// isOut reports whether f belongs to the topic in outage.
func (n *peerNet) isOut(f wire.Frame) bool {
	switch f := f.(type) {
	case *wire.Replicate:
		return n.outTopic != "" && f.Topic == n.outTopic
	case *wire.PeerPublish:
		return n.outTopic != "" && f.Pub.Topic == n.outTopic
	}
	return false
}

// deliver hands a frame to the member's current incarnation, if it is up
// and the link was not cut meanwhile.
func (n *peerNet) deliver(from, to uint32, frame []byte) {
	if !n.isCut(from, to) {
		n.handOver(from, to, frame)
	}
}

// handOver gives a frame to the member's current incarnation, if it is
// up; it reports whether its handler ran (a paused member gets it when it
// resumes).
func (n *peerNet) handOver(from, to uint32, frame []byte) bool {
	dst, b := n.members[to], n.brokers[to]
	if dst == nil || dst.closed || !b.up {
		return false
	}
	if b.paused() { // a stopped process reads its socket when it resumes
		n.w.after(b.pausedUntil-n.w.nowMs, func() { n.deliver(from, to, frame) })
		return false
	}
	f := decodePeerFrame(frame)
	b.guard(func() error { dst.ep.Handler(from, f); return nil })
	return true
}

func decodePeerFrame(frame []byte) wire.Frame {
	_, f, err := wire.ReadFrame(bytes.NewReader(frame), wire.DefaultFrameBytesMax)
	if err != nil {
		panic(fmt.Sprintf("sim: a member sent an undecodable frame: %v", err))
	}
	return f
}

// release hands the held frames that match to their addressees' current
// incarnations now, in the order they were sent, whatever the cuts (the
// scenario chose the moment); the others stay held. It reports how many
// reached a running member.
func (n *peerNet) release(match func(heldFrame) bool) (delivered int) {
	var kept, out []heldFrame
	for _, h := range n.held {
		if match(h) {
			out = append(out, h)
		} else {
			kept = append(kept, h)
		}
	}
	n.held = kept
	for _, h := range out {
		if n.handOver(h.from, h.to, h.frame) {
			delivered++
		}
	}
	return delivered
}

// ClientAddr is where member id serves clients (its node id here).
func (l *peerLink) ClientAddr(id uint32) string {
	if m := l.net.members[id]; m != nil {
		return m.ep.ClientAddr
	}
	return ""
}

func (l *peerLink) Close() error {
	l.closed = true
	if l.net.members[l.ep.ID] == l {
		delete(l.net.members, l.ep.ID)
	}
	return nil
}

// setCut cuts (or restores) the links from and/or to member id, whatever
// cut them before (scripted scenarios).
func (n *peerNet) setCut(id uint32, from, to bool) {
	for other := range n.brokers {
		if other == id {
			continue
		}
		for k, on := range map[[2]uint32]bool{{id, other}: from, {other, id}: to} {
			if on {
				n.cut[k] = true
			} else {
				delete(n.cut, k)
			}
		}
	}
}

// cutLinks adds (delta 1) or removes (delta -1) one random fault's hold
// on links.
func (n *peerNet) cutLinks(links [][2]uint32, delta int) {
	for _, k := range links {
		if n.cuts[k] += delta; n.cuts[k] <= 0 {
			delete(n.cuts, k)
		}
	}
}

func (n *peerNet) isCut(from, to uint32) bool {
	k := [2]uint32{from, to}
	return n.cut[k] || n.cuts[k] > 0
}

// anyCut reports whether some link is cut.
func (n *peerNet) anyCut() bool { return len(n.cut) > 0 || len(n.cuts) > 0 }

// linksOf lists the links from (if from) and to (if to) member id.
func (n *peerNet) linksOf(id uint32, from, to bool) [][2]uint32 {
	var links [][2]uint32
	for other := range n.brokers {
		if other == id {
			continue
		}
		if from {
			links = append(links, [2]uint32{id, other})
		}
		if to {
			links = append(links, [2]uint32{other, id})
		}
	}
	return links
}

// nodeClock is a cluster member's env.Clock: its wall clock (NowMs) is
// virtual time plus its own skew (clock jumps of one node); its monotonic
// clock (NowNanos: ticks, leases, durations) is virtual time alone, which
// a wall-clock jump does not move — as env.Wall's (a process's start
// plus the monotonic time since). Its AfterFunc callbacks, like
// everything else addressed to the node, wait while the node is paused.
type nodeClock struct{ b *broker }

func (c nodeClock) NowMs() int64    { return c.b.w.nowMs + c.b.skewMs }
func (c nodeClock) NowNanos() int64 { return c.b.w.nowMs * 1_000_000 }

func (c nodeClock) AfterFunc(d time.Duration, f func()) env.Timer {
	t := &worldTimer{fn: f}
	var fire func()
	fire = func() {
		if c.b.paused() {
			c.b.w.after(c.b.pausedUntil-c.b.w.nowMs, fire)
			return
		}
		t.fire()
	}
	c.b.w.after(int64((d+time.Millisecond-1)/time.Millisecond), fire)
	return t
}

func (nodeClock) NewTicker(time.Duration) env.Ticker {
	panic("sim: a node asked for a ticker; a Manual node is stepped by the simulator")
}
