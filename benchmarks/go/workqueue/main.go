// Command workqueue-bench is the Go baseline for benchmarks/workqueue_bench.py:
// the same add -> get -> done loop on client-go's util/workqueue, one
// producer (the main goroutine) adding distinct items and N workers taking
// them, timed from the first add until every worker has seen shutdown.
// It prints one JSON object per run: {"workers": N, "items": M, "ops_per_sec": R}.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
)

func run(items, workers int) float64 {
	// No name and no provider: client-go records no metrics, like the
	// Python queue with metrics off.
	q := workqueue.NewTyped[int]()
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				item, shutdown := q.Get()
				if shutdown {
					return
				}
				q.Done(item)
			}
		}()
	}
	for i := 0; i < items; i++ {
		q.Add(i)
	}
	// Getters drain what is queued, then see shutdown.
	q.ShutDown()
	wg.Wait()
	return float64(items) / time.Since(start).Seconds()
}

func main() {
	items := flag.Int("items", 1_000_000, "distinct items added per run")
	workerList := flag.String("workers", "1,4", "comma-separated worker counts")
	repeat := flag.Int("repeat", 3, "runs per worker count")
	flag.Parse()

	enc := json.NewEncoder(os.Stdout)
	for _, field := range strings.Split(*workerList, ",") {
		workers, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || workers < 1 {
			fmt.Fprintf(os.Stderr, "bad worker count %q\n", field)
			os.Exit(2)
		}
		for r := 0; r < *repeat; r++ {
			rate := run(*items, workers)
			if err := enc.Encode(map[string]any{"workers": workers, "items": *items, "ops_per_sec": rate}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
	}
}
