package kvfold

// Revision is a bucket revision: the sequence number of a record in the
// bucket's log. 0 means "none" (an empty store's cursor, an unreported
// floor).
type Revision uint64

// Op is one change to the user's store: a put of Value under Key, or a
// delete of Key. The loop never modifies a Value it was given.
type Op struct {
	Key    string
	Value  []byte
	Delete bool
}

// Entry is a live key of a listing.
type Entry struct {
	Key   string
	Value []byte
}

// Event is what happened: the shell turns watch frames, listing answers,
// store answers and timers into events and hands them to Loop.Step.
type Event interface{ event() }

// Delivery is one record of watch Watch. Floor is the bucket's floor (the
// first revision it still keeps) as the server reported it with this
// record; 0 when it did not report one.
type Delivery struct {
	Watch    uint64
	Revision Revision
	Key      string
	Value    []byte
	Delete   bool
	Floor    Revision
}

// CursorExpired: the server cannot serve watch Watch from its cursor any
// more (it is below Floor): the loop resyncs.
type CursorExpired struct {
	Watch uint64
	Floor Revision
}

// Listing answers List: every live key of the bucket at Revision, or Err.
// The loop holds Entries until the resync is queued; the shell must not
// modify them.
type Listing struct {
	Request  uint64
	Revision Revision
	Entries  []Entry
	Err      error
}

// StoreKeys answers ReadKeys: the keys the store holds, or Err.
type StoreKeys struct {
	Request uint64
	Keys    []string
	Err     error
}

// Applied answers Apply: the store committed batch Batch (Err nil) or
// did not commit any of it.
type Applied struct {
	Batch uint64
	Err   error
}

// Probe is the server's current floor, asked periodically: it is the only
// evidence an idle watch (one with nothing to deliver) gets of eviction.
type Probe struct {
	Floor Revision
}

// Flush: the shell's batching timer (or size trigger) fired: apply what
// is pending.
type Flush struct{}

// Restart: the loop (re)starts with nothing in memory; Persisted is the
// cursor the store reports. The first event of every loop is a Restart.
type Restart struct {
	Persisted Revision
}

func (Delivery) event()      {}
func (CursorExpired) event() {}
func (Listing) event()       {}
func (StoreKeys) event()     {}
func (Applied) event()       {}
func (Probe) event()         {}
func (Flush) event()         {}
func (Restart) event()       {}

// Effect is a decision of the loop, carried out by the shell in the order
// Step returned them.
type Effect interface{ effect() }

// Apply: write Ops, in order, and Cursor to the store in one atomic step
// (all or nothing), then answer Applied{Batch: ID}. At most one Apply is
// outstanding at a time; its answer comes before the next Apply.
type Apply struct {
	ID     uint64
	Ops    []Op
	Cursor Revision
}

// Watch: cancel the current watch (or listing) and watch the bucket from
// revision From, tagging its deliveries with ID. Deliveries of an earlier
// watch that are still in flight are ignored.
type Watch struct {
	ID   uint64
	From Revision
}

// List: cancel the current watch and list every live key of the bucket
// at one revision; answer Listing{Request: Request}.
type List struct {
	Request uint64
}

// ReadKeys: read the keys the store holds (nothing is being applied
// meanwhile unless the NoAckBarrier mutation is on); answer StoreKeys.
type ReadKeys struct {
	Request uint64
}

// Fail: the loop stopped with Err; cancel the watch. Only a Restart
// starts it again.
type Fail struct {
	Err error
}

func (Apply) effect()    {}
func (Watch) effect()    {}
func (List) effect()     {}
func (ReadKeys) effect() {}
func (Fail) effect()     {}
