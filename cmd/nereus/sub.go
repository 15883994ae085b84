package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/client"
)

// subFlags are the options of `sub`.
type subFlags struct {
	group   string
	member  string
	shared  bool
	session time.Duration
	count   int
	idle    time.Duration
	asJSON  bool
	noAck   bool
	credit  int
	ackWait time.Duration
}

func newSubCmd() *cobra.Command {
	var fl subFlags
	cmd := &cobra.Command{
		Use:   "sub TOPIC --group G",
		Short: "Consume messages of a topic as a member of a group",
		Long: "Join the group (as --member, default HOSTNAME-PID) and consume the partitions it assigns;\n" +
			"assignment changes are printed on stderr; the member leaves the group at exit.\n" +
			"Print messages and ack each (unless --no-ack). Stops after --count messages, or when\n" +
			"none arrives for --timeout: that is success without --count, failure when --count is\n" +
			"not reached. A partition moves to another member only once the message being printed\n" +
			"is acked; a message whose partition moved before it was printed is left to the new\n" +
			"owner and does not count toward --count.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSub(cmd, args[0], fl)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.group, "group", "", "consumer group (required)")
	f.IntVar(&fl.count, "count", 0, "stop after this many messages (0 = until idle)")
	f.DurationVar(&fl.idle, "timeout", client.DefaultRequestTimeout, "stop when no message arrives for this long")
	f.BoolVar(&fl.asJSON, "json", false, "one JSON object per message")
	f.BoolVar(&fl.noAck, "no-ack", false, "do not ack (messages are redelivered after the ack wait)")
	f.IntVar(&fl.credit, "credit", 0, "max messages outstanding (default 512, or --count if smaller)")
	f.DurationVar(&fl.ackWait, "ack-wait", 0, "redelivery timeout when the group is created (0 = broker default)")
	f.StringVar(&fl.member, "member", "", "the member id it joins the group as (default HOSTNAME-PID); it is assigned partitions, each to one member at a time; assignment changes are printed on stderr")
	f.BoolVar(&fl.shared, "shared", false, "join in shared mode: every member competes for every partition")
	f.DurationVar(&fl.session, "session-timeout", 0, "the coordinator fences the member after this long without a heartbeat (0 = broker default, 10s)")
	_ = cmd.MarkFlagRequired("group")
	return cmd
}

func runSub(cmd *cobra.Command, topic string, fl subFlags) error {
	if fl.count < 0 || fl.idle <= 0 || fl.credit < 0 {
		return errors.New("--count and --credit must not be negative, --timeout must be positive")
	}
	credit := fl.credit
	if credit == 0 {
		credit = client.DefaultCredit
		if fl.count > 0 {
			credit = min(credit, fl.count) // do not hold more than we will take
		}
	}
	c, opts, err := dial(cmd.Context(), cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	sctx, cancel := withTimeout(cmd.Context(), opts.RequestTimeout)
	// --count N grants N credits in all: a message fetched beyond it would
	// be dropped at exit and count toward the group's max deliveries.
	copts := client.ConsumerOptions{Credit: credit, AckWait: fl.ackWait, MessagesMax: fl.count}
	member := fl.member
	if member == "" {
		host, _ := os.Hostname()
		member = fmt.Sprintf("%s-%d", host, os.Getpid()) // one member per process
	}
	errOut := cmd.ErrOrStderr()
	copts.Member, copts.Shared, copts.SessionTimeout = member, fl.shared, fl.session
	copts.OnAssigned = func(ps []int) { fmt.Fprintf(errOut, "assigned %s partitions %v\n", topic, ps) }
	copts.OnRevoked = func(ps []int) { fmt.Fprintf(errOut, "revoked %s partitions %v\n", topic, ps) }
	co, err := c.Subscribe(sctx, topic, fl.group, copts)
	cancel()
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	received := 0
	var runErr error
	// Handle, not Next: a revoke waits while a message is printed and
	// acked, so the ack of a printed message reaches the broker before the
	// partition moves (else its next holder prints it too), and a message
	// of a partition revoked before it was printed is left to the next
	// holder without counting toward --count.
	handle := func(m *client.Message) error {
		received++
		line, err := formatSubMessage(m, fl.asJSON)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, line)
		if fl.noAck {
			return nil
		}
		return m.Ack()
	}
	for fl.count == 0 || received < fl.count {
		ctx, cancel := context.WithTimeout(cmd.Context(), fl.idle)
		err := co.Handle(ctx, handle)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && cmd.Context().Err() == nil {
			if fl.count > 0 {
				runErr = fmt.Errorf("received %d of %d messages: none for %v", received, fl.count, fl.idle)
			}
			break
		}
		if err != nil {
			runErr = err
			break
		}
	}
	co.Close() // waits for the acks taken so far
	if st := co.Stats(); runErr == nil && (st.FailedAcks > 0 || st.StaleAcks > 0) {
		runErr = fmt.Errorf("%d acks failed and %d were stale (those messages will be redelivered)", st.FailedAcks, st.StaleAcks)
	}
	return runErr
}

// subMessageJSON is the --json form of a message. Key and value are strings
// when valid UTF-8; otherwise the *_b64 field holds their base64.
type subMessageJSON struct {
	Partition     int               `json:"partition"`
	Seq           uint64            `json:"seq"`
	Key           *string           `json:"key,omitempty"`
	KeyB64        string            `json:"key_b64,omitempty"`
	Value         *string           `json:"value,omitempty"`
	ValueB64      string            `json:"value_b64,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	DeliveryID    uint64            `json:"delivery_id"`
	DeliveryCount int               `json:"delivery_count"`
	TimestampMs   int64             `json:"timestamp_ms"`
}

// formatSubMessage renders a message as one line (without newline).
func formatSubMessage(m *client.Message, asJSON bool) (string, error) {
	if !asJSON {
		key := ""
		if len(m.Key) > 0 {
			key = " key=" + printable(m.Key)
		}
		return fmt.Sprintf("[%d:%d] delivery=%d count=%d%s %s", m.Partition, m.Seq, m.DeliveryID, m.DeliveryCount, key, printable(m.Value)), nil
	}
	obj := subMessageJSON{
		Partition: m.Partition, Seq: m.Seq,
		DeliveryID: m.DeliveryID, DeliveryCount: m.DeliveryCount,
	}
	if !m.Timestamp.IsZero() {
		obj.TimestampMs = m.Timestamp.UnixMilli()
	}
	obj.Key, obj.KeyB64 = textOrBase64(m.Key) // always present: "" when unkeyed
	obj.Value, obj.ValueB64 = textOrBase64(m.Value)
	if len(m.Headers) > 0 {
		obj.Headers = map[string]string{}
		for _, h := range m.Headers {
			obj.Headers[h.Key] = printable(h.Value)
		}
	}
	b, err := json.Marshal(obj)
	return string(b), err
}

func textOrBase64(b []byte) (*string, string) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, ""
	}
	return nil, base64.StdEncoding.EncodeToString(b)
}

// printable shows b as text when it is UTF-8, else as base64 with a prefix.
func printable(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return "base64:" + base64.StdEncoding.EncodeToString(b)
}
