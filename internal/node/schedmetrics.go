package node

import (
	"sync/atomic"

	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/prometheus/client_golang/prometheus"
)

// schedMetricsEveryMs is how often a runner publishes its view for
// scrapes: its state belongs to its goroutine, so a scrape reads the last
// view published.
const schedMetricsEveryMs = 250

// schedMetricsView is what a runner last published for scrapes: nil
// while its owner is not ACTIVE.
type schedMetricsView struct {
	pending int
	lanes   map[[2]string]int // (gate, readiness) → lanes
}

// schedMetrics is a runner's share of the node's metrics.
type schedMetrics struct {
	view   atomic.Pointer[schedMetricsView]
	viewAt int64 // when the runner last published its view (its goroutine's)
}

// publishMetrics publishes the runner's view for scrapes, at most every
// schedMetricsEveryMs.
func (r *schedRunner) publishMetrics(now int64) {
	if now < r.metrics.viewAt+schedMetricsEveryMs && now >= r.metrics.viewAt {
		return
	}
	r.metrics.viewAt = now
	if r.o.Lifecycle() != sched.Active {
		r.metrics.view.Store(nil)
		return
	}
	v := &schedMetricsView{pending: r.st.Live(), lanes: map[[2]string]int{}}
	for _, t := range r.st.Lanes() {
		l, _ := r.st.Lane(t)
		v.lanes[[2]string{l.Gate.String(), r.o.LaneReadiness(t).String()}]++
	}
	r.metrics.view.Store(v)
}

// countPublished counts a publish's outcome, and an acknowledged one's
// lateness past its deliver_at.
func (r *schedRunner) countPublished(now int64, p sched.Publish, out sched.Outcome) {
	m := r.node.metrics
	switch out {
	case sched.Landed:
		m.schedPublished.WithLabelValues(p.Topic).Inc()
		if e, ok := r.st.Entry(p.ID); ok {
			m.schedLateness.Observe(float64(max(0, now-e.DeliverAtMs)) / 1000)
		}
	case sched.Unprovable:
		m.schedUnknown.WithLabelValues(p.Topic).Inc()
	}
}

// collectSched reports the scheduler shards this node owns.
func (n *Node) collectSched(ch chan<- prometheus.Metric) {
	n.schedMu.Lock()
	runners := n.sched
	n.schedMu.Unlock()
	lanes := map[[2]string]int{}
	for _, r := range runners {
		if r == nil {
			continue
		}
		v := r.metrics.view.Load()
		if v == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(schedPendingDesc, prometheus.GaugeValue, float64(v.pending), itoa(r.shard))
		for k, count := range v.lanes {
			lanes[k] += count
		}
	}
	for k, count := range lanes {
		ch <- prometheus.MustNewConstMetric(schedLanesDesc, prometheus.GaugeValue, float64(count), k[0], k[1])
	}
}
