package powercut

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
)

// TestCipherInTheGuest runs internal/crypt's tests on the guest's CPU (QEMU's
// "max" under TCG, as the power-cut guests run quiver): the paths the
// cipher takes there must agree with the Go path and the IEEE 1619 vectors.
// QEMU 7.2's TCG announces VAES and computes it wrong on YMM registers;
// before the self-test the wide path ran there and every encrypted volume
// of TestPowerCut read back as garbage (CI, stop 45). The wide path now
// also needs VPCLMULQDQ, which this TCG does not announce, so AES-NI runs;
// the self-test stays the guard against any path an emulator or a CPU gets
// wrong (TestSelfTestRefusesWrongPaths).
func TestCipherInTheGuest(t *testing.T) {
	for _, tool := range []string{"qemu-system-x86_64", "go"} {
		testfs.RequireTool(t, tool)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "crypt.test")
	build := exec.Command("go", "test", "-c", "-trimpath", "-o", bin, "github.com/quiverstorage/quiver/internal/crypt")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build internal/crypt's tests: %v\n%s", err, b)
	}
	testBin, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	vectors, err := os.ReadFile("../../internal/crypt/testdata/ieee1619-xts-aes256.txt")
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(dir, "initramfs.cpio")
	// The initramfs has bin/ and etc/; the tests read testdata/ from their
	// working directory.
	body := "mkdir -p /crypt/testdata && cp /etc/ieee1619-xts-aes256.txt /crypt/testdata/ && cd /crypt\n" +
		"echo \"cpu: $(grep -o -w -E 'aes|avx2|vaes' /proc/cpuinfo | sort -u | tr '\\n' ' ')\"\n" +
		"/bin/crypt.test -test.v -test.count=1 2>&1 | grep -E '^(---|PASS|FAIL|ok)|cipher path|differ|wrong'\n" +
		"echo guest: done\npoweroff -f\n"
	k, err := testguest.Build(guestKernel, initrd, body,
		testguest.File{Path: "bin/crypt.test", Mode: 0o755, Data: testBin},
		testguest.File{Path: "etc/ieee1619-xts-aes256.txt", Mode: 0o644, Data: vectors})
	if errors.Is(err, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	console := filepath.Join(dir, "console")
	machine := testguest.Machine{CPU: "max", Memory: "512M", Cmdline: "quiet no_timer_check"}
	vm, err := testguest.StartVM(exec.Command("qemu-system-x86_64", machine.Args(k, initrd, console)...), console)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Kill()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	err = vm.WaitConsole(ctx, "guest: done")
	out := vm.ConsoleText()
	if err != nil {
		t.Fatalf("the guest: %v\n%s", err, out)
	}
	t.Logf("in the guest:\n%s", out)
	if strings.Contains(out, "FAIL") || !regexp.MustCompile(`(?m)^PASS`).MatchString(out) {
		t.Fatal("internal/crypt's tests fail on the guest's CPU")
	}
	if !strings.Contains(out, "--- PASS: TestSelfTestOnThisMachine") {
		t.Fatal("the self-test's test did not run in the guest")
	}
}
