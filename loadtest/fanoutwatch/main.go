// Command fanoutwatch runs the watch clients of loadtest/fanout.py: many JSON
// watches of one collection, each on its own HTTP/1.1 connection, recording
// every event's resourceVersion and arrival time.
//
//	fanoutwatch --server URL --path /api/v1/namespaces/NS/configmaps \
//	    [--ca FILE --cert FILE --key FILE] [--timeout-seconds N] --records FILE \
//	    --watch= --watch='tier=a' ...
//
// Each --watch is one watcher: ?watch=true&allowWatchBookmarks=true with that
// labelSelector ("" for none). A read from a watcher's socket is stamped with
// CLOCK_MONOTONIC (Python's time.monotonic(), so comparable with the driver's
// and the other client process's stamps) and every event whose line it
// completes gets that stamp. A stream that ends is resumed from the last
// resourceVersion seen (event or bookmark), as a client would, and counted.
//
// Talk on stdin and stdout, one line each:
//
//	out {"kind":"ready","open":N}  every watch has its response headers (or 120 s passed)
//	in  stop                       (or end of input) close the watches
//	out {"kind":"watcher",...}     one per --watch, in order (record below)
//	out {"kind":"done"}            the records file is written
//
// and the program exits at the end of its input, so the driver can read its
// /proc entries first. The records file holds, for each watcher in order, its
// events' resourceVersions (int64) and then their arrival times (float64
// seconds), in the machine's byte order.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// readyWait bounds the wait for every watch's response headers.
const readyWait = 120 * time.Second

// retryPause is the wait before resuming a watch that failed (not one that
// ended normally), as the Python clients did.
const retryPause = 500 * time.Millisecond

// record is one watcher's "watcher" line; its arrays go to the records file.
type record struct {
	Kind      string         `json:"kind"`
	Selector  string         `json:"selector"`
	Events    int            `json:"events"`
	Types     map[string]int `json:"types"`
	Lines     int            `json:"lines"`
	Bookmarks int            `json:"bookmarks"`
	Errors    []string       `json:"errors"`
	Ends      int            `json:"ends"`
	LastRV    string         `json:"last_rv"`

	rvs   []int64
	times []float64
}

type watcher struct {
	record
	client    *http.Client
	url       url.URL
	connected chan struct{}
	once      sync.Once
	buf       []byte // bytes read and not yet a whole line
}

// monotonic is CLOCK_MONOTONIC in seconds, the clock of Python's
// time.monotonic(). Go's monotonic reading is CLOCK_MONOTONIC on Linux, read
// through the vDSO, but counted from a base of its own: anchored once to
// clock_gettime, a stamp costs ~30 ns instead of a ~400 ns system call per read.
func monotonic() float64 {
	return anchor.seconds + time.Since(anchor.at).Seconds()
}

// anchor is one instant in both clocks: clock_gettime between two of Go's
// readings, the closest pair of 20 (one preempted in between would be off by
// the time it waited).
var anchor = func() (a struct {
	at      time.Time
	seconds float64
}) {
	best := time.Duration(-1)
	for range 20 {
		var ts unix.Timespec
		start := time.Now()
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			panic(err)
		}
		if gap := time.Since(start); best < 0 || gap < best {
			best = gap
			a.at = start.Add(gap / 2)
			a.seconds = float64(ts.Sec) + float64(ts.Nsec)/1e9
		}
	}
	return a
}()

func main() {
	server := flag.String("server", "", "base URL of warmwatch or the apiserver")
	path := flag.String("path", "", "collection path to watch")
	ca := flag.String("ca", "", "CA bundle to verify the server (TLS)")
	cert := flag.String("cert", "", "client certificate (TLS)")
	key := flag.String("key", "", "client key (TLS)")
	timeout := flag.Int("timeout-seconds", 3600, "timeoutSeconds of each watch request")
	records := flag.String("records", "", "file for the events' resourceVersions and times")
	var selectors []string
	flag.Func("watch", "one watcher with this labelSelector (\"\" for none); repeat", func(s string) error {
		selectors = append(selectors, s)
		return nil
	})
	flag.Parse()
	if *server == "" || *path == "" || *records == "" || len(selectors) == 0 {
		fatal(errors.New("--server, --path, --records and at least one --watch are required"))
	}
	tlsConfig, err := clientTLS(*ca, *cert, *key)
	if err != nil {
		fatal(err)
	}
	base, err := url.Parse(*server)
	if err != nil {
		fatal(err)
	}
	base = base.JoinPath(*path)

	watchers := make([]*watcher, len(selectors))
	for i, selector := range selectors {
		query := url.Values{
			"watch":               {"true"},
			"allowWatchBookmarks": {"true"},
			"timeoutSeconds":      {strconv.Itoa(*timeout)},
		}
		if selector != "" {
			query.Set("labelSelector", selector)
		}
		u := *base
		u.RawQuery = query.Encode()
		watchers[i] = &watcher{
			record:    record{Kind: "watcher", Selector: selector, Types: map[string]int{}, Errors: []string{}},
			client:    &http.Client{Transport: transport(tlsConfig)},
			url:       u,
			connected: make(chan struct{}),
		}
	}

	ctx, stop := context.WithCancel(context.Background())
	var running sync.WaitGroup
	for _, w := range watchers {
		running.Go(func() { w.follow(ctx) })
	}
	out := json.NewEncoder(os.Stdout)
	deadline := time.After(readyWait)
	open := 0
wait:
	for _, w := range watchers {
		select {
		case <-w.connected:
			open++
		case <-deadline:
			break wait
		}
	}
	if err := out.Encode(map[string]any{"kind": "ready", "open": open}); err != nil {
		fatal(err)
	}

	input := bufio.NewScanner(os.Stdin)
	for input.Scan() {
		if input.Text() == "stop" {
			break
		}
	}
	stop()
	running.Wait()
	if err := writeRecords(*records, watchers); err != nil {
		fatal(err)
	}
	for _, w := range watchers {
		w.Events = len(w.rvs)
		if err := out.Encode(&w.record); err != nil {
			fatal(err)
		}
	}
	if err := out.Encode(map[string]string{"kind": "done"}); err != nil {
		fatal(err)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "fanoutwatch:", err)
	os.Exit(2)
}

// clientTLS is the apiserver client's TLS (CA and client certificate), or nil
// for plain HTTP (warmwatch on loopback with --client-auth none).
func clientTLS(ca, cert, key string) (*tls.Config, error) {
	if ca == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate", ca)
	}
	config := &tls.Config{RootCAs: pool}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return config, nil
}

// transport is one watcher's own: its own connection, HTTP/1.1 only (no
// HTTP/2 multiplexing of watches on one connection), no compression.
func transport(tlsConfig *tls.Config) *http.Transport {
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	return &http.Transport{
		TLSClientConfig:    tlsConfig,
		Protocols:          protocols,
		DisableCompression: true,
		ReadBufferSize:     64 << 10,
	}
}

// follow watches until ctx ends, resuming from the last resourceVersion.
func (w *watcher) follow(ctx context.Context) {
	w.buf = make([]byte, 0, 256<<10)
	for ctx.Err() == nil {
		failed, err := w.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		w.Ends++
		if err != nil {
			w.Errors = append(w.Errors, err.Error())
		}
		if failed {
			select {
			case <-ctx.Done():
			case <-time.After(retryPause):
			}
		}
	}
}

// stream runs one watch request; failed when it was refused or broke rather
// than ended.
func (w *watcher) stream(ctx context.Context) (failed bool, err error) {
	u := w.url
	if w.LastRV != "" {
		query := u.Query()
		query.Set("resourceVersion", w.LastRV)
		u.RawQuery = query.Encode()
	}
	request, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return true, err
	}
	request.Header.Set("Accept", "application/json")
	response, err := w.client.Do(request)
	if err != nil {
		return true, err
	}
	defer func() { _ = response.Body.Close() }()
	if response.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(response.Body, 300))
		return true, fmt.Errorf("HTTP %d: %q", response.StatusCode, body)
	}
	w.once.Do(func() { close(w.connected) })
	buf := w.buf[:0]
	defer func() { w.buf = buf }()
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // a line longer than the buffer: grow it
		}
		n, err := response.Body.Read(buf[len(buf):cap(buf)])
		now := monotonic()
		scanned := len(buf)
		buf = buf[:scanned+n]
		start := 0
		for {
			end := indexNewline(buf, scanned)
			if end < 0 {
				break
			}
			w.line(buf[start:end], now)
			start, scanned = end+1, end+1
		}
		buf = buf[:copy(buf, buf[start:])]
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return true, err
		}
	}
}

func indexNewline(b []byte, from int) int {
	if i := bytes.IndexByte(b[from:], '\n'); i >= 0 {
		return from + i
	}
	return -1
}

// line records one watch line that arrived at now.
func (w *watcher) line(line []byte, now float64) {
	w.Lines++
	eventType, rv, err := decodeEvent(line)
	if err != nil {
		return // counted as a line that is not an event
	}
	switch eventType {
	case "BOOKMARK":
		w.Bookmarks++
		if rv != "" {
			w.LastRV = rv
		}
	case "ERROR":
		w.Errors = append(w.Errors, string(line[:min(len(line), 300)]))
	default:
		number, err := strconv.ParseInt(rv, 10, 64)
		if err != nil {
			return // an object without a numeric resourceVersion: not parsed
		}
		w.rvs = append(w.rvs, number)
		w.times = append(w.times, now)
		w.Types[eventType]++
		w.LastRV = rv
	}
}

func writeRecords(path string, watchers []*watcher) error {
	file, err := os.Create(path)
	if err != nil {
		return err
	}
	out := bufio.NewWriterSize(file, 1<<20)
	for _, w := range watchers {
		if err := binary.Write(out, binary.NativeEndian, w.rvs); err != nil {
			return err
		}
		if err := binary.Write(out, binary.NativeEndian, w.times); err != nil {
			return err
		}
	}
	if err := out.Flush(); err != nil {
		return err
	}
	return file.Close()
}
