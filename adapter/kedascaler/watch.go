package kedascaler

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// watches are StreamIsActive's polls: one per distinct (namespace,
// selector), which the streams asking of it share, running while any
// does. It is also the collector of the streams and polls open.
type watches struct {
	poll   time.Duration
	active func(context.Context, Trigger) (bool, error)

	mu    sync.Mutex
	byKey map[string]*watch
}

// watch is one poll and what it saw last; its fields are under
// watches.mu.
type watch struct {
	key     string
	streams int
	cancel  context.CancelFunc
	// result or err is the last answer; version counts the changes (0:
	// none yet), and changed is closed and replaced at each.
	result  bool
	err     error
	version uint64
	changed chan struct{}
}

// join is t's watch, started if none runs; leave it when done.
func (ws *watches) join(t Trigger) *watch {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.byKey[t.key()]
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &watch{key: t.key(), cancel: cancel, changed: make(chan struct{})}
		ws.byKey[w.key] = w
		go ws.run(ctx, w, t)
	}
	w.streams++
	return w
}

// leave ends a stream's interest in w; the last one stops its poll.
func (ws *watches) leave(w *watch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w.streams--
	if w.streams == 0 {
		w.cancel()
		if ws.byKey[w.key] == w {
			delete(ws.byKey, w.key)
		}
	}
}

// run polls t's activity until ctx ends or the poll fails.
func (ws *watches) run(ctx context.Context, w *watch, t Trigger) {
	tick := time.NewTicker(ws.poll)
	defer tick.Stop()
	for {
		active, err := ws.active(ctx, t)
		if ctx.Err() != nil {
			return
		}
		ws.publish(w, active, err)
		if err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// publish records a poll's answer if it changed. A failed watch ends: its
// streams end with the error, and the next stream to join starts another.
func (ws *watches) publish(w *watch, active bool, err error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if err == nil && w.version > 0 && active == w.result {
		return
	}
	w.result, w.err = active, err
	w.version++
	close(w.changed)
	w.changed = make(chan struct{})
	if err != nil && ws.byKey[w.key] == w {
		delete(ws.byKey, w.key)
	}
}

// next waits for w's answer newer than version seen and returns it with
// its version, or the error that ends the stream: the poll's, ctx's, or
// errStopping once stopping is closed.
func (ws *watches) next(ctx context.Context, stopping <-chan struct{}, w *watch, seen uint64) (bool, uint64, error) {
	for {
		ws.mu.Lock()
		if w.version > seen {
			active, version, err := w.result, w.version, w.err
			ws.mu.Unlock()
			return active, version, err
		}
		changed := w.changed
		ws.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return false, seen, ctx.Err()
		case <-stopping:
			return false, seen, errStopping
		}
	}
}

// Describe implements prometheus.Collector.
func (ws *watches) Describe(ch chan<- *prometheus.Desc) {
	ch <- streamsOpen.Desc()
	ch <- pollsRunning.Desc()
}

// Collect implements prometheus.Collector: the streams and polls open,
// from one look at the watches.
func (ws *watches) Collect(ch chan<- prometheus.Metric) {
	ws.mu.Lock()
	streams, polls := 0, len(ws.byKey)
	for _, w := range ws.byKey {
		streams += w.streams
	}
	ws.mu.Unlock()
	ch <- streamsOpen.Metric(float64(streams))
	ch <- pollsRunning.Metric(float64(polls))
}
