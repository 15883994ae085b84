package sim

import "github.com/nereus-broker/nereus/internal/wire"

// Retention updates (ClusterRetention.Updates, `--retention-updates N`;
// a single node too, where the repair's restoreRetention interleaves):
// at random moments of the fault phase the operator changes the topic's
// retention with a topic update — its size per partition to one of
// retentionSizes (0: unlimited), and in a run with an age its age to one
// of the run's (0: none) — asked at every node that is up every
// retentionUpdateTryMs until one (the metadata leader) answers; the
// clients declare the topic with the new settings from then on (one that
// declares the old ones at a node that applied the update gets
// TOPIC_CONFLICT and connects again). Shrinking retention makes
// compaction pass producers' records (dedup carries), the group's acks
// (checkpoints) and lagging followers (reservations) in a step, as a
// retention fixed at that size does over time; growing or lifting it
// keeps what is there. Every invariant holds across the changes, and at
// the end every node holds the last update's settings (SettingsKept).

const (
	retentionUpdateTryMs    = 50
	retentionUpdateGapMinMs = 200
	retentionUpdateGapMaxMs = 1_000
)

// retentionSizes are the sizes an update picks from: none, below, at and
// above RetentionPreset's 4 KiB (1 KiB segments).
var retentionSizes = []int64{0, 2048, 4096, 8192, 16384}

type retentionUpdater struct {
	s    *sim
	left int // updates still to start
	// want is the update being asked (nil: none); answered counts those
	// a node answered.
	want     *wire.TopicUpdate
	answered int
}

func newRetentionUpdater(s *sim, updates int) *retentionUpdater {
	u := &retentionUpdater{s: s, left: updates}
	s.w.after(s.w.between(retentionUpdateGapMinMs, retentionUpdateGapMaxMs), u.start)
	return u
}

// start picks the next settings and asks for them; none once healed.
func (u *retentionUpdater) start() {
	s := u.s
	if s.healed || u.left == 0 {
		return
	}
	u.left--
	w := &wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: simTopic}, Set: wire.SetRetentionMs | wire.SetRetentionBytes,
		RetentionBytes: retentionSizes[s.w.rng.IntN(len(retentionSizes))]}
	if age := s.retention.AgeMs; age > 0 {
		w.RetentionMs = []int64{0, age / 2, age, 2 * age}[s.w.rng.IntN(4)]
	}
	u.want = w
	s.w.tracef("retention update: %d ms, %d bytes asked", w.RetentionMs, w.RetentionBytes)
	u.try()
}

// try asks every node that is up for the update wanted, again every
// retentionUpdateTryMs until one answered it (after the heal too).
func (u *retentionUpdater) try() {
	s, w := u.s, u.want
	if w == nil {
		return
	}
	for _, b := range s.nodes {
		if b.up {
			b.node.UpdateTopic(*w, func(cfg wire.TopicConfig, _ uint64, err error) {
				if err != nil || u.want != w {
					return
				}
				if cfg.RetentionMs != w.RetentionMs || cfg.RetentionBytes != w.RetentionBytes {
					s.chk.violate(SettingsKept, "%s answered the retention update %d ms, %d bytes with %d ms, %d bytes",
						b.id, w.RetentionMs, w.RetentionBytes, cfg.RetentionMs, cfg.RetentionBytes)
					return
				}
				u.want = nil
				u.answered++
				s.retentionMs, s.retentionBytes = w.RetentionMs, w.RetentionBytes
				s.w.tracef("retention update: %d ms, %d bytes answered by %s", w.RetentionMs, w.RetentionBytes, b.id)
				s.w.after(s.w.between(retentionUpdateGapMinMs, retentionUpdateGapMaxMs), u.start)
			})
		}
	}
	s.w.after(retentionUpdateTryMs, u.try)
}

// final waits, after the final power loss (a single node: its last
// restart), for the update in flight to be answered and for every node to
// hold the last answered settings.
func (u *retentionUpdater) final(deadline int64) {
	s := u.s
	for s.chk.violation == nil {
		if u.want == nil && u.everyNodeHolds() {
			return
		}
		if s.w.nowMs > deadline || !s.step() {
			s.chk.violate(SettingsKept, "not every node holds the topic's last retention (%d ms, %d bytes; an update in flight: %v)",
				s.retentionMs, s.retentionBytes, u.want != nil)
			return
		}
	}
}

// mayHold reports whether c has the settings of the update in flight
// (false without an updater).
func (u *retentionUpdater) mayHold(c wire.TopicConfig) bool {
	return u != nil && u.want != nil && c.RetentionMs == u.want.RetentionMs && c.RetentionBytes == u.want.RetentionBytes
}

func (u *retentionUpdater) everyNodeHolds() bool {
	for _, b := range u.s.nodes {
		if !b.up {
			return false
		}
		md := b.node.Metadata([]string{simTopic})
		if len(md) != 1 || !u.s.retentionKept(md[0].Config) {
			return false
		}
	}
	return true
}
