package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestEncryptedVerdict checks the encrypted section of the report on
// figures whose ratios are known: encrypted over plain, of the medians, each
// goal judged on its own.
func TestEncryptedVerdict(t *testing.T) {
	// kind transport rw bs qd iops bw requests cpu switches p50 p99 client-cpu mean hop-cpu
	rs := results(t,
		"quiver\tunix\trandread\t4k\t32\t80000\t0\t800000\t10.0\t100000\t380.0\t900.0\t2.0\t400.0\t0",
		"encrypted\tunix\trandread\t4k\t32\t76000\t0\t760000\t10.26\t100000\t390.0\t990.0\t2.0\t420.0\t0",
		"quiver\tunix\trandwrite\t4k\t32\t60000\t0\t600000\t9.0\t300000\t500.0\t1500.0\t11.0\t510.0\t0",
		"encrypted\tunix\trandwrite\t4k\t32\t50000\t0\t500000\t9.0\t300000\t600.0\t1800.0\t12.0\t612.0\t0",
		// 1 MiB reads: 10000 MiB in 5 s of CPU is 2097 MB/cpu-s; in 20 s, 524
		"quiver\tunix\tread\t1m\t8\t1000\t1048576000\t10000\t5.0\t2000\t8000.0\t9000.0\t1.5\t8000.0\t0",
		"encrypted\tunix\tread\t1m\t8\t500\t524288000\t10000\t20.0\t2000\t16000.0\t18000.0\t1.5\t16000.0\t0",
		"quiver\tunix\trandread\t4k\t1\t20000\t0\t200000\t2.0\t100000\t38.0\t100.0\t2.0\t40.0\t0",
	)
	var out bytes.Buffer
	rs.encrypted(&out)
	got := out.String()
	for _, want := range []string{
		"| randread 4k QD32 | unix | 80000 | 76000 | 0.95x | 400.0 | 420.0 | 1.05x | 900.0 | 990.0 | 1.10x | 12.5 | 13.5 | 1.08x | +1.0 | met |",
		"| randwrite 4k QD32 | unix | 60000 | 50000 | 0.83x | 510.0 | 612.0 | 1.20x | 1500.0 | 1800.0 | 1.20x | 15.0 | 18.0 | 1.20x | +3.0 | MISSED |",
		"| read 1m QD8 | unix | 2097 | 524 | 0.25x | MISSED |",
		"Verdict (encrypted): 2 of 3 goals MISSED: randwrite 4k QD32 unix CPU, read 1m QD8 unix MB/cpu-s.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "randread 4k QD1 ") {
		t.Errorf("the report judges a case without encrypted runs:\n%s", got)
	}
	var none bytes.Buffer
	results(t, "quiver\tunix\trandread\t4k\t1\t20000\t0\t200000\t2.0\t100000\t38.0\t100.0\t2.0\t40.0\t0").encrypted(&none)
	if none.Len() != 0 {
		t.Errorf("plain runs alone print an encrypted section:\n%s", none.String())
	}
}
