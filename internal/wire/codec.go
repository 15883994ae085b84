package wire

import (
	"encoding/binary"
	"hash/crc32"
	"io"
	"slices"
	"unicode/utf8"
)

// Protocol versions this package speaks.
const (
	VersionMin uint16 = 1
	// VersionMax 2 adds PUB_BATCH and PUB_BATCH_OK; 3 GROUP_INCARNATION,
	// GROUP_INCARNATION_OK and GROUP_DELETE_INCARNATION; 4 TOPIC_UPDATE and
	// TOPIC_UPDATE_OK; 5 GROUP_UPDATE and GROUP_UPDATE_OK.
	VersionMax uint16 = 5
	// VersionPubBatch is the first version with PUB_BATCH.
	VersionPubBatch uint16 = 2
	// VersionGroupIncarnation is the first version whose brokers know a
	// group's incarnation on the wire (GROUP_INCARNATION,
	// GROUP_DELETE_INCARNATION): a client deletes with the frames of
	// before on a connection of an earlier version.
	VersionGroupIncarnation uint16 = 3
	// VersionTopicUpdate is the first version with TOPIC_UPDATE.
	VersionTopicUpdate uint16 = 4
	// VersionGroupUpdate is the first version with GROUP_UPDATE.
	VersionGroupUpdate uint16 = 5
)

// Size bounds. A frame is never larger than the negotiated maximum; lists are
// bounded so a small frame cannot make the decoder allocate much.
const (
	DefaultFrameBytesMax = 8 << 20  // 8 MiB
	FrameBytesMin        = 64 << 10 // a server never negotiates below this
	frameHeaderBytes     = 4        // the length prefix
	frameFixedBytes      = 1 + 8 + 4
	listLenMax           = 1 << 16 // any list in one frame
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// bodySizer is a frame that knows its encoded body's size in bytes, so
// that AppendFrame grows dst once instead of doubling it as the body's
// fields are appended (a REPLICATE's entries are megabytes).
type bodySizer interface{ bodyBytes() int }

// FrameBytes is the size of f's encoding when f knows it in advance (a
// REPLICATE does), else 0: a caller may get a buffer that fits before
// encoding.
func FrameBytes(f Frame) int {
	if s, ok := f.(bodySizer); ok {
		return frameHeaderBytes + frameFixedBytes + s.bodyBytes()
	}
	return 0
}

// AppendFrame appends the encoding of f with correlation id corr to dst.
func AppendFrame(dst []byte, corr uint64, f Frame) []byte {
	if n := FrameBytes(f); n > 0 {
		dst = slices.Grow(dst, n)
	}
	start := len(dst)
	dst = appendFrameHead(dst, f.Type(), corr)
	return finishFrame(f.appendBody(dst), start)
}

// appendFrameHead starts a frame: its length (written by finishFrame),
// type and correlation id.
func appendFrameHead(dst []byte, t FrameType, corr uint64) []byte {
	dst = append(dst, 0, 0, 0, 0, byte(t))
	return binary.BigEndian.AppendUint64(dst, corr)
}

// finishFrame ends the frame begun at dst[start:] with its checksum and
// writes its length.
func finishFrame(dst []byte, start int) []byte {
	crc := crc32.Checksum(dst[start+frameHeaderBytes:], castagnoli)
	dst = binary.BigEndian.AppendUint32(dst, crc)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-frameHeaderBytes))
	return dst
}

// AppendFramePieces appends to pieces the encoding of f with correlation
// id corr as consecutive byte slices whose concatenation is
// AppendFrame(nil, corr, f) — for a vectored write (net.Buffers). A
// REPLICATE's entries of at least DirectEntryBytesMin are pieces of their
// own: a leader sending the same large entries to each follower then
// never copies them into a frame buffer per follower. Everything else is
// encoded into scratch (appended to, never overwritten: the pieces
// already taken from it stay valid when it grows), which it returns for
// the next call. The entries' data must not change until the pieces are
// written.
func AppendFramePieces(pieces [][]byte, scratch []byte, corr uint64, f Frame) ([][]byte, []byte) {
	start := len(scratch)
	r, ok := f.(*Replicate)
	if !ok || len(r.Entries) == 0 {
		scratch = AppendFrame(scratch, corr, f)
		return append(pieces, scratch[start:len(scratch):len(scratch)]), scratch
	}
	b := appendFrameHead(scratch, f.Type(), corr)
	b = r.appendHead(b)
	n := len(b) - start - frameHeaderBytes + 4 // the CRC
	for i := range r.Entries {
		n += replicaEntryFixedBytes + len(r.Entries[i].Data)
	}
	binary.BigEndian.PutUint32(b[start:], uint32(n))
	crc := crc32.Update(0, castagnoli, b[start+frameHeaderBytes:])
	from := len(b) // b[from:] is neither in crc nor in pieces yet
	for i := range r.Entries {
		e := &r.Entries[i]
		b = e.appendHead(b)
		if len(e.Data) < DirectEntryBytesMin {
			b = append(b, e.Data...)
			continue
		}
		pieces = append(pieces, b[start:len(b):len(b)], e.Data)
		crc = crc32.Update(crc32.Update(crc, castagnoli, b[from:]), castagnoli, e.Data)
		start, from = len(b), len(b)
	}
	crc = crc32.Update(crc, castagnoli, b[from:])
	b = binary.BigEndian.AppendUint32(b, crc)
	return append(pieces, b[start:len(b):len(b)]), b
}

// DirectEntryBytesMin is the size from which AppendFramePieces leaves an
// entry's data in its own slice instead of copying it into its scratch
// buffer: below it a copy costs less than a checksum call and an iovec of
// its own.
const DirectEntryBytesMin = 16 << 10

// ReadFrame reads one frame from r. frameBytesMax bounds the length field
// before any allocation. The returned frame may alias a fresh buffer owned by
// the caller; nothing is retained by this package.
func ReadFrame(r io.Reader, frameBytesMax int) (corr uint64, f Frame, err error) {
	corr, f, _, err = ReadFrameInto(r, frameBytesMax, nil)
	return corr, f, err
}

// ReadFrameInto is ReadFrame reading the frame into buf when its capacity
// suffices, else into a fresh buffer. It returns the buffer used (nil if the
// length was refused before any read into it): the frame aliases it, so it
// may be reused only once the frame is no longer needed.
func ReadFrameInto(r io.Reader, frameBytesMax int, buf []byte) (corr uint64, f Frame, used []byte, err error) {
	var lenBuf [frameHeaderBytes]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return 0, nil, nil, err
	}
	n := binary.BigEndian.Uint32(lenBuf[:])
	if int64(n) > int64(frameBytesMax) {
		return oversizedCorr(r), nil, nil, Errorf(CodeFrameTooLarge, "frame of %d bytes exceeds %d", n, frameBytesMax)
	}
	if n < frameFixedBytes {
		return 0, nil, nil, Errorf(CodeBadFrame, "frame of %d bytes is shorter than its header", n)
	}
	if uint64(cap(buf)) >= uint64(n) {
		buf = buf[:n]
	} else {
		buf = make([]byte, n)
	}
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, buf, err
	}
	corr, f, err = DecodeFrame(buf)
	return corr, f, buf, err
}

// oversizedCorr is the corr of a frame refused for its size, so the ERR
// names the request it refuses: read from the type and corr bytes after
// the length prefix when r already holds them (a buffered reader; a
// client writes a frame's head at once), never waiting for more. It is
// not verified (the checksum ends the body, which is not read); 0 when
// the bytes are not there.
func oversizedCorr(r io.Reader) uint64 {
	b, ok := r.(interface {
		Buffered() int
		Peek(n int) ([]byte, error)
	})
	if !ok || b.Buffered() < 9 {
		return 0
	}
	head, err := b.Peek(9)
	if err != nil {
		return 0
	}
	return binary.BigEndian.Uint64(head[1:9])
}

// DecodeFrame decodes a frame without its length prefix (type, corr, body,
// crc). Byte fields of the result alias b.
func DecodeFrame(b []byte) (corr uint64, f Frame, err error) {
	if len(b) < frameFixedBytes {
		return 0, nil, Errorf(CodeBadFrame, "frame of %d bytes is shorter than its header", len(b))
	}
	payload, crcBytes := b[:len(b)-4], b[len(b)-4:]
	if crc32.Checksum(payload, castagnoli) != binary.BigEndian.Uint32(crcBytes) {
		return 0, nil, Errorf(CodeBadFrame, "frame checksum mismatch")
	}
	t := FrameType(payload[0])
	corr = binary.BigEndian.Uint64(payload[1:9])
	f = newFrame(t)
	if f == nil {
		return corr, nil, Errorf(CodeBadFrame, "unknown frame type %d", uint8(t))
	}
	if derr := decodeBody(f, payload[9:]); derr != nil {
		return corr, nil, Errorf(CodeBadFrame, "%s: %s", t, derr.Message)
	}
	return corr, f, nil
}

// decodeBody decodes f's body from b. The frames of the publish and
// delivery paths are called by their type so that the decoder stays on the
// stack: through the Frame interface it escapes, one allocation per frame.
func decodeBody(f Frame, b []byte) *Error {
	d := decoder{b: b}
	switch f := f.(type) {
	case *Pub:
		f.decodeBody(&d)
	case *PubOK:
		f.decodeBody(&d)
	case *Msg:
		f.decodeBody(&d)
	default:
		hd := &decoder{b: b}
		f.decodeBody(hd)
		return hd.finish()
	}
	return d.finish()
}

// finish reports the decoder's first error, or trailing bytes.
func (d *decoder) finish() *Error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return d.err
}

// decoder reads fields from a body, remembering the first error so decode
// methods can be written straight through.
type decoder struct {
	b   []byte
	err *Error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = Errorf(CodeBadFrame, format, args...)
	}
	d.b = nil
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail("field of %d bytes overruns the frame", n)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if v := d.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) boolean() bool {
	switch d.u8() {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail("boolean out of range")
		return false
	}
}

func (d *decoder) bytes() []byte {
	n := d.u32()
	if d.err != nil {
		return nil
	}
	if n == 0 {
		return nil
	}
	return d.take(int(n))
}

func (d *decoder) str() string {
	n := d.u16()
	v := d.take(int(n))
	if d.err != nil {
		return ""
	}
	if !utf8.Valid(v) {
		d.fail("string is not UTF-8")
		return ""
	}
	return string(v)
}

// listLen reads a u32 list length and checks it against the bound and against
// the bytes left (each element takes at least elemBytesMin), so a tiny frame
// cannot make the decoder allocate a huge slice.
func (d *decoder) listLen(elemBytesMin int) int {
	n := d.u32()
	if d.err != nil {
		return 0
	}
	if n > listLenMax || int(n)*elemBytesMin > len(d.b) {
		d.fail("list of %d elements cannot fit the frame", n)
		return 0
	}
	return int(n)
}

func appendBytes(b, v []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// appendStr writes s, cut at a rune boundary to the u16 bound so an over-long
// message can never corrupt the frame.
func appendStr(b []byte, s string) []byte {
	if len(s) > 0xFFFF {
		cut := 0xFFFF
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}
