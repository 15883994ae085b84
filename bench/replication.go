package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metricsSource is a system whose broker processes serve Prometheus
// metrics: around each case the harness reads how long replication and the
// replicas' fsyncs took (nereus_replication_seconds and
// nereus_fsync_seconds{kind="replica"}), so every r3 row says how much of
// a publish's time is the disk.
type metricsSource interface {
	// metricsAddrs returns the HTTP addresses of the broker's processes.
	metricsAddrs() []string
}

// Histograms the harness reads, and the label that selects the replicas'
// fsyncs among the fsync histogram's kinds.
const (
	metricReplication = "nereus_replication_seconds"
	metricFsync       = "nereus_fsync_seconds"
	fsyncKindReplica  = "replica"
)

// histogram is a Prometheus histogram's cumulative bucket counts by upper
// bound, ascending, +Inf last, and the sum of its observations.
type histogram struct {
	bounds []float64 // seconds
	counts []float64
	sum    float64 // seconds
}

// parseHistogram reads histogram name from a Prometheus text exposition;
// with kind set, only its series labelled kind=KIND. Several matching
// series (one per process) are added up.
func parseHistogram(r io.Reader, name, kind string) (histogram, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return histogram{}, err
	}
	byBound := map[float64]float64{}
	var sum float64
	for _, m := range families[name].GetMetric() {
		if kind != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
			return l.GetName() == "kind" && l.GetValue() == kind
		}) {
			continue
		}
		for _, b := range m.GetHistogram().GetBucket() { // the exposition's +Inf bucket included
			byBound[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
		sum += m.GetHistogram().GetSampleSum()
	}
	out := histogram{sum: sum}
	for b := range byBound {
		out.bounds = append(out.bounds, b)
	}
	slices.Sort(out.bounds)
	for _, b := range out.bounds {
		out.counts = append(out.counts, byBound[b])
	}
	return out, nil
}

// add returns h plus o (o's buckets must be h's, or h empty).
func (h histogram) add(o histogram) histogram {
	if len(h.bounds) == 0 {
		return histogram{bounds: slices.Clone(o.bounds), counts: slices.Clone(o.counts), sum: h.sum + o.sum}
	}
	out := histogram{bounds: h.bounds, counts: slices.Clone(h.counts), sum: h.sum + o.sum}
	for i := range out.counts {
		if i < len(o.counts) {
			out.counts[i] += o.counts[i]
		}
	}
	return out
}

// since returns what was observed from before to h (same buckets).
func (h histogram) since(before histogram) histogram {
	out := histogram{bounds: h.bounds, counts: slices.Clone(h.counts), sum: h.sum - before.sum}
	for i := range out.counts {
		if i < len(before.counts) && before.bounds[i] == h.bounds[i] {
			out.counts[i] -= before.counts[i]
		}
	}
	return out
}

// count is the number of observations.
func (h histogram) count() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// mean is the mean observation in seconds; NaN when empty.
func (h histogram) mean() float64 {
	if h.count() == 0 {
		return math.NaN()
	}
	return h.sum / h.count()
}

// quantile estimates the q-quantile (0 < q < 1) in seconds, interpolating
// linearly inside its bucket (the lowest from 0); NaN when empty, the
// largest finite bound when it falls in the +Inf bucket.
func (h histogram) quantile(q float64) float64 {
	n := h.count()
	if n <= 0 {
		return math.NaN()
	}
	target := q * n
	lower, below := 0.0, 0.0
	for i, bound := range h.bounds {
		c := h.counts[i]
		if c >= target {
			if math.IsInf(bound, 1) {
				return lower
			}
			if c == below {
				return bound
			}
			return lower + (bound-lower)*(target-below)/(c-below)
		}
		lower, below = bound, c
	}
	return lower
}

// replicationSnapshot is the two histograms summed over a system's
// processes.
type replicationSnapshot struct{ replication, fsync histogram }

func takeReplicationSnapshot(ctx context.Context, addrs []string) (replicationSnapshot, error) {
	var s replicationSnapshot
	for _, addr := range addrs {
		repl, fsync, err := scrapeReplication(ctx, addr)
		if err != nil {
			return s, err
		}
		s.replication, s.fsync = s.replication.add(repl), s.fsync.add(fsync)
	}
	return s, nil
}

// scrapeReplication reads one process's replication and replica-fsync
// histograms.
func scrapeReplication(ctx context.Context, addr string) (repl, fsync histogram, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return repl, fsync, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return repl, fsync, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return repl, fsync, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return repl, fsync, err
	}
	if repl, err = parseHistogram(bytes.NewReader(body), metricReplication, ""); err != nil {
		return repl, fsync, err
	}
	fsync, err = parseHistogram(bytes.NewReader(body), metricFsync, fsyncKindReplica)
	return repl, fsync, err
}

// replicationUsage is what a case's publishes waited for replication: the
// p50, p99 and mean of each histogram over the case, and the replicas'
// fsyncs.
type replicationUsage struct {
	ReplicationP50, FsyncP50   time.Duration
	ReplicationP99, FsyncP99   time.Duration
	ReplicationMean, FsyncMean time.Duration
	Fsyncs                     float64 // over every replica
}

// measureReplication starts reading sys's replication histograms, and
// returns the function that ends the measurement (its result nil where
// sys serves none, it could not be read, or nothing was replicated).
func measureReplication(ctx context.Context, sys system) func() *replicationUsage {
	ms, ok := sys.(metricsSource)
	if !ok || len(ms.metricsAddrs()) == 0 {
		return func() *replicationUsage { return nil }
	}
	addrs := ms.metricsAddrs()
	before, err := takeReplicationSnapshot(ctx, addrs)
	return func() *replicationUsage {
		if err != nil {
			return nil
		}
		after, err := takeReplicationSnapshot(ctx, addrs)
		if err != nil {
			return nil
		}
		repl, fsync := after.replication.since(before.replication), after.fsync.since(before.fsync)
		if repl.count() == 0 || fsync.count() == 0 {
			return nil
		}
		seconds := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
		return &replicationUsage{ReplicationP50: seconds(repl.quantile(0.5)), FsyncP50: seconds(fsync.quantile(0.5)),
			ReplicationP99: seconds(repl.quantile(0.99)), FsyncP99: seconds(fsync.quantile(0.99)),
			ReplicationMean: seconds(repl.mean()), FsyncMean: seconds(fsync.mean()), Fsyncs: fsync.count()}
	}
}
