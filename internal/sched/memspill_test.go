package sched

import (
	"fmt"
	"slices"
)

// MemSpill is a Spill in memory (the tests: the State's
// bounded-memory rules without a disk).
type MemSpill struct {
	lanes map[string][]Key // sorted
	lane  map[uint64]string
}

// NewMemSpill returns an empty MemSpill.
func NewMemSpill() *MemSpill {
	return &MemSpill{lanes: map[string][]Key{}, lane: map[uint64]string{}}
}

func (m *MemSpill) Put(lane string, k Key) error {
	ks := m.lanes[lane]
	i, found := slices.BinarySearchFunc(ks, k, CompareKeys)
	if found {
		return fmt.Errorf("schedule %d spilled twice", k.ID)
	}
	m.lanes[lane] = slices.Insert(ks, i, k)
	m.lane[k.ID] = lane
	return nil
}

func (m *MemSpill) Pop(lane string, n int) ([]Key, error) {
	ks := m.lanes[lane]
	n = min(n, len(ks))
	out := slices.Clone(ks[:n])
	m.lanes[lane] = ks[n:]
	for _, k := range out {
		delete(m.lane, k.ID)
	}
	return out, nil
}

func (m *MemSpill) Delete(id uint64) (string, Key, bool, error) {
	lane, ok := m.lane[id]
	if !ok {
		return "", Key{}, false, nil
	}
	delete(m.lane, id)
	ks := m.lanes[lane]
	i := slices.IndexFunc(ks, func(k Key) bool { return k.ID == id })
	k := ks[i]
	m.lanes[lane] = slices.Delete(ks, i, i+1)
	return lane, k, true, nil
}

func (m *MemSpill) Drop(lane string) error {
	for _, k := range m.lanes[lane] {
		delete(m.lane, k.ID)
	}
	delete(m.lanes, lane)
	return nil
}

// Len is the number of schedules m holds.
func (m *MemSpill) Len() int { return len(m.lane) }

func (m *MemSpill) Move(lane string, k Key) (bool, error) {
	ks := m.lanes[lane]
	i, found := slices.BinarySearchFunc(ks, k, CompareKeys)
	if !found {
		return false, nil
	}
	ks[i].At = k.At
	return true, nil
}

func (m *MemSpill) Scan(lane string, from *Key, f func(Key) bool) error {
	ks := m.lanes[lane]
	if from != nil {
		i, found := slices.BinarySearchFunc(ks, *from, CompareKeys)
		if found {
			i++
		}
		ks = ks[i:]
	}
	for _, k := range ks {
		if !f(k) {
			return nil
		}
	}
	return nil
}
