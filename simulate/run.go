package simulate

import (
	"errors"
	"sync"
)

// RunAll replays every policy with every seed on workers goroutines and
// returns the results ordered by policy, then seed. progress, if set, is
// called once per finished replay (from one goroutine at a time).
func RunAll(tr *Trace, policies []string, seeds []uint64, workers int, progress func(done, total int, r Result)) ([]Result, error) {
	type job struct{ i, p, s int }
	total := len(policies) * len(seeds)
	results := make([]Result, total)
	errs := make([]error, total)
	jobs := make(chan job)
	var mu sync.Mutex
	var wg sync.WaitGroup
	done := 0
	for range max(workers, 1) {
		wg.Go(func() {
			for j := range jobs {
				results[j.i], errs[j.i] = Replay(tr, policies[j.p], seeds[j.s])
				if progress != nil && errs[j.i] == nil {
					mu.Lock()
					done++
					progress(done, total, results[j.i])
					mu.Unlock()
				}
			}
		})
	}
	for p := range policies {
		for s := range seeds {
			jobs <- job{p*len(seeds) + s, p, s}
		}
	}
	close(jobs)
	wg.Wait()
	return results, errors.Join(errs...)
}
