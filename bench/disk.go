package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// diskFileBytes is the size of the anchor's preallocated file; writes wrap
// around to its start, so every write lands inside written blocks and its
// fdatasync flushes data only, no size or extent change (as a Nereus
// segment's appends do).
const diskFileBytes = 64 << 20

// diskSystem is the raw-disk anchor: no broker, one write and fdatasync per
// publish into a preallocated file in the run's data directory. It runs
// only pub_sync (systemSpec.workloads).
type diskSystem struct{ dir string }

func startDisk(_ context.Context, _ *environment, dataDir string) (system, error) {
	return &diskSystem{dir: dataDir}, nil
}

func (d *diskSystem) CreateStream(context.Context, string) error { return nil }

func (d *diskSystem) NewPublisher(ctx context.Context, stream string, _ int) (publisher, error) {
	f, err := os.OpenFile(filepath.Join(d.dir, stream+".dat"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	// Untimed: write the zeroes and make them and the size durable.
	zeroes := make([]byte, 1<<20)
	for off := int64(0); off < diskFileBytes; off += int64(len(zeroes)) {
		if ctx.Err() != nil {
			f.Close()
			return nil, ctx.Err()
		}
		if _, err := f.WriteAt(zeroes, off); err != nil {
			f.Close()
			return nil, fmt.Errorf("preallocate %s: %w", f.Name(), err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return &diskPublisher{f: f}, nil
}

var errDiskAnchorOnly = errors.New("the disk anchor runs pub_sync only")

func (d *diskSystem) NewSubscriber(context.Context, string, string, int) (subscriber, error) {
	return nil, errDiskAnchorOnly
}

func (d *diskSystem) Close() error { return nil }

// diskPublisher writes each payload at the next offset and fdatasyncs.
type diskPublisher struct {
	f   *os.File
	off int64
}

func (p *diskPublisher) Publish(_ context.Context, payload []byte) error {
	if p.off+int64(len(payload)) > diskFileBytes {
		p.off = 0
	}
	if _, err := p.f.WriteAt(payload, p.off); err != nil {
		return err
	}
	p.off += int64(len(payload))
	return dataSync(p.f)
}

func (p *diskPublisher) PublishAsync(context.Context, []byte, func(error)) error {
	return errDiskAnchorOnly
}

func (p *diskPublisher) Flush(context.Context) error { return nil }

func (p *diskPublisher) Close() error {
	name := p.f.Name()
	err := p.f.Close()
	return errors.Join(err, os.Remove(name))
}
