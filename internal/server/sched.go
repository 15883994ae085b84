package server

import (
	"bytes"

	"github.com/nereus-broker/nereus/internal/wire"
)

// schedule hands a SCHEDULE to the node. The frame's bytes alias the read
// buffer, released when handle returns: the node keeps the message until
// it is durable, so it gets a copy.
func (p *Protocol) schedule(corr uint64, f *wire.Schedule) {
	c := *f
	c.Pub.Key, c.Pub.Value = bytes.Clone(f.Pub.Key), bytes.Clone(f.Pub.Value)
	c.Pub.Headers = make([]wire.Header, len(f.Pub.Headers))
	for i, h := range f.Pub.Headers {
		c.Pub.Headers[i] = wire.Header{Key: h.Key, Value: bytes.Clone(h.Value)}
	}
	p.srv.node.Schedule(&c, func(ok wire.ScheduleOK, err *wire.Error) {
		if err != nil {
			p.sendErr(corr, err)
			return
		}
		p.send(corr, &ok)
	})
}

// schedAdmin answers a scheduler administration request.
func (p *Protocol) schedAdmin(corr uint64, f *wire.SchedAdmin) {
	p.srv.node.SchedAdmin(f, func(ok *wire.SchedAdminOK, err *wire.Error) {
		if err != nil {
			p.sendErr(corr, err)
			return
		}
		p.send(corr, ok)
	})
}

// schedListPage answers one page of a shard's live schedules.
func (p *Protocol) schedListPage(corr uint64, f *wire.SchedListPage) {
	p.srv.node.SchedListPage(f, func(ok *wire.SchedListPageOK, err *wire.Error) {
		if err != nil {
			p.sendErr(corr, err)
			return
		}
		p.send(corr, ok)
	})
}
