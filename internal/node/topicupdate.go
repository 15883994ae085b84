package node

import (
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/wire"
)

// UpdateTopic changes a topic's retention (wire.TopicUpdate): in a
// cluster through the metadata log, here on its leader (NOT_LEADER
// elsewhere); on a single node in topics.json. done is called exactly
// once, with the topic's configuration and incarnation after the update
// once this node holds it, or the error. The partitions apply the new
// retention at their next retention check: a shorter one deletes what it
// no longer keeps then, a longer one keeps what is still there.
func (n *Node) UpdateTopic(u wire.TopicUpdate, done func(cfg wire.TopicConfig, incarnation uint64, err error)) {
	if err := meta.ValidateUpdatable(u); err != nil {
		done(wire.TopicConfig{}, 0, err) // at any node, not only the metadata leader
		return
	}
	if n.cluster != nil {
		if here, _ := n.cluster.Coordinator(); !here {
			done(wire.TopicConfig{}, 0, n.cluster.NotCoordinator())
			return
		}
		var decided meta.Topic
		decide := func(st *meta.State) (meta.Command, error) {
			cmd, t, _, err := st.DecideTopicUpdate(u)
			decided = t
			return cmd, err
		}
		n.cluster.ProposeMeta(decide, func(err error) { done(decided.Config, decided.Incarnation, err) })
		return
	}
	cfg, incarnation, err := n.updateLocal(u)
	done(cfg, incarnation, err)
}

// updateLocal carries out a topic update on a single node: topics.json
// first, then the partitions' retention.
func (n *Node) updateLocal(u wire.TopicUpdate) (wire.TopicConfig, uint64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return wire.TopicConfig{}, 0, wire.Errorf(wire.CodeUnavailable, "node is shutting down")
	}
	t, ok := n.topics[u.Topic]
	if !ok {
		return wire.TopicConfig{}, 0, n.topicNotFound(u.Topic)
	}
	// The topic alone, decided as the metadata leader decides it.
	st := meta.New()
	st.AddTopic(meta.Topic{Config: t.cfg, Incarnation: t.incarnation})
	_, updated, changed, err := st.DecideTopicUpdate(u)
	if err != nil || !changed {
		return updated.Config, updated.Incarnation, err
	}
	old := t.cfg
	t.setConfig(updated.Config)
	if err := n.saveTopicsLocked(); err != nil {
		t.setConfig(old)
		return wire.TopicConfig{}, 0, wire.Errorf(wire.CodeStorage, "persist topic: %v", err)
	}
	n.members.topicDeclared(updated.Config, t.incarnation)
	n.log.Info("topic updated", "topic", u.Topic, "retention_ms", updated.Config.RetentionMs, "retention_bytes", updated.Config.RetentionBytes)
	return updated.Config, t.incarnation, nil
}

// topicUpdated gives incarnation of the topic, if it runs here, the
// settings its metadata now holds (clusterHost.TopicUpdated).
func (n *Node) topicUpdated(cfg wire.TopicConfig, incarnation uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t := n.topics[cfg.Name]; t != nil && t.incarnation == incarnation {
		t.setConfig(cfg)
	}
}

// setConfig replaces the topic's retention by cfg's, the only settings
// that change while it runs; n.mu is held, so that readers under it see
// the whole configuration, and settingsMu is taken for the partitions'
// goroutines, which read the retention alone (retention).
func (t *topic) setConfig(cfg wire.TopicConfig) {
	t.settingsMu.Lock()
	t.cfg.RetentionMs, t.cfg.RetentionBytes = cfg.RetentionMs, cfg.RetentionBytes
	t.settingsMu.Unlock()
}

// retention is the topic's retention now (a TOPIC_UPDATE changes it).
func (t *topic) retention() (ageMs, bytes int64) {
	t.settingsMu.Lock()
	defer t.settingsMu.Unlock()
	return t.cfg.RetentionMs, t.cfg.RetentionBytes
}
