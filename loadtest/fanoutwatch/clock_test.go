package main

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func clockGettime(t *testing.T) float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

// TestMonotonicIsClockMonotonic: the stamps are CLOCK_MONOTONIC (Python's
// time.monotonic()) within 100 µs, not merely a monotonic clock, and stay so.
func TestMonotonicIsClockMonotonic(t *testing.T) {
	time.Sleep(50 * time.Millisecond)
	for range 5 {
		before := clockGettime(t)
		stamp := monotonic()
		after := clockGettime(t)
		if stamp < before-1e-4 || stamp > after+1e-4 {
			t.Fatalf("stamp %.6f outside [%.6f, %.6f]", stamp, before, after)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
