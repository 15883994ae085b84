package main

import (
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
)

func TestFormatSubMessageJSON(t *testing.T) {
	m := &client.Message{Partition: 1, Seq: 9, DeliveryID: 44, DeliveryCount: 2,
		Key: []byte("k"), Value: []byte("héllo"), Timestamp: time.UnixMilli(1234)}
	got, err := formatSubMessage(m, true)
	want := `{"partition":1,"seq":9,"key":"k","value":"héllo","delivery_id":44,"delivery_count":2,"timestamp_ms":1234}`
	if err != nil || got != want {
		t.Fatalf("got  %s\nwant %s (%v)", got, want, err)
	}
	bin := &client.Message{Seq: 1, Value: []byte{0xff, 0x00}}
	got, _ = formatSubMessage(bin, true)
	want = `{"partition":0,"seq":1,"key":"","value_b64":"/wA=","delivery_id":0,"delivery_count":0,"timestamp_ms":0}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	empty := &client.Message{Seq: 2}
	got, _ = formatSubMessage(empty, true)
	if want = `{"partition":0,"seq":2,"key":"","value":"","delivery_id":0,"delivery_count":0,"timestamp_ms":0}`; got != want {
		t.Fatalf("empty value: got %s", got)
	}
}

func TestFormatSubMessageText(t *testing.T) {
	m := &client.Message{Partition: 1, Seq: 9, DeliveryID: 44, DeliveryCount: 1, Key: []byte("k"), Value: []byte("v")}
	got, _ := formatSubMessage(m, false)
	if want := "[1:9] delivery=44 count=1 key=k v"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestSubRequiresGroup(t *testing.T) {
	root := newRootCmd()
	root.SetArgs([]string{"sub", "t", "--server", "127.0.0.1:1"})
	if err := root.Execute(); err == nil {
		t.Fatal("sub without --group accepted")
	}
}
