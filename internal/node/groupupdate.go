package node

import (
	"encoding/json"
	"errors"
	"math"
	"path"

	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Group updates (meta.State.DecideGroupUpdate): a group's ack wait and
// max deliveries, set for the whole group in the metadata — `__meta` in
// a cluster, groups.json on a single node — and given to every runner of
// the group's incarnation on every node (GroupSettingsOnEveryNode). A
// runner started later starts with them, whatever its first PULL asks.
// A group never updated keeps the settings its first PULL on each node
// fixed (settings.json).

// UpdateGroup sets group u.Group's settings: on the coordinator (in a
// cluster the metadata leader; NOT_LEADER elsewhere). answer is called
// once, with the group's incarnation and settings after the update (a
// setting no update gave: this node's default) once this node holds
// them, or the error.
func (n *Node) UpdateGroup(u wire.GroupUpdate, answer func(wire.GroupUpdateOK, error)) {
	done := func(st meta.GroupSettings, err error) {
		in := n.effectiveSettings(st)
		answer(wire.GroupUpdateOK{GroupRef: wire.GroupRef{Group: st.Group, Incarnation: st.Incarnation},
			AckWaitMs: uint32(min(in.AckWaitMs, math.MaxUint32)), MaxDeliver: in.MaxDeliver}, err)
	}
	if err := meta.ValidateGroupUpdate(u); err != nil {
		done(meta.GroupSettings{}, err) // at any node, not only the coordinator
		return
	}
	if err := n.coordinatesGroup(u.Group); err != nil {
		done(meta.GroupSettings{}, err)
		return
	}
	var decided meta.GroupSettings
	decide := func(st *meta.State) (meta.Command, error) {
		cmd, s, changed, err := st.DecideGroupUpdate(u)
		decided = s
		if err == nil && !changed {
			err = errUnchanged
		}
		return cmd, err
	}
	n.members.proposeDecided(decide, func(err error) {
		if errors.Is(err, errUnchanged) {
			done(decided, nil)
			return
		}
		if err == nil && n.cluster == nil {
			n.groupSettingsUpdated(u.Group) // durable in groups.json
		}
		done(decided, err)
	})
}

// errUnchanged ends a group update that changes nothing before anything
// is proposed or written.
var errUnchanged = errors.New("group settings unchanged")

// groupSettingsUpdated tells every runner here of group name that an
// update applied (clusterHost.GroupSettingsUpdated). Each reads the
// settings the metadata holds as it takes the command (applySettings):
// two updates' commands arriving out of order still leave the last one's.
func (n *Node) groupSettingsUpdated(name string) {
	n.mu.Lock()
	for k, g := range n.groups {
		if k.group == name {
			g.send(groupCmd{kind: cmdSettings})
		}
	}
	n.mu.Unlock()
}

// effectiveSettings are the settings a runner takes from st: a field no
// group update gave is the node's default.
func (n *Node) effectiveSettings(st meta.GroupSettings) groupSettings {
	out := groupSettings{AckWaitMs: int64(st.AckWaitMs), MaxDeliver: st.MaxDeliver}
	if out.AckWaitMs == 0 {
		out.AckWaitMs = n.cfg.DefaultAckWaitMs
	}
	if out.MaxDeliver == 0 {
		out.MaxDeliver = n.cfg.DefaultMaxDeliver
	}
	return out
}

// updatedSettings returns the settings the metadata holds for group
// name's current incarnation, ok false when no group update set any.
func (n *Node) updatedSettings(name string) (st groupSettings, ok bool) {
	n.members.read(func(ms *meta.State) {
		if ms == nil {
			return
		}
		var s meta.GroupSettings
		if s, ok = ms.SettingsOf(name); ok {
			st = n.effectiveSettings(s)
		}
	})
	return st, ok
}

// applySettings, on the runner's goroutine, puts in force the settings
// the metadata holds for the group's current incarnation (a deleted
// incarnation's runners are out of n.groups before it is told): the
// cursors at once, settings.json for the node's listing. A failed write
// is logged and changes nothing else — the metadata holds the settings,
// and a restart reads them from there.
func (g *groupRunner) applySettings() {
	st, ok := g.node.updatedSettings(g.name)
	if !ok || st == g.settings() {
		return
	}
	if err := g.writeSettings(st); err != nil {
		g.node.log.Error("group settings updated but not written to settings.json", "group", g.name, "topic", g.topic.cfg.Name, "err", err)
	}
	g.settingsMu.Lock()
	g.cfg.AckWaitMs, g.cfg.MaxDeliver = st.AckWaitMs, st.MaxDeliver
	g.settingsMu.Unlock()
	for _, c := range g.cursors {
		if c != nil {
			if err := c.SetLimits(st.AckWaitMs, st.MaxDeliver); err != nil {
				g.node.log.Error("group settings refused by a cursor", "group", g.name, "topic", g.topic.cfg.Name, "err", err)
			}
		}
	}
	g.node.log.Info("group settings in force", "group", g.name, "topic", g.topic.cfg.Name,
		"ack_wait_ms", st.AckWaitMs, "max_deliver", st.MaxDeliver)
}

// settings are the runner's settings now; any goroutine.
func (g *groupRunner) settings() groupSettings {
	g.settingsMu.Lock()
	defer g.settingsMu.Unlock()
	return groupSettings{AckWaitMs: g.cfg.AckWaitMs, MaxDeliver: g.cfg.MaxDeliver}
}

// writeSettings persists st as the runner's settings.json.
func (g *groupRunner) writeSettings(st groupSettings) error {
	fsys := g.node.cfg.Env.FS
	if err := fsys.MkdirAll(g.dir); err != nil {
		return err
	}
	b, _ := json.Marshal(st)
	return storage.WriteFileAtomic(fsys, path.Join(g.dir, "settings.json"), b)
}
