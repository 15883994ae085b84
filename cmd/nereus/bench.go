package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/client"
)

// Bench bounds.
const (
	benchLatencySamplesMax = 10_000_000 // pub-sync latencies kept (8 bytes each)
	benchConsumeIdle       = 5 * time.Second
	benchProgressEvery     = time.Second
)

// benchFlags are the options of `bench`.
type benchFlags struct {
	topic      string
	partitions int
	size       int
	count      int
	duration   time.Duration
	inflight   int
	mode       string
	asJSON     bool
}

// benchResult is the outcome of one phase.
type benchResult struct {
	Phase      string  `json:"phase"`
	Messages   int64   `json:"messages"`
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	MBPerSec   float64 `json:"mb_per_sec"`
	P50Us      float64 `json:"p50_us,omitempty"`
	P99Us      float64 `json:"p99_us,omitempty"`
	P999Us     float64 `json:"p999_us,omitempty"`
}

func newBenchCmd() *cobra.Command {
	var fl benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure publish latency, publish throughput and consume throughput",
		Long: "Phases: pub-sync (one publish in flight; latency percentiles), pub-async (--inflight\n" +
			"window; throughput), consume (group consumer with acks; throughput). Each phase ends\n" +
			"after --count messages or --duration, whichever comes first.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			phases, err := fl.phases()
			if err != nil {
				return err
			}
			return runBench(cmd, fl, phases)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.topic, "topic", "bench", "topic (declared if missing)")
	f.IntVar(&fl.partitions, "partitions", 1, "partitions when declaring the topic")
	f.IntVar(&fl.size, "size", 1024, "value size in bytes")
	f.IntVar(&fl.count, "count", 100_000, "messages per phase")
	f.DurationVar(&fl.duration, "duration", 30*time.Second, "time limit per phase")
	f.IntVar(&fl.inflight, "inflight", client.DefaultMaxInFlight, "publishes in flight in pub-async")
	f.StringVar(&fl.mode, "mode", "all", "pub-sync, pub-async, consume or all")
	f.BoolVar(&fl.asJSON, "json", false, "one JSON object per phase")
	return cmd
}

// phases validates the flags and returns the phases to run.
func (fl benchFlags) phases() ([]string, error) {
	switch {
	case fl.size < 0 || fl.size > 4<<20:
		return nil, fmt.Errorf("--size must be 0-%d bytes", 4<<20)
	case fl.count <= 0:
		return nil, errors.New("--count must be positive")
	case fl.duration <= 0:
		return nil, errors.New("--duration must be positive")
	case fl.inflight <= 0 || fl.inflight > client.MaxInFlightMax:
		return nil, fmt.Errorf("--inflight must be 1-%d", client.MaxInFlightMax)
	case fl.partitions <= 0:
		return nil, errors.New("--partitions must be positive")
	}
	switch fl.mode {
	case "pub-sync", "pub-async", "consume":
		return []string{fl.mode}, nil
	case "all":
		return []string{"pub-sync", "pub-async", "consume"}, nil
	}
	return nil, fmt.Errorf("--mode %q: want pub-sync, pub-async, consume or all", fl.mode)
}

func runBench(cmd *cobra.Command, fl benchFlags, phases []string) error {
	ctx := cmd.Context()
	c, opts, err := dial(ctx, cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	dctx, cancel := withTimeout(ctx, opts.RequestTimeout)
	_, err = c.DeclareTopic(dctx, client.TopicConfig{Name: fl.topic, Partitions: fl.partitions})
	cancel()
	if err != nil {
		return err
	}
	value := make([]byte, fl.size)
	_, _ = rand.Read(value)
	var results []benchResult
	for _, phase := range phases {
		var r benchResult
		var err error
		progress := newBenchProgress(cmd.ErrOrStderr(), phase)
		switch phase {
		case "pub-sync":
			r, err = benchPubSync(ctx, c, fl, value, progress)
		case "pub-async":
			r, err = benchPubAsync(ctx, c, fl, value, progress)
		case "consume":
			r, err = benchConsume(ctx, c, fl, progress)
		}
		progress.stop()
		if err != nil {
			return fmt.Errorf("%s: %w", phase, err)
		}
		results = append(results, r)
	}
	return writeBenchResults(cmd.OutOrStdout(), results, fl.asJSON)
}

// benchProgress prints a line on stderr about once per second.
type benchProgress struct {
	count atomic.Int64
	done  chan struct{}
	wg    sync.WaitGroup
}

func newBenchProgress(w io.Writer, phase string) *benchProgress {
	p := &benchProgress{done: make(chan struct{})}
	start := time.Now()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(benchProgressEvery)
		defer t.Stop()
		last, lastAt := int64(0), start
		for {
			select {
			case <-p.done:
				return
			case now := <-t.C:
				n := p.count.Load()
				rate := float64(n-last) / now.Sub(lastAt).Seconds()
				fmt.Fprintf(w, "%s: %d msgs in %.0fs (%.0f msg/s)\n", phase, n, now.Sub(start).Seconds(), rate)
				last, lastAt = n, now
			}
		}
	}()
	return p
}

func (p *benchProgress) stop() { close(p.done); p.wg.Wait() }

func benchPubSync(ctx context.Context, c *client.Client, fl benchFlags, value []byte, progress *benchProgress) (benchResult, error) {
	p, err := c.NewProducer(client.ProducerOptions{Topic: fl.topic, MaxInFlight: 1})
	if err != nil {
		return benchResult{}, err
	}
	defer p.Close()
	latencies := make([]time.Duration, 0, min(fl.count, benchLatencySamplesMax))
	ctx, cancel := context.WithTimeout(ctx, fl.duration)
	defer cancel()
	start := time.Now()
	n := 0
	for n < fl.count && ctx.Err() == nil {
		t0 := time.Now()
		if _, err := p.Publish(ctx, client.Message{Value: value}); err != nil {
			// A publish gives up at the deadline a moment before ctx's own
			// timer marks ctx done.
			if d, _ := ctx.Deadline(); ctx.Err() != nil || !time.Now().Before(d) {
				break // the phase's time is up
			}
			return benchResult{}, err
		}
		if len(latencies) < benchLatencySamplesMax {
			latencies = append(latencies, time.Since(t0))
		}
		n++
		progress.count.Store(int64(n))
	}
	r := newBenchResult("pub-sync", int64(n), time.Since(start), len(value))
	r.P50Us, r.P99Us, r.P999Us = percentileUs(latencies, 50), percentileUs(latencies, 99), percentileUs(latencies, 99.9)
	return r, nil
}

func benchPubAsync(ctx context.Context, c *client.Client, fl benchFlags, value []byte, progress *benchProgress) (benchResult, error) {
	p, err := c.NewProducer(client.ProducerOptions{Topic: fl.topic, MaxInFlight: fl.inflight})
	if err != nil {
		return benchResult{}, err
	}
	defer p.Close()
	phaseCtx, cancel := context.WithTimeout(ctx, fl.duration)
	defer cancel()
	var acked atomic.Int64
	var firstErr atomic.Pointer[error]
	start := time.Now()
	for i := 0; i < fl.count && phaseCtx.Err() == nil && firstErr.Load() == nil; i++ {
		err := p.PublishAsync(phaseCtx, client.Message{Value: value}, func(_ client.PublishResult, err error) {
			if err != nil {
				firstErr.CompareAndSwap(nil, &err)
				return
			}
			progress.count.Store(acked.Add(1))
		})
		if err != nil {
			if phaseCtx.Err() != nil {
				break
			}
			return benchResult{}, err
		}
	}
	// Wait for what is in flight (bounded by the request timeout budget).
	fctx, fcancel := context.WithTimeout(ctx, client.DefaultDeliveryTimeout)
	defer fcancel()
	if err := p.Flush(fctx); err != nil {
		return benchResult{}, err
	}
	if e := firstErr.Load(); e != nil {
		return benchResult{}, *e
	}
	return newBenchResult("pub-async", acked.Load(), time.Since(start), len(value)), nil
}

func benchConsume(ctx context.Context, c *client.Client, fl benchFlags, progress *benchProgress) (benchResult, error) {
	group := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	sctx, cancel := context.WithTimeout(ctx, client.DefaultRequestTimeout)
	co, err := c.Subscribe(sctx, fl.topic, group, client.ConsumerOptions{})
	cancel()
	if err != nil {
		return benchResult{}, err
	}
	phaseCtx, cancel := context.WithTimeout(ctx, fl.duration)
	defer cancel()
	start := time.Now()
	var n, bytes int64
	var lastAt time.Time
	for n < int64(fl.count) && phaseCtx.Err() == nil {
		mctx, mcancel := context.WithTimeout(phaseCtx, benchConsumeIdle)
		m, err := co.Next(mctx)
		mcancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				break // time is up, or the topic is drained
			}
			co.Close()
			return benchResult{}, err
		}
		if err := m.Ack(); err != nil {
			co.Close()
			return benchResult{}, err
		}
		n++
		bytes += int64(len(m.Value))
		lastAt = time.Now()
		progress.count.Store(n)
	}
	co.Close()
	elapsed := time.Since(start)
	if n > 0 && n < int64(fl.count) && phaseCtx.Err() == nil {
		elapsed = lastAt.Sub(start) // drained: do not count the idle wait
	}
	if st := co.Stats(); st.FailedAcks > 0 {
		return benchResult{}, fmt.Errorf("%d acks failed", st.FailedAcks)
	}
	size := 0
	if n > 0 {
		size = int(bytes / n)
	}
	return newBenchResult("consume", n, elapsed, size), nil
}

func newBenchResult(phase string, n int64, elapsed time.Duration, size int) benchResult {
	r := benchResult{Phase: phase, Messages: n, Seconds: elapsed.Seconds()}
	if s := elapsed.Seconds(); s > 0 {
		r.MsgsPerSec = float64(n) / s
		r.MBPerSec = float64(n) * float64(size) / s / 1e6
	}
	return r
}

// percentileUs returns the p-th percentile (nearest rank) of ds in
// microseconds; ds is sorted in place. Zero for no samples.
func percentileUs(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	if !slices.IsSorted(ds) {
		slices.Sort(ds)
	}
	rank := int(float64(len(ds))*p/100+0.999999999) - 1
	rank = min(max(rank, 0), len(ds)-1)
	return float64(ds[rank].Nanoseconds()) / 1e3
}

func writeBenchResults(w io.Writer, results []benchResult, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PHASE\tMSGS\tSECONDS\tMSG/S\tMB/S\tP50\tP99\tP99.9\t")
	for _, r := range results {
		lat := func(us float64) string {
			if r.Phase != "pub-sync" {
				return "-"
			}
			return time.Duration(us * 1e3).Round(time.Microsecond).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f\t%.2f\t%s\t%s\t%s\t\n",
			r.Phase, r.Messages, r.Seconds, r.MsgsPerSec, r.MBPerSec, lat(r.P50Us), lat(r.P99Us), lat(r.P999Us))
	}
	return tw.Flush()
}
