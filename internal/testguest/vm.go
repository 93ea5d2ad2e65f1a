package testguest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// VM is a running QEMU of a test guest: the process, reaped by a goroutine
// of its own, and the file its serial console writes to.
type VM struct {
	Cmd     *exec.Cmd
	Console string // the serial console's file (QEMUArgs' console)
	QMP     *QMP   // QEMU's QMP, once DialQMP has connected it

	exited chan struct{}
	werr   error // Cmd.Wait's result, set before exited is closed
}

// StartVM starts cmd, a QEMU (or a command that execs one, such as ip netns
// exec) whose serial console goes to the file console. The caller sets
// cmd's output; StartVM makes QEMU die with the test binary (Pdeathsig
// SIGKILL) and reaps it when it exits. Stop it with Kill.
func StartVM(cmd *exec.Cmd, console string) (*VM, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start QEMU: %w", err)
	}
	v := &VM{Cmd: cmd, Console: console, exited: make(chan struct{})}
	go func() {
		v.werr = cmd.Wait()
		close(v.exited)
	}()
	return v, nil
}

// Exited is closed once QEMU has exited and been reaped.
func (v *VM) Exited() <-chan struct{} { return v.exited }

// Err is QEMU's exit (exec.Cmd.Wait's error); valid once Exited is closed.
func (v *VM) Err() error { return v.werr }

// Running reports whether QEMU has not exited yet.
func (v *VM) Running() bool {
	select {
	case <-v.exited:
		return false
	default:
		return true
	}
}

// Kill ends QEMU with SIGKILL, unless it has exited, and waits until it is
// reaped.
func (v *VM) Kill() {
	if v.Running() {
		_ = v.Cmd.Process.Kill()
	}
	<-v.exited
}

// DialQMP connects v.QMP to QEMU's QMP socket at path (Machine.QMP),
// giving QEMU 10 s at most to create it.
func (v *VM) DialQMP(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q, err := DialQMP(ctx, path)
	if err != nil {
		return err
	}
	v.QMP = q
	return nil
}

// Shutdown ends QEMU, unless it has exited, and closes QMP: it asks QEMU
// to quit through QMP and kills it (SIGKILL) if it has not exited 10 s
// later; without QMP it kills it at once. It is for a test's cleanup, which
// must end QEMU whatever state it is in; Quit is the check that QEMU ends
// well.
func (v *VM) Shutdown() {
	if v.Running() && v.QMP != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = v.QMP.Execute(ctx, "quit", nil, nil)
		cancel()
		select {
		case <-v.exited:
		case <-time.After(10 * time.Second):
		}
	}
	v.Kill()
	if v.QMP != nil {
		_ = v.QMP.Close()
	}
}

// Quit asks QEMU to quit through QMP (it flushes its disks first) and
// fails unless QEMU exits with status 0 within 20 s.
func (v *VM) Quit(ctx context.Context) error {
	if v.QMP == nil {
		return errors.New("QMP quit: QMP is not connected")
	}
	if err := v.QMP.Execute(ctx, "quit", nil, nil); err != nil {
		return err
	}
	select {
	case <-v.exited:
		if v.werr != nil {
			return fmt.Errorf("QEMU exited with %v after quit", v.werr)
		}
		return nil
	case <-time.After(20 * time.Second):
		return errors.New("QEMU still running 20 s after quit")
	}
}

// ConsoleText is everything the guest has printed on its serial console.
func (v *VM) ConsoleText() string {
	b, _ := os.ReadFile(v.Console)
	return string(b)
}

// WaitConsole waits until the console shows want. It fails when QEMU exits
// first or ctx ends.
func (v *VM) WaitConsole(ctx context.Context, want string) error {
	for !strings.Contains(v.ConsoleText(), want) {
		select {
		case <-v.exited:
			// The guest may have printed it just before the end.
			if strings.Contains(v.ConsoleText(), want) {
				return nil
			}
			return fmt.Errorf("QEMU exited (%v) before the guest printed %q", v.werr, want)
		case <-ctx.Done():
			return fmt.Errorf("the guest did not print %q: %w", want, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}
