// Package wire defines the Nereus client protocol v1: frame types, their binary
// encoding and the stable error codes. It is the only package that knows wire
// bytes; the server and the SDK exchange typed frames through it.
//
// Every frame on the connection is
//
//	length   u32  bytes that follow this field (type + correlation + body + crc)
//	type     u8   FrameType
//	corr     u64  correlation id chosen by the requester, echoed in replies
//	body     ...  type-specific fields (see each frame struct)
//	crc      u32  CRC32C (Castagnoli) of type, corr and body
//
// All integers are big-endian. Byte strings are a u32 length followed by the
// bytes; strings are a u16 length followed by UTF-8 bytes. Every length is
// bounded before anything is allocated: a frame larger than the negotiated
// maximum is FRAME_TOO_LARGE, a malformed one BAD_FRAME, and both close the
// connection.
package wire
