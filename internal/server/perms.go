package server

import (
	"fmt"
	"strings"

	"github.com/nereus-broker/nereus/internal/wire"
)

// perms is what one token may do. A token line with no permissions may do
// everything (the token file format before permissions existed).
//
// Token file line: SECRET [PERM ...], where PERM is
//
//	admin        declare topics, create and delete KV buckets
//	pub:GLOB     publish to matching topics
//	sub:GLOB     consume (pull, ack, nack) matching topics
//	kv:GLOB      read and write (put, delete, CAS) matching KV buckets
//	kvread:GLOB  read matching KV buckets (get, keys, history, list, watch)
//	*            everything
//
// and GLOB is a topic or bucket name, "*", or a prefix ending in "*"
// ("orders.*"). Buckets have their own permissions: a bucket is not a topic
// a token names (its internal topic __kv.B matches no pub: or sub: glob).
type perms struct {
	all    bool
	admin  bool
	pub    []string
	sub    []string
	kv     []string // read and write
	kvRead []string // read only
}

func parsePerms(fields []string) (perms, error) {
	if len(fields) == 0 {
		return perms{all: true}, nil
	}
	var p perms
	for _, f := range fields {
		switch {
		case f == "*":
			p.all = true
		case f == "admin":
			p.admin = true
		case strings.HasPrefix(f, "pub:") && validGlob(f[4:]):
			p.pub = append(p.pub, f[4:])
		case strings.HasPrefix(f, "sub:") && validGlob(f[4:]):
			p.sub = append(p.sub, f[4:])
		case strings.HasPrefix(f, "kv:") && validGlob(f[3:]):
			p.kv = append(p.kv, f[3:])
		case strings.HasPrefix(f, "kvread:") && validGlob(f[7:]):
			p.kvRead = append(p.kvRead, f[7:])
		default:
			return perms{}, fmt.Errorf("unknown permission %q (want admin, pub:GLOB, sub:GLOB, kv:GLOB, kvread:GLOB or *)", f)
		}
	}
	return p, nil
}

func validGlob(g string) bool {
	name := strings.TrimSuffix(g, "*")
	if name == "" {
		return g == "*"
	}
	return wire.ValidateName("topic", name) == nil
}

func globMatch(globs []string, topic string) bool {
	for _, g := range globs {
		if g == topic || g == "*" || (strings.HasSuffix(g, "*") && strings.HasPrefix(topic, g[:len(g)-1])) {
			return true
		}
	}
	return false
}

func (p *perms) canDeclare() bool              { return p.all || p.admin }
func (p *perms) canPublish(topic string) bool  { return p.all || globMatch(p.pub, topic) }
func (p *perms) canConsume(topic string) bool  { return p.all || globMatch(p.sub, topic) }
func (p *perms) canWriteKV(bucket string) bool { return p.all || globMatch(p.kv, bucket) }
func (p *perms) canReadKV(bucket string) bool {
	return p.all || globMatch(p.kv, bucket) || globMatch(p.kvRead, bucket)
}
