package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// pprofOverlaySource is the file the -profile build adds to ../cmd/nereus.
//
//go:embed pprof_overlay.go.txt
var pprofOverlaySource []byte

// pprofOverlayTarget is where the overlay file appears in the main module.
const pprofOverlayTarget = "../cmd/nereus/zz_bench_pprof.go"

// writePprofOverlay writes the overlay file and the `go build -overlay`
// description of it into dir and returns the description's path.
func writePprofOverlay(dir string) (string, error) {
	src := filepath.Join(dir, "zz_bench_pprof.go")
	if err := os.WriteFile(src, pprofOverlaySource, 0o644); err != nil {
		return "", err
	}
	target, err := filepath.Abs(pprofOverlayTarget)
	if err != nil {
		return "", err
	}
	desc, err := json.Marshal(map[string]map[string]string{"Replace": {target: src}})
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "pprof-overlay.json")
	return path, os.WriteFile(path, desc, 0o644)
}

// profileFetchSlack bounds a profile download beyond its own duration.
const profileFetchSlack = 10 * time.Second

// leaderProfiler is a system that can profile the processes serving a stream.
type leaderProfiler interface {
	// profileLeader starts a CPU profile of d of every process of the
	// system — the one that leads stream and each follower — and records
	// their allocation counters, and returns a function that waits for the
	// profiles and writes, per process, prefix-ROLE-cpu.pprof,
	// prefix-ROLE-allocs-before.pprof and prefix-ROLE-allocs-after.pprof,
	// ROLE being "leader" or "follower-NAME" (the allocations of the case
	// are after minus before: go tool pprof -base).
	profileLeader(ctx context.Context, stream string, d time.Duration, prefix string) (finish func() error, err error)
	// profileBucketLeader is profileLeader for a KV bucket: its leader's
	// process is the "leader".
	profileBucketLeader(ctx context.Context, bucket string, d time.Duration, prefix string) (finish func() error, err error)
}

// profileLeader implements leaderProfiler for child processes built with
// the pprof overlay; for an in-process node it profiles nothing.
func (s *nereusSystem) profileLeader(ctx context.Context, stream string, d time.Duration, prefix string) (func() error, error) {
	p, err := s.leaderOf(ctx, stream)
	if err != nil {
		return func() error { return nil }, err
	}
	return s.profileAll(ctx, p.Leader, d, prefix)
}

func (s *nereusSystem) profileBucketLeader(ctx context.Context, bucket string, d time.Duration, prefix string) (func() error, error) {
	info, err := s.admin.Bucket(ctx, bucket)
	if err != nil {
		return func() error { return nil }, err
	}
	return s.profileAll(ctx, info.Leader, d, prefix)
}

// profileAll profiles every child process, naming the one called leader
// so (see leaderProfiler).
func (s *nereusSystem) profileAll(ctx context.Context, leader string, d time.Duration, prefix string) (func() error, error) {
	var finishes []func() error
	finish := func() error {
		var errs []error
		for _, f := range finishes {
			errs = append(errs, f())
		}
		return errors.Join(errs...)
	}
	for _, np := range s.procs {
		if np.pprofAddr == "" {
			continue
		}
		role := "follower-" + np.name
		if np.name == leader {
			role = "leader"
		}
		f, err := profileProcess(ctx, "http://"+np.pprofAddr+"/debug/pprof/", d, prefix+"-"+role)
		if err != nil {
			return finish, err
		}
		finishes = append(finishes, f)
	}
	return finish, nil
}

// profileProcess starts a CPU profile of d of the process serving pprof at
// base and returns a function that waits for it and records the
// allocation counters after (see leaderProfiler).
func profileProcess(ctx context.Context, base string, d time.Duration, prefix string) (func() error, error) {
	if err := fetchProfile(ctx, base+"allocs", prefix+"-allocs-before.pprof", 0); err != nil {
		return func() error { return nil }, err
	}
	seconds := int(math.Ceil(d.Seconds()))
	cpu := make(chan error, 1)
	go func() {
		cpu <- fetchProfile(ctx, fmt.Sprintf("%sprofile?seconds=%d", base, seconds), prefix+"-cpu.pprof", time.Duration(seconds)*time.Second)
	}()
	return func() error {
		err := <-cpu
		return errors.Join(err, fetchProfile(ctx, base+"allocs", prefix+"-allocs-after.pprof", 0))
	}, nil
}

// fetchProfile downloads a pprof endpoint that takes d to answer into path.
func fetchProfile(ctx context.Context, url, path string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d+profileFetchSlack)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("profile %s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}
