package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/client"
)

// stdinLineBytesMax bounds one line of `pub -` input.
const stdinLineBytesMax = 8 << 20

// pubFlags are the options of `pub`.
type pubFlags struct {
	key        string
	producerID uint64
	seq        uint64
	headers    []string
	asJSON     bool
	delay      time.Duration
	at         string
}

func newPubCmd() *cobra.Command {
	var fl pubFlags
	cmd := &cobra.Command{
		Use:   "pub TOPIC [MESSAGE | -]",
		Short: "Publish a message, or one message per stdin line with -",
		Long: "Publish MESSAGE to TOPIC, or with - (or no MESSAGE) one message per line of stdin,\n" +
			"in order, through the pipelining producer. Each acknowledged message prints one line.",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runPub(cmd, args, fl)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.key, "key", "", "record key (partition by key hash)")
	f.Uint64Var(&fl.producerID, "producer-id", 0, "idempotent producer id (default random)")
	f.Uint64Var(&fl.seq, "seq", 0, "producer sequence of the (first) message; needs --producer-id")
	f.StringArrayVar(&fl.headers, "header", nil, "header k=v (repeatable)")
	f.BoolVar(&fl.asJSON, "json", false, "print one JSON object per acknowledged message")
	f.DurationVar(&fl.delay, "delay", 0, "schedule MESSAGE for publication this long from now (scheduled delivery)")
	f.StringVar(&fl.at, "at", "", "schedule MESSAGE for publication at this time (RFC 3339, e.g. 2026-12-24T18:00:00Z)")
	return cmd
}

// deliverAt is when --delay or --at schedule the message; ok is false
// when neither is set (publish at once).
func (fl pubFlags) deliverAt(now time.Time) (at time.Time, ok bool, err error) {
	switch {
	case fl.delay != 0 && fl.at != "":
		return time.Time{}, false, errors.New("--delay and --at exclude each other")
	case fl.delay < 0:
		return time.Time{}, false, fmt.Errorf("--delay %v: must not be negative", fl.delay)
	case fl.delay > 0:
		return now.Add(fl.delay), true, nil
	case fl.at != "":
		t, err := time.Parse(time.RFC3339, fl.at)
		if err != nil {
			return time.Time{}, false, fmt.Errorf("--at %q: want RFC 3339, e.g. 2026-12-24T18:00:00Z", fl.at)
		}
		return t, true, nil
	}
	return time.Time{}, false, nil
}

// scheduledJSON is the --json form of a scheduled message.
type scheduledJSON struct {
	Shard     uint32    `json:"shard"`
	ID        uint64    `json:"id"`
	DeliverAt time.Time `json:"deliver_at"`
	Duplicate bool      `json:"duplicate"`
}

// runSchedule schedules one message instead of publishing it.
func runSchedule(cmd *cobra.Command, args []string, fl pubFlags, key []byte, headers []client.Header, at time.Time) error {
	if len(args) != 2 || args[1] == "-" {
		return errors.New("--delay and --at schedule one MESSAGE (not stdin lines)")
	}
	if fl.producerID != 0 || fl.seq != 0 {
		return errors.New("--producer-id and --seq do not apply to a scheduled message (each schedule is idempotent by itself)")
	}
	c, _, err := dial(cmd.Context(), cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.Schedule(cmd.Context(), args[0], client.Message{Key: key, Value: []byte(args[1]), Headers: headers}, at)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if fl.asJSON {
		b, _ := json.Marshal(scheduledJSON{Shard: s.Shard, ID: s.ID, DeliverAt: s.DeliverAt.UTC(), Duplicate: s.Duplicate})
		fmt.Fprintln(out, string(b))
		return nil
	}
	fmt.Fprintf(out, "scheduled shard=%d id=%d deliver_at=%s\n", s.Shard, s.ID, s.DeliverAt.UTC().Format(time.RFC3339Nano))
	return nil
}

// producerOptions validates the identity flags of `pub`.
func (fl pubFlags) producerOptions(topic string) (client.ProducerOptions, error) {
	if fl.seq != 0 && fl.producerID == 0 {
		return client.ProducerOptions{}, errors.New("--seq needs --producer-id")
	}
	return client.ProducerOptions{Topic: topic, ProducerID: fl.producerID, FirstSeq: fl.seq}, nil
}

// parseHeaders turns k=v items into headers.
func parseHeaders(items []string) ([]client.Header, error) {
	var hs []client.Header
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--header %q: want key=value", it)
		}
		hs = append(hs, client.Header{Key: k, Value: []byte(v)})
	}
	return hs, nil
}

// pubResultJSON is the --json form of one acknowledgement.
type pubResultJSON struct {
	Partition int    `json:"partition"`
	Seq       uint64 `json:"seq"`
	Epoch     uint64 `json:"epoch"`
	Duplicate bool   `json:"duplicate"`
}

// formatPubResult renders one acknowledgement as a line (without newline).
func formatPubResult(r client.PublishResult, asJSON bool) string {
	if asJSON {
		b, _ := json.Marshal(pubResultJSON{Partition: r.Partition, Seq: r.Seq, Epoch: r.Epoch, Duplicate: r.Duplicate})
		return string(b)
	}
	s := fmt.Sprintf("published partition=%d seq=%d epoch=%d producer_seq=%d", r.Partition, r.Seq, r.Epoch, r.ProducerSeq)
	if r.Duplicate {
		s += " (duplicate)"
	}
	return s
}

func runPub(cmd *cobra.Command, args []string, fl pubFlags) error {
	topic := args[0]
	popts, err := fl.producerOptions(topic)
	if err != nil {
		return err
	}
	headers, err := parseHeaders(fl.headers)
	if err != nil {
		return err
	}
	var key []byte
	if fl.key != "" {
		key = []byte(fl.key)
	}
	if at, ok, err := fl.deliverAt(time.Now()); err != nil {
		return err
	} else if ok {
		return runSchedule(cmd, args, fl, key, headers, at)
	}
	c, opts, err := dial(cmd.Context(), cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	popts.DeliveryTimeout = opts.RequestTimeout // --timeout bounds a message's retries too
	p, err := c.NewProducer(popts)
	if err != nil {
		return err
	}
	defer p.Close()
	out := cmd.OutOrStdout()

	if len(args) == 2 && args[1] != "-" {
		ctx, cancel := withTimeout(cmd.Context(), popts.DeliveryTimeout)
		defer cancel()
		r, err := p.Publish(ctx, client.Message{Key: key, Value: []byte(args[1]), Headers: headers})
		if err != nil {
			return err
		}
		fmt.Fprintln(out, formatPubResult(r, fl.asJSON))
		return nil
	}
	return publishLines(cmd.Context(), p, cmd.InOrStdin(), out, key, headers, fl.asJSON)
}

// publishLines publishes each line of in, pipelined, and prints the
// acknowledgements in input order. It stops at the first failure.
func publishLines(ctx context.Context, p *client.Producer, in io.Reader, out io.Writer, key []byte, headers []client.Header, asJSON bool) error {
	pr := &orderedPrinter{out: out, asJSON: asJSON, pending: map[int]client.PublishResult{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), stdinLineBytesMax)
	n := 0
	for sc.Scan() {
		if err := pr.failure(); err != nil {
			break
		}
		value := []byte(strings.TrimSuffix(sc.Text(), "\r"))
		idx := n
		n++
		err := p.PublishAsync(ctx, client.Message{Key: key, Value: value, Headers: headers}, func(r client.PublishResult, err error) {
			pr.complete(idx, r, err)
		})
		if err != nil {
			pr.complete(idx, client.PublishResult{}, err)
			break
		}
	}
	scanErr := sc.Err()
	if err := p.Flush(ctx); err != nil {
		return err
	}
	if err := pr.failure(); err != nil {
		return err
	}
	if scanErr != nil {
		return fmt.Errorf("reading stdin: %w", scanErr)
	}
	return nil
}

// orderedPrinter prints acknowledgements in input order although they
// complete in any order. pending holds at most the producer's in-flight
// window.
type orderedPrinter struct {
	out    io.Writer
	asJSON bool

	mu      sync.Mutex
	next    int
	pending map[int]client.PublishResult
	err     error
}

func (o *orderedPrinter) complete(idx int, r client.PublishResult, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		if o.err == nil {
			o.err = fmt.Errorf("line %d: %w", idx+1, err)
		}
		return
	}
	o.pending[idx] = r
	for {
		r, ok := o.pending[o.next]
		if !ok {
			return
		}
		delete(o.pending, o.next)
		o.next++
		fmt.Fprintln(o.out, formatPubResult(r, o.asJSON))
	}
}

func (o *orderedPrinter) failure() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}
