package peer

import (
	"math/bits"
	"sync"
)

// Frame buffers are reused: Send encodes a frame into a pooled buffer and
// the write loop gives it back once the frame is written (or dropped), so
// a leader replicating megabytes a second to its followers neither
// allocates a frame per follower nor leaves each to the GC. Buffers come
// in power-of-two size classes so that a small frame does not take (and
// pin) a large buffer, nor a large frame a small one it must outgrow.
const (
	poolClassMin = 12 // 4 KiB: smaller frames share the smallest class
	poolClassMax = 24 // 16 MiB: larger buffers are left to the GC
)

var framePools [poolClassMax + 1]sync.Pool // of *[]byte, by class

// getFrameBuffer returns an empty buffer with room for n bytes when n is
// known (n > 0), else one of the smallest class.
func getFrameBuffer(n int) []byte {
	c := poolClassMin
	if n > 1<<poolClassMin {
		c = bits.Len(uint(n - 1)) // the smallest class whose size is ≥ n
	}
	if c > poolClassMax {
		return make([]byte, 0, n)
	}
	if b, ok := framePools[c].Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, 1<<c)
}

// putFrameBuffer gives b back for reuse; nothing may use b afterwards.
func putFrameBuffer(b []byte) {
	c := bits.Len(uint(cap(b))) - 1 // the largest class whose size is ≤ cap
	if c < poolClassMin || c > poolClassMax {
		return
	}
	b = b[:0]
	framePools[c].Put(&b)
}
