package client_test

import (
	"context"
	"fmt"
	"log"

	"github.com/nereus-broker/nereus/client"
)

// The README's SDK walk-through; compiled by go test (not run: it needs a
// broker).
func Example() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Servers: []string{"127.0.0.1:4850"}, Token: "s3cret"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.DeclareTopic(ctx, client.TopicConfig{Name: "orders", Partitions: 4}); err != nil {
		log.Fatal(err)
	}

	p, err := c.NewProducer(client.ProducerOptions{Topic: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	res, err := p.Publish(ctx, client.Message{Key: []byte("user-1"), Value: []byte("hello")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Partition, res.Seq, res.Epoch) // durable and visible

	cons, err := c.Subscribe(ctx, "orders", "billing", client.ConsumerOptions{})
	if err != nil {
		log.Fatal(err)
	}
	msg, err := cons.Next(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if err := msg.AckSync(ctx); err != nil {
		log.Fatal(err)
	}
}
