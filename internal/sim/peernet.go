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
	cut     map[[2]uint32]bool // directed links that lose everything
	dropP   float64
	dupP    float64
	// delayP: a frame arrives 50-600 ms late, as one queued on a link
	// that was reconnecting does — after frames sent later, and maybe at
	// a later incarnation of its addressee (S18's stale FLUSHED).
	delayP float64
	sent   int // frames put on the network (for campaign statistics)
}

func newPeerNet(w *World) *peerNet {
	return &peerNet{w: w, members: map[uint32]*peerLink{}, brokers: map[uint32]*broker{}, cut: map[[2]uint32]bool{}}
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
	if n.cut[[2]uint32{l.ep.ID, to}] || n.w.chance(n.dropP) {
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
		n.w.after(delay, func() { n.deliver(from, to, frame) })
	}
	return true
}

// deliver hands a frame to the member's current incarnation, if it is up
// and the link was not cut meanwhile.
func (n *peerNet) deliver(from, to uint32, frame []byte) {
	dst, b := n.members[to], n.brokers[to]
	if dst == nil || dst.closed || !b.up || n.cut[[2]uint32{from, to}] {
		return
	}
	if b.paused() { // a stopped process reads its socket when it resumes
		n.w.after(b.pausedUntil-n.w.nowMs, func() { n.deliver(from, to, frame) })
		return
	}
	_, f, err := wire.ReadFrame(bytes.NewReader(frame), wire.DefaultFrameBytesMax)
	if err != nil {
		panic(fmt.Sprintf("sim: a member sent an undecodable frame: %v", err))
	}
	b.guard(func() error { dst.ep.Handler(from, f); return nil })
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

// setCut cuts (or restores) the links from and/or to member id.
func (n *peerNet) setCut(id uint32, from, to bool) {
	for other := range n.brokers {
		if other == id {
			continue
		}
		n.cut[[2]uint32{id, other}] = from
		n.cut[[2]uint32{other, id}] = to
	}
}

// nodeClock is a cluster member's env.Clock: virtual time plus its own
// skew (clock jumps of one node). Its AfterFunc callbacks, like everything
// else addressed to the node, wait while the node is paused.
type nodeClock struct{ b *broker }

func (c nodeClock) NowMs() int64    { return c.b.w.nowMs + c.b.skewMs }
func (c nodeClock) NowNanos() int64 { return c.NowMs() * 1_000_000 }

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
