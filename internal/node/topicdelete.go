package node

import (
	"errors"
	"io/fs"
	"path"
	"slices"

	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Topic deletion (meta.DecideTopicDelete). A delete is decided and made
// durable in the metadata first — `__meta` in a cluster, groups.json on a
// single node — and only then carried out on each node: the topic's
// partition and group runners stop, and its incarnation's directories
// (topics/<key>/, groups/<group>/<key>/, key = meta.TopicKey) are removed.
// A node that stops midway removes the rest at its next start
// (removeDeletedData): an incarnation is never reused, so its files are
// never opened again, half-removed or not.

// DeleteTopic deletes topic name — its current incarnation, or
// incarnation when not 0 — and answers done with the incarnation deleted,
// once this node applied the delete and stopped the topic. In a cluster
// only the metadata leader (the groups' coordinator) decides it; others
// answer NOT_LEADER naming it.
func (n *Node) DeleteTopic(name string, incarnation uint64, done func(deleted uint64, err error)) {
	if err := meta.ValidateDeletable(name); err != nil {
		done(0, err) // at any node, not only the metadata leader
		return
	}
	var decided meta.Command
	decide := func(st *meta.State) (meta.Command, error) {
		cmd, err := st.DecideTopicDelete(name, incarnation)
		decided = cmd
		return cmd, err
	}
	if n.cluster != nil {
		if here, _ := n.cluster.Coordinator(); !here {
			done(0, n.cluster.NotCoordinator())
			return
		}
		n.cluster.ProposeMeta(decide, func(err error) { done(decided.Incarnation, err) })
		return
	}
	if err := n.members.proposeLocal(decide); err != nil {
		done(0, err)
		return
	}
	// Durable in groups.json: now carry it out. topics.json follows; a
	// crash before it is finished by the next Open.
	n.stopTopic(name, decided.Incarnation, true)
	n.mu.Lock()
	err := n.saveTopicsLocked()
	n.mu.Unlock()
	if err != nil {
		n.log.Error("persist topics after a delete failed; the next start finishes it", "topic", name, "err", err)
	}
	n.log.Info("topic deleted", "topic", name, "incarnation", decided.Incarnation)
	done(decided.Incarnation, nil)
}

// stopTopic stops incarnation of topic name if it runs here — its group
// runners, then its partitions and their replica groups — and, with
// removeData, removes that incarnation's directories.
func (n *Node) stopTopic(name string, incarnation uint64, removeData bool) {
	n.mu.Lock()
	t := n.topics[name]
	if t != nil && t.incarnation != incarnation {
		t = nil // a later incarnation runs: not this delete's
	}
	var groups []*groupRunner
	if t != nil {
		delete(n.topics, name)
		for k, g := range n.groups {
			if k.topic == name && g.topic == t {
				groups = append(groups, g)
				delete(n.groups, k)
			}
		}
	}
	n.mu.Unlock()
	for _, g := range groups {
		g.stop()
	}
	if t != nil {
		for _, p := range t.partitions {
			p.stop()
		}
	}
	n.members.changes.Add(1) // members re-read their (smaller) assignment
	if removeData {
		n.removeIncarnationData(meta.TopicKey(name, incarnation))
	}
}

// removeIncarnationData removes the directories of one topic incarnation:
// its partitions' and its groups'.
func (n *Node) removeIncarnationData(key string) {
	fsys := n.cfg.Env.FS
	dirs := []string{path.Join(n.cfg.DataDir, "topics", key)}
	groups, _ := fsys.List(path.Join(n.cfg.DataDir, "groups"))
	for _, g := range groups {
		dirs = append(dirs, path.Join(n.cfg.DataDir, "groups", g, key))
	}
	for _, dir := range dirs {
		if err := removeTree(fsys, dir); err != nil {
			n.logRepeatedError("delete/"+key, "remove a deleted topic's data failed; the next start retries", "dir", dir, "err", err)
		}
	}
}

// removeDeletedData removes, at start, what a delete left behind: the
// directories of every topic incarnation deleted says is deleted.
func (n *Node) removeDeletedData(deleted func(key string) bool) {
	fsys := n.cfg.Env.FS
	keys, _ := fsys.List(path.Join(n.cfg.DataDir, "topics"))
	groups, _ := fsys.List(path.Join(n.cfg.DataDir, "groups"))
	for _, g := range groups {
		ks, _ := fsys.List(path.Join(n.cfg.DataDir, "groups", g))
		keys = append(keys, ks...)
	}
	slices.Sort(keys)
	for _, key := range slices.Compact(keys) {
		if deleted(key) {
			n.log.Info("removing a deleted topic's leftover data", "key", key)
			n.removeIncarnationData(key)
		}
	}
}

// removeTree removes dir and everything below it; a missing dir is not
// an error. (vfs has no directory removal: a directory is emptied, then
// removed as a file, which the OS does for an empty directory.)
func removeTree(fsys vfs.FS, dir string) error {
	names, err := fsys.List(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, name := range names {
		child := path.Join(dir, name)
		if _, err := fsys.List(child); err == nil {
			if err := removeTree(fsys, child); err != nil {
				return err
			}
			continue
		}
		if err := fsys.Remove(child); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := fsys.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return fsys.SyncDir(path.Dir(dir))
}

// topicNotFound is NOT_FOUND for a topic this node does not run: "was
// deleted" when the metadata says so.
func (n *Node) topicNotFound(name string) error {
	err := error(wire.Errorf(wire.CodeNotFound, "topic %q does not exist", name))
	if n.members != nil {
		n.members.read(func(st *meta.State) {
			if st != nil {
				err = st.NotFound(name)
			}
		})
	}
	return err
}

// TopicIncarnation reports the current incarnation of topic name (0: not
// declared) and its last deleted one (0: never deleted), as this node's
// applied metadata says.
func (n *Node) TopicIncarnation(name string) (current, deleted uint64) {
	n.members.read(func(st *meta.State) {
		if st != nil {
			current, deleted = st.Incarnation(name)
		}
	})
	return current, deleted
}

// scheduleIncarnation is the destination incarnation a new schedule into
// topic pins (sched.Schedule.Incarnation): the current one; if the topic
// was deleted since the schedule was admitted, the deleted one (its lane
// is then BLOCKED, and ORDERING_BROKEN once the name is declared again).
func (n *Node) scheduleIncarnation(topic string) uint64 {
	cur, deleted := n.TopicIncarnation(topic)
	if cur == 0 {
		return max(deleted, 1)
	}
	return cur
}

// resumeIncarnation is the incarnation a lane command pins: a resume pins
// the destination's current incarnation (an operator resuming an
// ORDERING_BROKEN lane accepts the topic declared again); other commands,
// and a resume while the topic does not exist, keep the lane's (0).
func (n *Node) resumeIncarnation(topic string, op sched.LaneOp) uint64 {
	if op != sched.LaneResume {
		return 0
	}
	cur, _ := n.TopicIncarnation(topic)
	return cur
}
