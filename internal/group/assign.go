// Package group is the consumer-group kernel (DESIGN §2, §3): which member
// of a group owns which partition, and how ownership moves. It is pure —
// no goroutines, I/O, clock or randomness. The group's State is applied
// in order from commands of the single-writer metadata log (JOIN, LEAVE,
// CONTROL_ACK), so every node holds the same assignment; the Coordinator
// (on the metadata leader) turns heartbeats and elapsed time into the
// commands that fence silent members and into the NOTICE frames members
// must hear. Partition leaders ask the State whether a PULL or an ACK
// comes from the partition's current owner (CheckPull, CheckAck).
package group

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Partition names one partition of one topic.
type Partition struct {
	Topic string
	Index uint32
}

func (p Partition) String() string { return p.Topic + "/" + strconv.FormatUint(uint64(p.Index), 10) }

// MarshalText lets a Partition key a JSON object ("topic/3"; topic names
// never hold a '/').
func (p Partition) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText parses what MarshalText wrote.
func (p *Partition) UnmarshalText(b []byte) error {
	s := string(b)
	i := strings.LastIndexByte(s, '/')
	if i <= 0 {
		return fmt.Errorf("group: bad partition %q", s)
	}
	n, err := strconv.ParseUint(s[i+1:], 10, 32)
	if err != nil {
		return fmt.Errorf("group: bad partition %q", s)
	}
	*p = Partition{Topic: s[:i], Index: uint32(n)}
	return nil
}

// Compare orders partitions by topic, then index.
func (p Partition) Compare(q Partition) int {
	if c := cmp.Compare(p.Topic, q.Topic); c != 0 {
		return c
	}
	return cmp.Compare(p.Index, q.Index)
}

// Subscriber is what the assignment needs to know of a member.
type Subscriber struct {
	ID     string
	Topics []string
}

// Assign computes the target owner of every partition. It is sticky: a
// partition stays with its previous owner while that owner is still a
// subscriber of its topic, unless the owner holds more than its share.
// It is balanced: no subscriber ends with two partitions fewer than
// another whose partitions it could take (with identical subscriptions,
// partition counts differ by at most one). It moves only what must move:
// partitions without an owner go to the least loaded subscribers, and a
// partition leaves a live owner only to even out counts, from the most
// loaded member to the least loaded, one at a time. Partitions no member
// subscribes to are absent from the result. The result depends only on
// the arguments, never on map order.
func Assign(subs []Subscriber, partitions []Partition, previous map[Partition]string) map[Partition]string {
	subs = slices.Clone(subs)
	slices.SortFunc(subs, func(a, b Subscriber) int { return cmp.Compare(a.ID, b.ID) })
	parts := slices.Clone(partitions)
	slices.SortFunc(parts, Partition.Compare)
	parts = slices.Compact(parts)

	byID := make(map[string]int, len(subs))
	for i, s := range subs {
		byID[s.ID] = i
	}
	eligible := func(i int, p Partition) bool { return slices.Contains(subs[i].Topics, p.Topic) }
	owned := make([][]Partition, len(subs)) // kept sorted
	out := make(map[Partition]string, len(parts))
	give := func(i int, p Partition) {
		out[p] = subs[i].ID
		j, _ := slices.BinarySearchFunc(owned[i], p, Partition.Compare)
		owned[i] = slices.Insert(owned[i], j, p)
	}

	// Keep every partition whose previous owner still subscribes to it.
	var orphans []Partition
	for _, p := range parts {
		if i, ok := byID[previous[p]]; ok && eligible(i, p) {
			give(i, p)
		} else {
			orphans = append(orphans, p)
		}
	}
	// Orphans go to the least loaded eligible subscriber (lowest ID first).
	for _, p := range orphans {
		best := -1
		for i := range subs {
			if eligible(i, p) && (best < 0 || len(owned[i]) < len(owned[best])) {
				best = i
			}
		}
		if best >= 0 {
			give(best, p)
		}
	}
	// Even out: while the most loaded member holds a partition a member
	// with at least two fewer could take, move its last such partition.
	// Every move lowers the sum of squared counts, so this ends.
	for {
		from, to, moved := -1, -1, Partition{}
		for _, a := range byLoad(owned, true) {
			for _, b := range byLoad(owned, false) {
				if len(owned[b]) > len(owned[a])-2 {
					break
				}
				for k := len(owned[a]) - 1; k >= 0; k-- {
					if eligible(b, owned[a][k]) {
						from, to, moved = a, b, owned[a][k]
						break
					}
				}
				if from >= 0 {
					break
				}
			}
			if from >= 0 {
				break
			}
		}
		if from < 0 {
			return out
		}
		k, _ := slices.BinarySearchFunc(owned[from], moved, Partition.Compare)
		owned[from] = slices.Delete(owned[from], k, k+1)
		give(to, moved)
	}
}

// byLoad orders member indexes by partition count, most loaded first when
// desc, ties by index (the sorted IDs).
func byLoad(owned [][]Partition, desc bool) []int {
	idx := make([]int, len(owned))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		if desc {
			return cmp.Compare(len(owned[b]), len(owned[a]))
		}
		return cmp.Compare(len(owned[a]), len(owned[b]))
	})
	return idx
}

// MinimalMoves is how many partitions must leave a live owner when
// subscribers with identical subscriptions share n partitions, kept[i]
// of which subscriber i still holds from the previous assignment: the
// owners above the largest share give up the excess, and if more owners
// hold the largest share than there are large shares, the surplus ones
// give up one each. CB2 compares a rebalance's moves against it.
func MinimalMoves(kept []int, n int) int {
	m := len(kept)
	if m == 0 {
		return 0
	}
	floor, extras := n/m, n%m
	moves, atCeil := 0, 0
	for _, k := range kept {
		if extras == 0 {
			moves += max(0, k-floor)
			continue
		}
		moves += max(0, k-(floor+1))
		if k >= floor+1 {
			atCeil++
		}
	}
	return moves + max(0, atCeil-extras)
}
