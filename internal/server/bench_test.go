package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
	"github.com/nereus-broker/nereus/internal/node"
)

// startBenchBroker runs a node on the real disk (fsync before every ack)
// and a server on loopback, in-process, for hot-path benchmarks.
func startBenchBroker(b *testing.B) string {
	addr, _ := startBenchBrokerNode(b)
	return addr
}

func startBenchBrokerNode(b *testing.B) (string, *node.Node) {
	b.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := node.Open(node.Config{DataDir: b.TempDir(), Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{AllowNoAuth: true, Logger: logger}, n)
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(lis)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
		n.Close()
	})
	return lis.Addr().String(), n
}

// benchClient connects to addr and declares the one-partition topic "bench".
func benchClient(b *testing.B, addr string) *client.Client {
	b.Helper()
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Servers: []string{addr}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	if _, err := c.DeclareTopic(ctx, client.TopicConfig{Name: "bench", Partitions: 1}); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkPublishAsync1KiB is the durable publish hot path end to end:
// SDK → TCP → server → group commit (write + fsync) → PUB_OK, 256 in flight.
func BenchmarkPublishAsync1KiB(b *testing.B) {
	addr, n := startBenchBrokerNode(b)
	ctx := context.Background()
	c := benchClient(b, addr)
	p, err := c.NewProducer(client.ProducerOptions{Topic: "bench", MaxInFlight: 256})
	if err != nil {
		b.Fatal(err)
	}
	publishAsyncTimed(b, ctx, p, make([]byte, 1024))
	if mfs, err := n.Metrics().Registry.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() == "nereus_group_commit_records" {
				h := mf.GetMetric()[0].GetHistogram()
				b.ReportMetric(h.GetSampleSum()/float64(h.GetSampleCount()), "records/fsync")
			}
			if mf.GetName() == "nereus_fsync_seconds" {
				for _, m := range mf.GetMetric() {
					if m.GetLabel()[0].GetValue() == "log" {
						h := m.GetHistogram()
						b.ReportMetric(h.GetSampleSum()/float64(h.GetSampleCount())*1e6, "µs/fsync")
					}
				}
			}
		}
	}
}

// BenchmarkPublishSync1KiB is one durable publish at a time: its ns/op is
// the acknowledgement latency; compare with vfs BenchmarkOSWriteSync.
func BenchmarkPublishSync1KiB(b *testing.B) {
	addr := startBenchBroker(b)
	ctx := context.Background()
	c := benchClient(b, addr)
	p, err := c.NewProducer(client.ProducerOptions{Topic: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := p.Publish(ctx, client.Message{Value: value}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConsumeAck1KiB delivers b.N pre-published 1 KiB records to one
// consumer (credit 500) that acks each; acks are durable in the ledger.
func BenchmarkConsumeAck1KiB(b *testing.B) {
	addr := startBenchBroker(b)
	ctx := context.Background()
	c := benchClient(b, addr)
	p, err := c.NewProducer(client.ProducerOptions{Topic: "bench", MaxInFlight: 512})
	if err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 1024)
	for i := 0; i < b.N; i++ {
		if err := p.PublishAsync(ctx, client.Message{Value: value}, nil); err != nil {
			b.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	cons, err := c.Subscribe(ctx, "bench", "g", client.ConsumerOptions{Credit: 500})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		m, err := cons.Next(ctx)
		if err != nil {
			b.Fatal(err)
		}
		m.Ack()
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	b.StopTimer()
	cons.Close()
}

// startReplicatedBenchBrokers runs three clustered nodes in-process, each
// with a server on loopback, each with a data dir on the real disk: the
// replicated path in one process, where the bench module runs each node
// in a process of its own. It returns the servers' addresses.
func startReplicatedBenchBrokers(b *testing.B) []string {
	b.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := b.TempDir()
	var members []node.Member
	var peers, clients []net.Listener
	for i := 1; i <= 3; i++ {
		pl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		cl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		peers, clients = append(peers, pl), append(clients, cl)
		members = append(members, node.Member{ID: fmt.Sprintf("n%d", i), PeerAddr: pl.Addr().String()})
	}
	var addrs []string
	for i, m := range members {
		n, err := node.Open(node.Config{NodeID: m.ID, DataDir: filepath.Join(dir, m.ID),
			ClientAddr: clients[i].Addr().String(), Logger: logger,
			Cluster: &node.ClusterConfig{Members: members, Secret: []byte("bench-cluster-secret-0123456789"), PeerListener: peers[i]}})
		if err != nil {
			b.Fatal(err)
		}
		s, err := New(Config{AllowNoAuth: true, Logger: logger}, n)
		if err != nil {
			b.Fatal(err)
		}
		go s.Serve(clients[i])
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s.Close(ctx)
			n.Close()
		})
		addrs = append(addrs, clients[i].Addr().String())
	}
	return addrs
}

// BenchmarkPublishAsyncReplicated1KiB is BenchmarkPublishAsync1KiB into a
// partition of three replicas (three nodes in this process): CPU and
// allocations per message of the SDK, the leader and both followers
// together.
func BenchmarkPublishAsyncReplicated1KiB(b *testing.B) {
	addrs := startReplicatedBenchBrokers(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Servers: addrs})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	for {
		_, err := c.DeclareTopic(ctx, client.TopicConfig{Name: "bench", Partitions: 1, Replicas: 3})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			b.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the metadata log elects its first leader
	}
	p, err := c.NewProducer(client.ProducerOptions{Topic: "bench", MaxInFlight: 256})
	if err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 1024)
	for { // until the partition has a leader
		if _, err := p.Publish(ctx, client.Message{Value: value}); err == nil {
			break
		} else if ctx.Err() != nil {
			b.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	publishAsyncTimed(b, ctx, p, value)
}

// publishAsyncTimed is the timed part of the async benchmarks: b.N
// publishes of value through p, as many in flight as p allows, reporting
// msgs/s and this process's CPU per message.
func publishAsyncTimed(b *testing.B, ctx context.Context, p *client.Producer, value []byte) {
	var wg sync.WaitGroup
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpuStart := time.Now(), processCPU(b)
	for i := 0; i < b.N; i++ {
		wg.Add(1)
		if err := p.PublishAsync(ctx, client.Message{Value: value}, func(_ client.PublishResult, err error) {
			if err != nil {
				b.Error(err)
			}
			wg.Done()
		}); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64((processCPU(b)-cpuStart).Microseconds())/float64(b.N), "cpu-µs/msg")
}

// processCPU is the CPU time this process has used so far, user and
// system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
