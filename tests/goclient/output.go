package main

import (
	"encoding/json"
	"io"
	"os"
	"sync"
	"sync/atomic"
)

// emitter writes one JSON object per line, each with a single Write on an
// unbuffered file, so a reader sees whole lines as soon as they happen.
type emitter struct {
	mu      sync.Mutex
	w       io.Writer
	closing atomic.Bool // set when the final digest starts: no more events
}

func newEmitter(w io.Writer) *emitter { return &emitter{w: w} }

func (e *emitter) emit(v interface{}) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"kind": "error", "message": "marshal: " + err.Error()})
	}
	b = append(b, '\n')
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.w.Write(b); err != nil {
		// Reader is gone (broken pipe): nothing sensible left to do.
		os.Exit(1)
	}
}

type startLine struct {
	Kind          string   `json:"kind"`
	WatchList     bool     `json:"watchList"`
	Mode          string   `json:"mode"`
	Resources     []string `json:"resources"`
	LabelSelector string   `json:"labelSelector,omitempty"`
	Protobuf      bool     `json:"protobuf,omitempty"`
	JSON          bool     `json:"json,omitempty"`
	ObjectDigest  bool     `json:"objectDigest,omitempty"`
}

type syncedLine struct {
	Kind      string `json:"kind"`
	Resource  string `json:"resource"`
	Count     int    `json:"count"`
	ElapsedMs int64  `json:"elapsedMs"`
}

type eventLine struct {
	Kind      string `json:"kind"`
	Resource  string `json:"resource"`
	Type      string `json:"type"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	RV        string `json:"rv"`
	Initial   bool   `json:"initial"`
	Tombstone bool   `json:"tombstone,omitempty"`
}

type kindLine struct {
	Kind    string `json:"kind"`
	Message string `json:"message,omitempty"`
}
