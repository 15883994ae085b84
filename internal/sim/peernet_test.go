package sim

import "testing"

// Random faults overlap: a link two faults cut stays cut until both have
// healed, and a scripted restore leaves nothing counted as cut (the
// scheduler ghost's quiet-cluster checks run only when no link is).
func TestOverlappingCutsHealIndependently(t *testing.T) {
	n := newPeerNet(newWorld(1, false))
	for id := uint32(1); id <= 3; id++ {
		n.brokers[id] = nil
	}
	partition := n.linksOf(1, true, true) // n1 cut off both ways
	bridge := [][2]uint32{{1, 3}, {3, 1}} // n1 and n3 cannot hear each other
	n.cutLinks(partition, 1)
	n.cutLinks(bridge, 1)
	n.cutLinks(partition, -1) // the partition heals first
	if n.isCut(1, 2) || n.isCut(2, 1) {
		t.Fatal("n1-n2 still cut after the only fault holding it healed")
	}
	if !n.isCut(1, 3) || !n.isCut(3, 1) {
		t.Fatal("the first heal cleared the bridge partition's links too")
	}
	n.cutLinks(bridge, -1)
	if n.anyCut() {
		t.Fatalf("links cut after every fault healed: %v", n.cuts)
	}
	n.setCut(2, true, false)
	if !n.isCut(2, 1) || n.isCut(1, 2) {
		t.Fatal("setCut(2, sends lost) cut the wrong links")
	}
	n.setCut(2, false, false)
	if n.anyCut() {
		t.Fatalf("a scripted restore left links counted as cut: %v", n.cut)
	}
}

// Lossy-network faults overlap too: the network is healthy again only
// once the last one has ended.
func TestOverlappingFlakyNetworksHealTogether(t *testing.T) {
	n := newPeerNet(newWorld(1, false))
	n.flakyStart()
	n.flakyStart()
	if n.flakyEnd() || n.dropP == 0 || n.dupP == 0 || n.delayP == 0 {
		t.Fatalf("the first end healed the network while another fault is in force (drop %v, dup %v, delay %v)", n.dropP, n.dupP, n.delayP)
	}
	if !n.flakyEnd() || n.dropP != 0 || n.dupP != 0 || n.delayP != 0 {
		t.Fatalf("the network is not healthy after the last end (drop %v, dup %v, delay %v)", n.dropP, n.dupP, n.delayP)
	}
}
