package env

import "github.com/nereus-broker/nereus/internal/wire"

// PeerNetwork is the network between the members of a cluster, as one
// node joins it. Production's is authenticated TCP (internal/peer, which
// internal/node wires up from its ClusterConfig when Env.Peers is nil); a
// simulator's carries frames as its own events.
type PeerNetwork interface {
	// Join attaches member e.ID and starts delivering the frames other
	// members send it to e.Handler.
	Join(e PeerEndpoint) (PeerLink, error)
}

// PeerEndpoint is one member's place on the peer network.
type PeerEndpoint struct {
	ID uint32
	// Addrs is every member's peer address, this one's included.
	Addrs map[uint32]string
	// ClientAddr is where this member serves clients; the network tells
	// the others (PeerLink.ClientAddr), so that they can point clients at
	// a leader.
	ClientAddr string
	// Handler receives every frame another member sent (Replicate,
	// PeerDeclare, PeerDeclareOK, PeerPublish, PeerPublishOK). from is the
	// authenticated sender: ids inside the frame are not to be trusted.
	// It must not block long (production runs it on a connection's reader
	// goroutine).
	Handler func(from uint32, f wire.Frame)
}

// PeerLink is a member's attachment to the peer network.
type PeerLink interface {
	// Send queues f for member to and never blocks; false when it was
	// dropped (unknown member, closed link, full queue). Delivery is not
	// guaranteed either way: the protocols above resend.
	Send(to uint32, f wire.Frame) bool
	// ClientAddr is the client address member id announced ("" = not
	// heard from yet).
	ClientAddr(id uint32) string
	// Close detaches the member; no Handler call starts after it returns.
	Close() error
}
