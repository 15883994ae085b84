package main

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
	"github.com/nereus-broker/nereus/internal/wire"
)

func TestParseHeaders(t *testing.T) {
	hs, err := parseHeaders([]string{"a=1", "b=x=y", "c="})
	if err != nil || len(hs) != 3 || hs[1].Key != "b" || string(hs[1].Value) != "x=y" || string(hs[2].Value) != "" {
		t.Fatalf("parseHeaders = %+v, %v", hs, err)
	}
	for _, bad := range []string{"novalue", "=v"} {
		if _, err := parseHeaders([]string{bad}); err == nil {
			t.Errorf("parseHeaders(%q) accepted", bad)
		}
	}
}

func TestPubIdentityFlags(t *testing.T) {
	if _, err := (pubFlags{seq: 5}).producerOptions("t"); err == nil {
		t.Fatal("--seq without --producer-id accepted")
	}
	o, err := (pubFlags{producerID: 7, seq: 5}).producerOptions("t")
	if err != nil || o.ProducerID != 7 || o.FirstSeq != 5 || o.Topic != "t" {
		t.Fatalf("options = %+v, %v", o, err)
	}
}

func TestFormatPubResult(t *testing.T) {
	r := client.PublishResult{Partition: 2, Seq: 10, Epoch: 3, Duplicate: true, ProducerSeq: 4}
	if got, want := formatPubResult(r, true), `{"partition":2,"seq":10,"epoch":3,"duplicate":true}`; got != want {
		t.Fatalf("json = %s, want %s", got, want)
	}
	if got, want := formatPubResult(r, false), "published partition=2 seq=10 epoch=3 producer_seq=4 (duplicate)"; got != want {
		t.Fatalf("text = %q, want %q", got, want)
	}
}

func TestOrderedPrinterPrintsInInputOrder(t *testing.T) {
	var out bytes.Buffer
	pr := &orderedPrinter{out: &out, asJSON: true, pending: map[int]client.PublishResult{}}
	pr.complete(2, client.PublishResult{Seq: 3}, nil)
	pr.complete(0, client.PublishResult{Seq: 1}, nil)
	if got := out.String(); got != "{\"partition\":0,\"seq\":1,\"epoch\":0,\"duplicate\":false}\n" {
		t.Fatalf("after 0: %q", got)
	}
	pr.complete(1, client.PublishResult{Seq: 2}, nil)
	if n := bytes.Count(out.Bytes(), []byte("\n")); n != 3 {
		t.Fatalf("%d lines after all: %q", n, out.String())
	}
	boom := errors.New("boom")
	pr.complete(3, client.PublishResult{}, boom)
	if err := pr.failure(); !errors.Is(err, boom) {
		t.Fatalf("failure = %v", err)
	}
}

// quorumLostBroker is a fake broker on loopback: it knows one topic "t"
// and answers every PUB with QUORUM_LOST, which the producer retries.
func quorumLostBroker(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	addr := lis.Addr().String()
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				r := bufio.NewReader(conn)
				for {
					corr, f, err := wire.ReadFrame(r, wire.DefaultFrameBytesMax)
					if err != nil {
						return
					}
					var reply wire.Frame
					switch f.(type) {
					case *wire.Hello:
						reply = &wire.HelloOK{Version: 1, NodeID: "fake", FrameBytesMax: wire.DefaultFrameBytesMax}
					case *wire.Metadata:
						reply = &wire.MetadataOK{Topics: []wire.TopicInfo{{
							Config:     wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 1},
							Partitions: []wire.PartitionInfo{{Partition: 0, Epoch: 1, Leader: "fake", LeaderAddr: addr}}}}}
					case *wire.Pub:
						reply = &wire.Err{Code: wire.CodeQuorumLost, Message: "fake: no quorum"}
					default:
						reply = &wire.Pong{}
					}
					if _, err := conn.Write(wire.AppendFrame(nil, corr, reply)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return addr
}

// `pub --timeout 1s` gives up on a message the broker keeps refusing after
// about a second (it used to wait at least the 10 s default).
func TestPubTimeoutBoundsRetries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the CLI")
	}
	addr := quorumLostBroker(t)
	cmd := exec.Command(nereusBinary(t), "pub", "t", "x", "--timeout", "1s", "--server", addr)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)
	if err == nil || !strings.Contains(stderr.String(), "QUORUM_LOST") {
		t.Fatalf("pub against a broker without quorum: %v\n%s", err, stderr.String())
	}
	if elapsed > 5*time.Second {
		t.Fatalf("pub --timeout 1s took %v", elapsed)
	}
}
