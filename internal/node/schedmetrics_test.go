package node

import (
	"math"
	"testing"
)

// sample reads one metric of the node's registry whose labels include
// want: a gauge's or counter's value, a histogram's sample count and
// sum; -1 when absent.
func sample(t *testing.T, m *Metrics, name string, want map[string]string) (value float64, count uint64, sum float64) {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, metric := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range metric.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metrics
				}
			}
			switch {
			case metric.GetGauge() != nil:
				return metric.GetGauge().GetValue(), 0, 0
			case metric.GetHistogram() != nil:
				h := metric.GetHistogram()
				return 0, h.GetSampleCount(), h.GetSampleSum()
			}
			return metric.GetCounter().GetValue(), 0, 0
		}
	}
	return -1, 0, 0
}

// TestSchedMetrics: the owner counts what its destination acknowledged,
// how late (deliver_at to acknowledgment, by the node's clock), and
// reports its pending schedules and lanes by gate and readiness.
func TestSchedMetrics(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	now := h.nowMs.Load()
	for _, v := range []string{"a", "b", "c", "d"} {
		h.mustSchedule("t", v, now+100)
	}
	h.mustSchedule("t", "later-1", now+3_600_000)
	h.mustSchedule("t", "later-2", now+3_600_000)
	h.at(now + 300) // 200 ms late
	h.waitValues("t", "a", "b", "c", "d")
	m := h.node.metrics
	eventually(t, "4 scheduled publishes counted", func() bool {
		v, _, _ := sample(t, m, "nereus_sched_published_total", map[string]string{"topic": "t"})
		return v == 4
	})
	if _, n, sum := sample(t, m, "nereus_sched_lateness_seconds", nil); n != 4 || math.Abs(sum-0.8) > 1e-9 {
		t.Fatalf("lateness: %d samples summing %v s, want 4 of 0.2 s", n, sum)
	}
	h.at(now + 600) // the runners publish their views at most every 250 ms
	eventually(t, "2 pending and an OPEN, READY lane", func() bool {
		pending := 0.0
		for shard := range SchedShards {
			if v, _, _ := sample(t, m, "nereus_sched_pending", map[string]string{"shard": itoa(uint32(shard))}); v > 0 {
				pending += v
			}
		}
		lanes, _, _ := sample(t, m, "nereus_sched_lanes", map[string]string{"gate": "OPEN", "readiness": "READY"})
		return pending == 2 && lanes >= 1
	})
	if v, _, _ := sample(t, m, "nereus_sched_unknown_total", map[string]string{"topic": "t"}); v > 0 {
		t.Fatalf("%v publishes recorded UNKNOWN", v)
	}
}
