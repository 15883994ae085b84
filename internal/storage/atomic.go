package storage

import (
	"bytes"
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

// CopySuffix names the second copy WriteFileTwice keeps beside a file.
const CopySuffix = ".copy"

// WriteFileTwice writes data to path, then to path+CopySuffix, each with
// WriteFileAtomic: redundant copies of small critical state (as
// TigerBeetle keeps its superblock's), so that a bit flip in one leaves
// the other. After a crash between the two writes the copy is one write
// older than path.
func WriteFileTwice(fsys vfs.FS, path string, data []byte) error {
	if err := WriteFileAtomic(fsys, path, data); err != nil {
		return err
	}
	return WriteFileAtomic(fsys, path+CopySuffix, data)
}

// ReadFileEither returns the data WriteFileTwice stored at path: path's
// when it verifies, else its copy's. damaged, when not nil, says what to
// write both again for: a copy that did not verify (path's, when the copy
// stood in for it) or one older than path (a crash between the writes).
// The error, when neither serves, is path's (matching fs.ErrNotExist when
// neither exists, ErrCorrupt when one is damaged and the other missing or
// damaged too).
func ReadFileEither(fsys vfs.FS, path string) (data []byte, damaged, err error) {
	data, err = ReadFileAtomic(fsys, path)
	if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	copyData, copyErr := ReadFileAtomic(fsys, path+CopySuffix)
	switch {
	case err == nil && copyErr == nil && !bytes.Equal(data, copyData):
		return data, fmt.Errorf("storage: %s%s is older than %s", path, CopySuffix, path), nil
	case err == nil && errors.Is(copyErr, ErrCorrupt):
		return data, copyErr, nil
	case err == nil:
		return data, nil, nil // the copy verifies, or was not written yet
	case copyErr == nil && errors.Is(err, ErrCorrupt):
		return copyData, err, nil
	case copyErr == nil:
		return copyData, nil, nil // path not written yet, or removed: the copy is all there is
	case errors.Is(err, fs.ErrNotExist) && !errors.Is(copyErr, fs.ErrNotExist):
		return nil, nil, copyErr
	}
	return nil, nil, err
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
