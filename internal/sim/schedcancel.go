package sim

import (
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Schedule cancels (ClusterOptions.SchedCancels, `--sched-cancels N`,
// with --schedules): at random moments of the fault phase the client
// cancels an acknowledged schedule not seen published yet — due later,
// or due already and perhaps being published — with a SCHED_ADMIN
// cancel naming the shard and id its SCHEDULE_OK gave, asked at every
// node that is up every schedCancelTryMs until one (the shard's owner)
// answers OK or NOT_FOUND.
//
//   - CancelledNeverPublished: a schedule whose cancel was answered OK is
//     never published — not before (a cancel takes only a PENDING
//     schedule, one no intent claimed), not after, not after the final
//     power loss.
//   - A cancel answered NOT_FOUND at its first ask found the schedule
//     firing or fired: it is published as any other (Liveness,
//     ExactlyOnce). One answered NOT_FOUND at a later ask may have been
//     cancelled by an earlier ask whose answer was lost: it is published
//     at most once, and not required.
//
// While a cancel is asked its schedule is not held to ScheduledOnTime
// (it may be cancelled); one found too late is again, from its answer.
const (
	schedCancelTryMs    = 50
	schedCancelGapMinMs = 100
	schedCancelGapMaxMs = 600
)

const CancelledNeverPublished = "CancelledNeverPublished"

// schedOutcome is what a cancel made of its schedule.
type schedOutcome uint8

const (
	cancelAsked     schedOutcome = iota + 1 // asked, not answered yet
	cancelDone                              // answered OK: never published
	cancelTooLate                           // NOT_FOUND at the first ask: published as any other
	cancelUncertain                         // NOT_FOUND at a later ask: published at most once
)

type schedCanceller struct {
	s    *sim
	sc   *schedClient
	left int
	// asking is the schedule whose cancel is being asked (-1: none),
	// tries the asks so far; outcome, by schedule, what its cancel made.
	asking  int
	tries   int
	outcome map[int]schedOutcome
}

func newSchedCanceller(s *sim, sc *schedClient, cancels int) *schedCanceller {
	c := &schedCanceller{s: s, sc: sc, left: cancels, asking: -1, outcome: map[int]schedOutcome{}}
	s.w.after(s.w.between(schedCancelGapMinMs, schedCancelGapMaxMs), c.start)
	return c
}

// start picks an acknowledged schedule not seen published and asks for
// its cancel; none once healed. With none to pick it looks again later.
func (c *schedCanceller) start() {
	s, sc := c.s, c.sc
	if s.healed || c.left == 0 {
		return
	}
	var pick []int
	for i := range sc.ids {
		if _, ok := c.outcome[i]; !ok && sc.unseen[i] {
			pick = append(pick, i)
		}
	}
	if len(pick) == 0 {
		s.w.after(s.w.between(schedCancelGapMinMs, schedCancelGapMaxMs), c.start)
		return
	}
	slices.Sort(pick) // sc.ids is a map: in order, a run replays bit for bit
	i := pick[s.w.rng.IntN(len(pick))]
	c.left--
	c.asking, c.tries, c.outcome[i] = i, 0, cancelAsked
	delete(sc.unseen, i) // not held to ScheduledOnTime while it may be cancelled
	s.w.tracef("sched cancel of %s (%d/%d) asked", schedValue(i), sc.ids[i].shard, sc.ids[i].id)
	c.try()
}

// try asks every node that is up for the cancel, again every
// schedCancelTryMs until one answered OK or NOT_FOUND (after the heal
// too).
func (c *schedCanceller) try() {
	s, i := c.s, c.asking
	if i < 0 {
		return
	}
	c.tries++
	try := c.tries
	at := c.sc.ids[i]
	for _, b := range s.nodes {
		if !b.up {
			continue
		}
		b.node.SchedAdmin(&wire.SchedAdmin{Op: wire.SchedCancel, Shard: at.shard, ID: at.id}, func(_ *wire.SchedAdminOK, err *wire.Error) {
			if c.asking != i {
				return // answered already
			}
			switch {
			case err == nil:
				c.answered(i, cancelDone, b.id)
			case err.Code == wire.CodeNotFound && try == 1:
				c.answered(i, cancelTooLate, b.id)
			case err.Code == wire.CodeNotFound:
				c.answered(i, cancelUncertain, b.id)
			}
		})
	}
	s.w.after(schedCancelTryMs, func() {
		if c.asking == i && c.tries == try {
			c.try()
		}
	})
}

func (c *schedCanceller) answered(i int, o schedOutcome, by string) {
	s, sc := c.s, c.sc
	c.asking, c.outcome[i] = -1, o
	s.w.tracef("sched cancel of %s answered by %s: %v", schedValue(i), by, o)
	if o == cancelTooLate && !sc.seen[schedValue(i)] {
		sc.unseen[i] = true // held to ScheduledOnTime again, from now
	}
	if o == cancelDone && sc.seen[schedValue(i)] {
		s.chk.violate(CancelledNeverPublished, "schedule %s was published, and its cancel answered OK by %s", schedValue(i), by)
		return
	}
	s.w.after(s.w.between(schedCancelGapMinMs, schedCancelGapMaxMs), c.start)
}

// required reports whether schedule i must be published: not one a
// cancel took or may have taken, nor one being cancelled.
func (c *schedCanceller) required(i int) bool {
	if c == nil {
		return true
	}
	o, ok := c.outcome[i]
	return !ok || o == cancelTooLate
}

// cancelled reports whether schedule i's cancel was answered OK.
func (c *schedCanceller) cancelled(i int) bool { return c != nil && c.outcome[i] == cancelDone }

// published checks a schedule seen published for the first time.
func (c *schedCanceller) published(i int, at string) {
	if c.cancelled(i) && c.s.chk.violation == nil {
		c.s.chk.violate(CancelledNeverPublished, "%s: schedule %s published after its cancel was answered OK", at, schedValue(i))
	}
}

// counts returns the cancels by outcome.
func (c *schedCanceller) counts() map[schedOutcome]int {
	n := map[schedOutcome]int{}
	for _, i := range slices.Sorted(maps.Keys(c.outcome)) {
		n[c.outcome[i]]++
	}
	return n
}

func (o schedOutcome) String() string {
	switch o {
	case cancelAsked:
		return "asked"
	case cancelDone:
		return "cancelled"
	case cancelTooLate:
		return "too late"
	case cancelUncertain:
		return "uncertain"
	}
	return "?"
}
