package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"path/filepath"

	"github.com/nereus-broker/nereus/internal/vfs"
)

const (
	atomicFileMagic = "NAF1"
	// atomicFileHeaderBytes is magic, length u32 and crc32c u32.
	atomicFileHeaderBytes = 12
	// atomicFileBytesMax bounds the data of one atomic file.
	atomicFileBytesMax = 256 << 20
	tmpSuffix          = ".tmp"
)

// WriteFileAtomic durably replaces path with data: it writes path+".tmp"
// with a length and CRC32C header, syncs it, renames it over path and syncs
// the directory. After a crash path holds either the old or the new data.
func WriteFileAtomic(fsys vfs.FS, path string, data []byte) error {
	if len(data) > atomicFileBytesMax {
		return fmt.Errorf("storage: write %s: %d bytes exceeds %d", path, len(data), atomicFileBytesMax)
	}
	buf := make([]byte, 0, atomicFileHeaderBytes+len(data))
	buf = append(buf, atomicFileMagic...)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(data)))
	buf = binary.LittleEndian.AppendUint32(buf, crc32.Checksum(data, castagnoli))
	buf = append(buf, data...)
	tmp := path + tmpSuffix
	f, err := fsys.Create(tmp)
	if err != nil {
		return fsError("create", tmp, err)
	}
	if _, err := f.Write(buf); err != nil {
		_ = f.Close()
		return fsError("write", tmp, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("%w: %s: %w", ErrSyncFailed, tmp, err)
	}
	if err := f.Close(); err != nil {
		return fsError("close", tmp, err)
	}
	if err := fsys.Rename(tmp, path); err != nil {
		return fsError("rename", tmp, err)
	}
	if err := fsys.SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("%w: dir of %s: %w", ErrSyncFailed, path, err)
	}
	return nil
}

// ReadFileAtomic returns the data stored by WriteFileAtomic at path. A
// missing file returns an error matching fs.ErrNotExist; a bad header or
// checksum returns an error matching ErrCorrupt.
func ReadFileAtomic(fsys vfs.FS, path string) ([]byte, error) {
	f, err := fsys.Open(path)
	if err != nil {
		return nil, fmt.Errorf("storage: read %s: %w", path, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, fmt.Errorf("storage: read %s: %w", path, err)
	}
	if size < atomicFileHeaderBytes || size > atomicFileHeaderBytes+atomicFileBytesMax {
		return nil, fmt.Errorf("%w: %s: size %d", ErrCorrupt, path, size)
	}
	buf := make([]byte, size)
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("storage: read %s: %w", path, err)
	}
	if string(buf[:4]) != atomicFileMagic {
		return nil, fmt.Errorf("%w: %s: bad magic", ErrCorrupt, path)
	}
	length := binary.LittleEndian.Uint32(buf[4:])
	if int64(length) != size-atomicFileHeaderBytes {
		return nil, fmt.Errorf("%w: %s: length %d, file holds %d", ErrCorrupt, path, length, size-atomicFileHeaderBytes)
	}
	data := buf[atomicFileHeaderBytes:]
	if crc32.Checksum(data, castagnoli) != binary.LittleEndian.Uint32(buf[8:]) {
		return nil, fmt.Errorf("%w: %s: checksum mismatch", ErrCorrupt, path)
	}
	return data, nil
}

// fsError wraps an error of the file system, naming the operation and the
// file only when the error does not already (an *fs.PathError does:
// "write /a/b: no space left on device" stays one line, not two).
func fsError(op, path string, err error) error {
	if _, ok := errors.AsType[*fs.PathError](err); ok {
		return fmt.Errorf("storage: %w", err)
	}
	return fmt.Errorf("storage: %s %s: %w", op, path, err)
}
