package main

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// progressEvery is the period of the progress line on stderr.
const progressEvery = time.Second

// progress prints one line about the running case every progressEvery.
// The workload stores its message count in count; phase and setCase may be
// called from the runner goroutine while the printer runs.
type progress struct {
	count atomic.Int64

	mu        sync.Mutex
	caseLabel string
	phaseName string
	phaseAt   time.Time

	out  io.Writer
	stop chan struct{}
	wg   sync.WaitGroup
}

// startProgress starts the printer; call close to stop it.
func startProgress(out io.Writer) *progress {
	p := &progress{out: out, stop: make(chan struct{}), phaseAt: time.Now()}
	p.wg.Add(1)
	go p.print()
	return p
}

// setCase names the case now running, e.g. "[3/18 run 1/1] nereus/r1/consume/1024".
func (p *progress) setCase(label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.caseLabel, p.phaseName, p.phaseAt = label, "setup", time.Now()
	p.count.Store(0)
}

// phase starts a new phase of the running case and resets the count.
func (p *progress) phase(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phaseName, p.phaseAt = name, time.Now()
	p.count.Store(0)
}

func (p *progress) print() {
	defer p.wg.Done()
	ticker := time.NewTicker(progressEvery)
	defer ticker.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-ticker.C:
			p.mu.Lock()
			label, phase, at := p.caseLabel, p.phaseName, p.phaseAt
			p.mu.Unlock()
			if label == "" {
				continue
			}
			n := p.count.Load()
			secs := now.Sub(at).Seconds()
			fmt.Fprintf(p.out, "bench: %s %s: %d msgs in %.1fs (%.0f msg/s)\n", label, phase, n, secs, float64(n)/max(secs, 1e-9))
		}
	}
}

// close stops the printer and waits for it.
func (p *progress) close() {
	close(p.stop)
	p.wg.Wait()
}
