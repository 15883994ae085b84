package sim

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/wire"
)

// pipeliner is a client that sends DECLARE and a PUB to the new topic
// back to back, without waiting, and records the answers.
type pipeliner struct {
	answers []string
}

func (p *pipeliner) name() string { return "pipeliner" }

func (p *pipeliner) onFrame(c *conn, corr uint64, f wire.Frame) {
	switch f := f.(type) {
	case *wire.HelloOK:
	case *wire.Err:
		p.answers = append(p.answers, fmt.Sprintf("%d:ERR %s %s", corr, f.Code, f.Message))
	default:
		p.answers = append(p.answers, fmt.Sprintf("%d:%s", corr, f.Type()))
	}
}

func (p *pipeliner) onClose(*conn) {}

// TestPipelinedDeclareThenPublishAtNodeLevel: a client that pipelines a
// DECLARE of a new topic and a PUB to it, on any node of the cluster, gets
// DECLARE_OK and then PUB_OK — the PUB waits for the DECLARE on its
// connection, as on a production session (a simulated node answers a
// DECLARE only after the metadata log commits it, so without the wait the
// PUB would find no topic).
func TestPipelinedDeclareThenPublishAtNodeLevel(t *testing.T) {
	s := newClusterSim(ClusterOptions{Seed: 1, MessagesPerProducer: 50})
	clients := make([]*pipeliner, len(s.nodes))
	s.w.after(300, func() {
		for i := range s.nodes {
			cl := &pipeliner{}
			clients[i] = cl
			c := s.nodes[i].dial(cl, false)
			name := fmt.Sprintf("piped%d", i)
			c.send(0, &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, ClientName: cl.name()})
			c.send(1, &wire.Declare{Topic: wire.TopicConfig{Name: name, Partitions: 1, Replicas: 3}})
			c.send(2, &wire.Pub{Topic: name, Partition: 0, ProducerID: uint64(77 + i), ProducerSeq: 1, Value: []byte("v")})
		}
	})
	if r := s.runPhases(); r.Violation != nil {
		t.Fatalf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
	}
	for i, cl := range clients {
		if cl == nil || len(cl.answers) < 2 || cl.answers[0] != "1:DECLARE_OK" {
			t.Fatalf("n%d: answers %v; want DECLARE_OK first", i+1, cl.answers)
		}
		// The PUB found its topic: PUB_OK where the node leads the new
		// partition, else NOT_LEADER naming the leader — never NOT_FOUND.
		if got := cl.answers[1]; got != "2:PUB_OK" && !strings.HasPrefix(got, "2:ERR NOT_LEADER") {
			t.Fatalf("n%d: the pipelined PUB got %q; want PUB_OK or NOT_LEADER", i+1, got)
		}
		t.Logf("n%d: %v", i+1, cl.answers)
	}
}

// TestTooManyFramesBehindADeclareCloseTheConnection: the frames a
// connection pipelines behind a DECLARE in progress are bounded. The node
// is cut off from its peers so the DECLARE cannot finish; of 1,025 PINGs
// behind it the first 1,024 wait (none is answered) and the next closes
// the connection (its BAD_FRAME answer is lost with it in the simulator).
func TestTooManyFramesBehindADeclareCloseTheConnection(t *testing.T) {
	s := newClusterSim(ClusterOptions{Seed: 1, MessagesPerProducer: 50})
	cl := &pipeliner{}
	var c *conn
	openAtHeal := true
	s.w.after(300, func() {
		s.net.setCut(2, true, true)
		c = s.nodes[1].dial(cl, false)
		c.send(0, &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, ClientName: cl.name()})
		c.send(1, &wire.Declare{Topic: wire.TopicConfig{Name: "flood", Partitions: 1, Replicas: 3}})
		for i := range 1025 {
			c.send(uint64(2+i), &wire.Ping{})
		}
		s.w.after(500, func() {
			openAtHeal = c.open // the DECLARE is still waiting for the metadata log
			s.net.setCut(2, false, false)
		})
	})
	if r := s.runPhases(); r.Violation != nil {
		t.Fatalf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
	}
	if c == nil || openAtHeal {
		t.Fatal("the connection stayed open with 1,025 frames behind a DECLARE")
	}
	if len(cl.answers) != 0 {
		t.Fatalf("%d frames were answered (first %q); want none: all waited behind the DECLARE", len(cl.answers), cl.answers[0])
	}
}

// TestAHeldFrameThatBreaksTheProtocolClosesTheConnection: a frame held
// behind a DECLARE that turns out to be a protocol error (a second HELLO)
// is answered BAD_FRAME when its turn comes; nothing after it is handled,
// and the connection closes at its next frame.
func TestAHeldFrameThatBreaksTheProtocolClosesTheConnection(t *testing.T) {
	s := newClusterSim(ClusterOptions{Seed: 1, MessagesPerProducer: 200})
	cl := &pipeliner{}
	var c *conn
	openAfter := true
	s.w.after(300, func() {
		c = s.nodes[1].dial(cl, false)
		hello := &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, ClientName: cl.name()}
		c.send(0, hello)
		c.send(1, &wire.Declare{Topic: wire.TopicConfig{Name: "broken", Partitions: 1, Replicas: 3}})
		c.send(2, hello)
		c.send(3, &wire.Ping{})
		s.w.after(400, func() { c.send(4, &wire.Ping{}) })
		s.w.after(500, func() { openAfter = c.open })
	})
	if r := s.runPhases(); r.Violation != nil {
		t.Fatalf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
	}
	want := []string{"1:DECLARE_OK", "2:ERR BAD_FRAME HELLO after the handshake"}
	if !slices.Equal(cl.answers, want) {
		t.Fatalf("answers %q; want %q (nothing after the broken frame)", cl.answers, want)
	}
	if openAfter {
		t.Fatal("the connection stayed open after a held frame broke the protocol")
	}
}
