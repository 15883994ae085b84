package sim

import (
	"path"

	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/wire"
)

// The topic churn of a cluster run (ClusterOptions.TopicChurn): a client
// declares a topic of its own (churnTopic: two partitions, a replica on
// every node), publishes into it, deletes it and declares it again, over
// and over, through whichever node it reaches (a delete goes to the
// metadata leader: NOT_LEADER moves it on), under every fault of the run.
// Checked after every event, on every node that is up:
//
//   - DeletedNeverResurrected: a node runs the topic only at the
//     incarnation its applied metadata says is current, which is above
//     the last one it says was deleted;
//
// and at the end, after the final power loss and restart:
//
//   - DeletedDataRemoved: no node keeps a directory of an incarnation its
//     metadata says is deleted.
const (
	DeletedNeverResurrected = "DeletedNeverResurrected"
	DeletedDataRemoved      = "DeletedDataRemoved"
)

const churnTopic = "tc"

type churnClient struct {
	s      *sim
	rounds int // delete and re-create rounds left
	at     int // the node it talks to
	c      *conn
	// stage: what it waits for on c (its requests' corr is the stage).
	stage     uint64
	deletes   int // TOPIC_DELETE_OKs
	declares  int // DECLARE_OKs
	backoffMs int64
	// sent: the applied metadata's facts when the request of stage was
	// sent (CoordinatorAnswersCurrent).
	sent metaFacts
}

const (
	churnDeclare uint64 = iota + 1
	churnPublish
	churnDelete
)

func (cc *churnClient) name() string { return "churn" }

func (cc *churnClient) connect() {
	cc.c = cc.s.dial(cc, cc.at)
	if cc.c.open {
		cc.c.send(0, &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, ClientName: cc.name()})
		cc.next(churnDeclare)
	}
}

// next sends the request of stage.
func (cc *churnClient) next(stage uint64) {
	if cc.rounds <= 0 {
		return
	}
	cc.stage, cc.sent = stage, cc.s.coord.churnSent()
	switch stage {
	case churnDeclare:
		cc.c.send(stage, &wire.Declare{Topic: wire.TopicConfig{Name: churnTopic, Partitions: 2, Replicas: cc.s.replicas}})
	case churnPublish:
		cc.c.send(stage, &wire.Pub{Topic: churnTopic, Partition: wire.PartitionAuto, Value: []byte("x")})
	case churnDelete:
		cc.c.send(stage, &wire.TopicDelete{TopicRef: wire.TopicRef{Topic: churnTopic}})
	}
}

func (cc *churnClient) onClose(c *conn) {
	if c != cc.c {
		return
	}
	cc.at++ // the next node
	cc.backoffMs = min(max(cc.backoffMs*2, 10), 500)
	cc.s.w.after(cc.s.w.between(1, cc.backoffMs), cc.connect)
}

func (cc *churnClient) onFrame(c *conn, corr uint64, f wire.Frame) {
	if c != cc.c || corr != cc.stage {
		return
	}
	cc.s.w.tracef("churn stage %d: %s", corr, f.Type())
	cc.s.coord.churnAnswered(corr, cc.sent, f)
	switch f := f.(type) {
	case *wire.DeclareOK:
		cc.declares++
		cc.backoffMs = 0
		cc.next(churnPublish)
	case *wire.PubOK:
		cc.next(churnDelete)
	case *wire.TopicDeleteOK:
		cc.deletes++
		cc.rounds--
		cc.s.w.after(cc.s.w.between(0, 200), func() {
			if cc.c == c && c.open {
				cc.next(churnDeclare)
			}
		})
	case *wire.Err:
		switch {
		case corr == churnPublish:
			cc.next(churnDelete) // the publish is not the point: delete anyway
		case corr == churnDelete && f.Code == wire.CodeNotFound:
			cc.next(churnDeclare) // deleted by an earlier try whose answer was lost
		case f.Code == wire.CodeNotLeader || corr == churnDeclare && !f.Code.Retryable():
			c.breakConn("churn: another node") // the metadata leader, or a DECLARE refused here
		default:
			cc.s.w.after(cc.s.w.between(5, 100), func() {
				if cc.c == c && c.open && cc.stage == corr {
					cc.next(corr)
				}
			})
		}
	}
}

// observeChurn checks DeletedNeverResurrected on every node that is up.
func (s *sim) observeChurn() {
	for _, b := range s.nodes {
		if !b.up || b.node == nil {
			continue
		}
		cur, deleted := b.node.TopicIncarnation(churnTopic)
		md := b.node.Metadata([]string{churnTopic})
		switch {
		case cur != 0 && cur <= deleted:
			s.chk.violate(DeletedNeverResurrected, "%s: %s at incarnation %d, deleted up to %d", b.id, churnTopic, cur, deleted)
		case len(md) > 0 && (md[0].Incarnation != cur || md[0].Incarnation <= deleted):
			s.chk.violate(DeletedNeverResurrected, "%s runs %s at incarnation %d; its metadata says current %d, deleted %d",
				b.id, churnTopic, md[0].Incarnation, cur, deleted)
		}
	}
}

// churnFinal checks DeletedDataRemoved on every node, after the final
// restart.
func (s *sim) churnFinal() {
	for _, b := range s.nodes {
		if !b.up || b.node == nil {
			continue
		}
		_, deleted := b.node.TopicIncarnation(churnTopic)
		keys, _ := b.fs.List(path.Join(dataDir, "topics"))
		for _, key := range keys {
			name, inc, ok := meta.ParseTopicKey(key)
			if !ok || name != churnTopic || inc > deleted {
				continue
			}
			if files := filesBelow(b, path.Join(dataDir, "topics", key)); len(files) > 0 {
				s.chk.violate(DeletedDataRemoved, "%s keeps %d file(s) of %s incarnation %d (deleted up to %d): %v", b.id, len(files), churnTopic, inc, deleted, files[0])
			}
		}
	}
	s.w.tracef("churn: %d declares, %d deletes", s.churn.declares, s.churn.deletes)
}

// filesBelow lists the files below dir on b's disk.
func filesBelow(b *broker, dir string) []string {
	names, err := b.fs.List(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, name := range names {
		child := path.Join(dir, name)
		if _, err := b.fs.List(child); err == nil {
			out = append(out, filesBelow(b, child)...)
		} else {
			out = append(out, child)
		}
	}
	return out
}
