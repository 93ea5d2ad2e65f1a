package migration

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// NBD client trace events of QEMU 7.2 (-trace nbd_send_request,
// nbd_receive_*), as its log backend prints them.
var (
	traceRequest = regexp.MustCompile(`nbd_send_request .*\.handle = (\d+), .*\.type = \d+ \((\w+)\)`)
	traceSimple  = regexp.MustCompile(`nbd_receive_simple_reply .*\.error = (\d+) .*handle = (\d+)`)
	traceChunk   = regexp.MustCompile(`nbd_receive_structured_reply_chunk .*flags = (0x[0-9a-f]+), type = (\d+) .*handle = (\d+)`)
)

// nbdTraceSummary counts what checkNBDTrace saw.
type nbdTraceSummary struct {
	Requests, Replies, Writes, Flushes int
}

// checkNBDTrace reads the trace log of one QEMU and checks what its NBD
// client saw of the server: every reply answers a request outstanding under
// its handle, no reply carries an error, and once the source began saving
// its final device state (savevm_state_complete_precopy, after its last
// FLUSH) it sent nothing but FLUSH and DISC: no write after inactivation.
func checkNBDTrace(path string) (nbdTraceSummary, error) {
	var s nbdTraceSummary
	f, err := os.Open(path)
	if err != nil {
		return s, err
	}
	defer f.Close()
	outstanding := map[string]string{} // handle -> command
	final := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if m := traceRequest.FindStringSubmatch(text); m != nil {
			handle, cmd := m[1], m[2]
			s.Requests++
			switch cmd {
			case "write":
				s.Writes++
			case "flush":
				s.Flushes++
			}
			if final && cmd != "flush" && cmd != "disconnect" {
				return s, fmt.Errorf("%s:%d: %s sent after the final device state was saved", path, line, cmd)
			}
			if cmd == "disconnect" {
				continue
			}
			if prev, ok := outstanding[handle]; ok {
				return s, fmt.Errorf("%s:%d: handle %s reused while its %s is outstanding", path, line, handle, prev)
			}
			outstanding[handle] = cmd
			continue
		}
		handle, failed := "", false
		if m := traceSimple.FindStringSubmatch(text); m != nil {
			handle, failed = m[2], m[1] != "0"
		} else if m := traceChunk.FindStringSubmatch(text); m != nil {
			flags, _ := strconv.ParseUint(m[1], 0, 16)
			typ, _ := strconv.Atoi(m[2])
			if flags&1 == 0 { // not the last chunk of its reply
				continue
			}
			handle, failed = m[3], typ >= 1<<15
		} else {
			if strings.Contains(text, "savevm_state_complete_precopy") {
				final = true
			}
			continue
		}
		s.Replies++
		if failed {
			return s, fmt.Errorf("%s:%d: error reply: %s", path, line, text)
		}
		if _, ok := outstanding[handle]; !ok {
			return s, fmt.Errorf("%s:%d: reply to handle %s, which has no request outstanding", path, line, handle)
		}
		delete(outstanding, handle)
	}
	return s, sc.Err()
}
