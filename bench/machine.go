package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// machineInfo describes where a run happened; it is written to latest.json
// and latest.md.
type machineInfo struct {
	Date      string `json:"date"` // RFC 3339, UTC
	NumCPU    int    `json:"nproc"`
	GoVersion string `json:"go_version"`
	GOOS      string `json:"goos"`
	GOARCH    string `json:"goarch"`
	CPUModel  string `json:"cpu_model,omitempty"`
	Kernel    string `json:"kernel,omitempty"`
	// DataDir holds both brokers' data; DataFS is its file system type,
	// which decides what an fsync costs (tmpfs makes it free).
	DataDir string `json:"data_dir"`
	DataFS  string `json:"data_fs,omitempty"`
	// NereusCommit is the commit of the tree Nereus was built from, with
	// "+dirty" when files outside bench/ differ from it: the harness builds
	// ../cmd/nereus from the working tree, uncommitted changes included.
	NereusCommit string `json:"nereus_commit,omitempty"`
}

// gitTimeout bounds each read-only git command.
const gitTimeout = 10 * time.Second

// nereusCommit describes the working tree above bench/ with read-only git
// commands ("" when git or the repository is not there).
func nereusCommit(ctx context.Context) string {
	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, gitTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "git", append([]string{"--no-optional-locks", "-C", ".."}, args...)...)
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	commit, err := run("rev-parse", "--short=12", "HEAD")
	if err != nil || commit == "" {
		return ""
	}
	if changes, err := run("status", "--porcelain", "--", ".", ":(exclude)bench"); err == nil && changes != "" {
		commit += "+dirty"
	}
	return commit
}

// collectMachineInfo gathers what it can; the Linux-only fields stay empty
// elsewhere.
func collectMachineInfo(now time.Time, dataDir string) machineInfo {
	m := machineInfo{
		Date:      now.UTC().Format(time.RFC3339),
		NumCPU:    runtime.NumCPU(),
		GoVersion: runtime.Version(),
		GOOS:      runtime.GOOS,
		GOARCH:    runtime.GOARCH,
		DataDir:   dataDir,
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/mounts"); err == nil {
		m.DataFS = fsTypeOf(string(b), dataDir)
	}
	return m
}

// fsTypeOf returns the type of the mount in mounts (the text of
// /proc/mounts) that holds path: the one with the longest matching mount point.
func fsTypeOf(mounts, path string) string {
	path = filepath.Clean(path)
	best, bestType := -1, ""
	for _, line := range strings.Split(mounts, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 {
			continue
		}
		mountPoint := fields[1]
		inside := path == mountPoint || mountPoint == "/" ||
			strings.HasPrefix(path, strings.TrimSuffix(mountPoint, "/")+"/")
		if inside && len(mountPoint) > best {
			best, bestType = len(mountPoint), fields[2]
		}
	}
	return bestType
}
