package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// selfSigned returns a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nereus-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, pool
}

func TestTLSEndToEnd(t *testing.T) {
	cert, pool := selfSigned(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := node.Open(node.Config{DataDir: "/d", Env: env.Env{FS: vfs.NewMem()}, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	s, err := New(Config{Tokens: []string{"tls-token"}, Logger: logger,
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}, n)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addr := lis.Addr().String()

	// A client that does not trust the certificate fails the handshake.
	if _, err := client.Dial(ctx, client.Options{Servers: []string{addr}, Token: "tls-token", DialTimeout: 2 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}}); err == nil {
		t.Fatal("dial succeeded without trusting the server certificate")
	}
	// A plain-TCP client cannot talk to a TLS listener.
	if _, err := client.Dial(ctx, client.Options{Servers: []string{addr}, Token: "tls-token", DialTimeout: 2 * time.Second}); err == nil {
		t.Fatal("plain TCP dial succeeded against a TLS listener")
	}

	c, err := client.Dial(ctx, client.Options{Servers: []string{addr}, Token: "tls-token",
		TLSConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.DeclareTopic(ctx, client.TopicConfig{Name: "secure", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	p, err := c.NewProducer(client.ProducerOptions{Topic: "secure"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Publish(ctx, client.Message{Value: []byte("over tls")})
	if err != nil || res.Seq != 1 {
		t.Fatalf("publish over TLS: %+v %v", res, err)
	}
	cons, err := c.Subscribe(ctx, "secure", "g", client.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(ctx)
	if err != nil || string(m.Value) != "over tls" {
		t.Fatalf("consume over TLS: %v %v", m, err)
	}
	if err := m.AckSync(ctx); err != nil {
		t.Fatal(err)
	}
	// And a wrong token over TLS still gets AUTH_FAILED.
	if _, err := client.Dial(ctx, client.Options{Servers: []string{addr}, Token: "nope",
		TLSConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}); !errors.Is(err, client.ErrAuthFailed) {
		t.Fatalf("wrong token over TLS: %v", err)
	}
}
