package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Bounds of a broker child process.
const (
	childReadyTimeout = 30 * time.Second
	childStopTimeout  = 10 * time.Second
	childLogTailBytes = 4 << 10
)

// childProc is one broker child process (`nereus serve` or nats-server).
// Its stdout and stderr go to logPath; a line for which the start's ready
// function returns true marks it ready.
type childProc struct {
	// name is the broker's node or server name (n1, n2, ...).
	name    string
	bin     string
	args    []string
	env     []string // added to the harness's environment
	ready   func(string) bool
	logPath string // the child's output, appended across restarts
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the child has exited
	// readyLine is the line that marked the child ready.
	readyLine string
}

// startChild starts bin with args, its output appended to logPath, and
// returns once a line of its output satisfies ready. The child is tracked
// by env, so it is stopped on every exit path of the run.
func startChild(ctx context.Context, env *environment, name, logPath string, ready func(string) bool, childEnv []string, bin string, args ...string) (*childProc, error) {
	p := &childProc{name: name, bin: bin, args: args, env: childEnv, ready: ready, logPath: logPath}
	env.track(p) // stopped on exit even if what follows fails
	return p, p.start(ctx)
}

// start runs the child's command (again) and waits for its ready line.
func (p *childProc) start(ctx context.Context) error {
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.SysProcAttr = childProcAttr()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logFile.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	ready := make(chan string, 1)
	var logMu sync.Mutex
	var copiers sync.WaitGroup
	scan := func(r io.Reader) {
		defer copiers.Done()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			fmt.Fprintln(logFile, line)
			logMu.Unlock()
			if p.ready(line) {
				select {
				case ready <- line:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, r)
	}
	copiers.Add(2)
	go scan(stdout)
	go scan(stderr)
	exited := p.exited
	go func() {
		copiers.Wait() // Wait closes the pipes: read them to the end first
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()

	timer := time.NewTimer(childReadyTimeout)
	defer timer.Stop()
	select {
	case p.readyLine = <-ready:
		return nil
	case <-exited:
		return fmt.Errorf("%s %s exited before it was ready:\n%s", p.bin, p.name, tailFile(p.logPath, childLogTailBytes))
	case <-timer.C:
		return fmt.Errorf("%s %s not ready after %s:\n%s", p.bin, p.name, childReadyTimeout, tailFile(p.logPath, childLogTailBytes))
	case <-ctx.Done():
		return ctx.Err()
	}
}

// kill sends SIGKILL and returns the time it was sent, once the child has
// exited: whatever it had sent before is then on the wire.
func (p *childProc) kill() (time.Time, error) {
	at := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return at, fmt.Errorf("kill -9 %s: %w", p.name, err)
	}
	timer := time.NewTimer(childStopTimeout)
	defer timer.Stop()
	select {
	case <-p.exited:
		return at, nil
	case <-timer.C:
		return at, fmt.Errorf("%s did not exit within %s of SIGKILL", p.name, childStopTimeout)
	}
}

// Close asks the child to stop (SIGTERM), and kills it if it has not exited
// within childStopTimeout. It is safe to call more than once, and on a child
// that was killed or never started.
func (p *childProc) Close() error {
	if p.cmd == nil {
		return nil
	}
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(childStopTimeout)
	defer timer.Stop()
	select {
	case <-p.exited:
		return nil
	case <-timer.C:
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %s; killed", p.name, childStopTimeout)
	}
}

// freeLoopbackAddrs returns n loopback addresses with ports the kernel
// picked and released at once, for children that must know each other's
// addresses before they start (a cluster's peers). Another process may
// take one meanwhile; the child then fails to start and says so.
func freeLoopbackAddrs(n int) ([]string, error) {
	var addrs []string
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l) // held until all are picked: n distinct ports
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// tailFile returns at most the last n bytes of a file, for error messages.
func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}

// childTracker remembers started child processes so that they are stopped
// on every exit path of the run. Safe for concurrent use.
type childTracker struct {
	mu       sync.Mutex
	children []io.Closer
}

func (t *childTracker) add(c io.Closer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.children = append(t.children, c)
}

// closeAll stops every tracked child, newest first.
func (t *childTracker) closeAll() error {
	t.mu.Lock()
	children := t.children
	t.children = nil
	t.mu.Unlock()
	var errs []error
	for i := len(children) - 1; i >= 0; i-- {
		errs = append(errs, children[i].Close())
	}
	return errors.Join(errs...)
}
