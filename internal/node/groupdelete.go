package node

import (
	"maps"
	"path"
	"slices"

	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Group deletion (meta.State.DecideGroupDelete). A delete is made durable
// in the metadata first — `__meta` in a cluster, groups.json on a single
// node — and then carried out on each node: the group's runners stop
// (their competing consumers are told NOT_FOUND) and the deleted
// incarnation's directories (groups/<key>/, key = meta.GroupKeyOf) are
// removed; a node that stops midway removes them at its next start.
//
// A group of the name again is the next incarnation
// (GroupIncarnationStartsEmpty): its runners name their records and
// directories by its own key, so it starts from the partitions' start
// with no acks, settings or dead-letter identity of before. The deleted
// incarnation's ack records stay in the partitions' logs until retention
// takes them, but bound no compaction (DeletedGroupPinsNothing).

// groupsGone is the metadata's deleted group incarnations (name → the last
// deleted), as last published to the partitions; never changed in place.
type groupsGone map[string]uint64

// gone reports whether group key names a deleted incarnation.
func (d groupsGone) gone(key string) bool { return meta.DeletedGroupKey(key, d) }

// groupKey is the key of group name's current incarnation.
func (n *Node) groupKey(name string) string {
	key := name
	n.members.read(func(st *meta.State) {
		if st != nil {
			key = st.GroupKey(name)
		}
	})
	return key
}

// GroupIncarnation reports the current incarnation of group name as this
// node's applied metadata says (1 until the name is first deleted), for
// checkers.
func (n *Node) GroupIncarnation(name string) (inc uint64) {
	inc = 1
	n.members.read(func(st *meta.State) {
		if st != nil {
			inc = st.GroupIncarnation(name)
		}
	})
	return inc
}

// ReadMetadata calls f with the node's applied metadata, for checkers (f
// must not keep it): a cluster member's applied `__meta` state, a single
// node's group state (topics are not in it).
func (n *Node) ReadMetadata(f func(*meta.State)) { n.members.read(f) }

// finishGroupDeletes, at start, removes what group deletes left behind
// (a node stopped before it removed a deleted incarnation's directories)
// and hands the partitions the deleted incarnations, before any starts.
func (n *Node) finishGroupDeletes(st *meta.State) {
	n.removeGroupDirs(st.DeletedGroup, st.GroupKey)
	n.publishGroupsGone(st)
}

// publishGroupsGone hands the partitions the deleted incarnations of st;
// the caller holds what guards st.
func (n *Node) publishGroupsGone(st *meta.State) {
	if cur := n.groupsGone.Load(); cur != nil && maps.Equal(*cur, st.GroupsDeleted) {
		return
	}
	d := groupsGone(maps.Clone(st.GroupsDeleted))
	n.groupsGone.Store(&d)
}

// groupDeleted carries out the delete of group name's incarnation inc
// here: the partitions learn it, its runners stop and, with removeData
// (the delete is durable in this node's metadata), its directories go.
func (n *Node) groupDeleted(name string, inc uint64, removeData bool) {
	n.members.read(func(st *meta.State) {
		if st != nil {
			n.publishGroupsGone(st)
		}
	})
	gone := groupsGone{name: inc}
	n.mu.Lock()
	var stopped []*groupRunner
	for k, g := range n.groups {
		if k.group == name && gone.gone(g.key) {
			stopped = append(stopped, g)
			delete(n.groups, k)
		}
	}
	n.mu.Unlock()
	n.stopGroupRunners(stopped, groupDeletedError(name))
	if removeData {
		n.removeGroupDirs(gone.gone, n.groupKey)
	}
	n.mu.RLock()
	for _, t := range n.topics {
		for _, p := range t.partitions {
			if r := p.replica(); r != nil {
				r.poke() // it drops what the group needed of its log
			}
		}
	}
	n.mu.RUnlock()
	n.log.Info("group deleted", "group", name, "incarnation", inc)
}

// groupDeletedError ends the subscriptions of a deleted group.
func groupDeletedError(name string) *wire.Error {
	return wire.Errorf(wire.CodeNotFound, "group %q was deleted; subscribe again to start its next incarnation", name)
}

// stopGroupRunners stops runners taken out of n.groups, ending their
// subscriptions with why.
func (n *Node) stopGroupRunners(runners []*groupRunner, why *wire.Error) {
	for _, g := range runners {
		g.endSubs.Store(why)
		t := g.topic
		t.groupsMu.Lock()
		t.groups = slices.DeleteFunc(t.groups, func(o *groupRunner) bool { return o == g })
		t.groupsMu.Unlock()
		g.stop()
	}
}

// removeGroupDirs removes the group directories whose key gone says is a
// deleted incarnation's. First each one's delivery-id incarnations go to
// the same topics' directories of its name's current key (keyOf): the
// next incarnation's delivery ids then differ from every id the deleted
// one handed out, so a late ACK of a deleted group's delivery cannot
// complete the next one's delivery of the same seq
// (DeliveryIDsOutliveTheirGroup).
func (n *Node) removeGroupDirs(gone func(key string) bool, keyOf func(name string) string) {
	fsys := n.cfg.Env.FS
	keys, _ := fsys.List(path.Join(n.cfg.DataDir, "groups"))
	for _, key := range keys {
		if !gone(key) {
			continue
		}
		dir := path.Join(n.cfg.DataDir, "groups", key)
		if name, _, ok := meta.ParseTopicKey(key); ok {
			n.carryDeliveryIncarnations(dir, path.Join(n.cfg.DataDir, "groups", keyOf(name)))
		}
		if err := removeTree(fsys, dir); err != nil {
			n.logRepeatedError("delete/group/"+key, "remove a deleted group's data failed; the next start retries", "dir", dir, "err", err)
		}
	}
}

// carryDeliveryIncarnations raises each topic's delivery-id incarnation
// file under to (groupRunner.load's) to at least the one under from.
func (n *Node) carryDeliveryIncarnations(from, to string) {
	fsys := n.cfg.Env.FS
	topics, _ := fsys.List(from)
	for _, topic := range topics {
		old, ok, _, _ := readLoadCount(fsys, path.Join(from, topic))
		if !ok {
			continue
		}
		dir := path.Join(to, topic)
		if cur, ok, _, _ := readLoadCount(fsys, dir); ok && cur >= old {
			continue
		}
		err := fsys.MkdirAll(dir)
		if err == nil {
			err = writeLoadCount(fsys, dir, old)
		}
		if err != nil {
			n.log.Warn("carry a deleted group's delivery-id incarnation failed", "dir", dir, "err", err)
		}
	}
}
