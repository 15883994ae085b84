package node

import (
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Every refusal of the publish kernel is worded for the client with a
// code of its own: a refusal without one would be answered as a PUB_OK
// of seq 0 (replicaStore.proposeReplicated answers refusal's error).
func TestEveryPublishRefusalHasAnError(t *testing.T) {
	p := &replicaStore{partitionRunner: &partitionRunner{node: &Node{}, topic: &topic{cfg: wire.TopicConfig{Name: "t"}}, id: 1}}
	for _, c := range []struct {
		r    partition.Refusal
		code wire.Code
		says string
	}{
		{partition.RefusedNotLeader, wire.CodeNotLeader, "does not lead it"},
		{partition.RefusedQuorumLost, wire.CodeQuorumLost, "READ_ONLY_DEGRADED"},
		{partition.RefusedTakingOffice, wire.CodeUnavailable, "taking office"},
		{partition.RefusedNotApplied, wire.CodeUnavailable, "not applied yet"},
	} {
		err := p.refusal(replica.Status{}, c.r)
		if err == nil || err.Code != c.code || !strings.Contains(err.Message, c.says) {
			t.Errorf("refusal %v: %v, want %v saying %q", c.r, err, c.code, c.says)
		}
	}
}
