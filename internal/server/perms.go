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
//	admin        declare topics
//	pub:GLOB     publish to matching topics
//	sub:GLOB     consume (pull, ack, nack) matching topics
//	*            everything
//
// and GLOB is a topic name, "*", or a prefix ending in "*" ("orders.*").
type perms struct {
	all   bool
	admin bool
	pub   []string
	sub   []string
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
		default:
			return perms{}, fmt.Errorf("unknown permission %q (want admin, pub:GLOB, sub:GLOB or *)", f)
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

func (p *perms) canDeclare() bool             { return p.all || p.admin }
func (p *perms) canPublish(topic string) bool { return p.all || globMatch(p.pub, topic) }
func (p *perms) canConsume(topic string) bool { return p.all || globMatch(p.sub, topic) }
