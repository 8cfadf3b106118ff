// Command informer-bench is the client-go reference for benchmarks/informer_bench.py:
// one pod SharedInformer from client-go's SharedInformerFactory against the
// given kubeconfig, timed from the factory's creation until its one event
// handler has returned from its last initial add (once the handler
// registration's HasSynced is true, polled every millisecond), as the
// Python side times its handler.
//
// Everything is client-go's default at v0.37.2: no transform (managedFields
// are kept), WatchList on (the WatchListClient feature gate is on by default
// since v0.35), and protobuf on the wire: rest.Config's ContentType is unset,
// and the generated clients of built-in types ask for protobuf when it is
// (gentype.PrefersProtobuf, Request.UseProtobufAsDefault). With -json the
// config names application/json, which the generated clients keep, so the
// pods come as JSON, as they do to the Python side. Run it with
// KUBE_FEATURE_WatchListClient=false for client-go's paginated list instead.
//
// It prints one JSON object: sync seconds (and when the poll saw HasSynced,
// within a millisecond after), CPU seconds of the process during
// the sync, peak RSS, the RSS held for the cache after a GC (heap and RSS,
// per cached pod), whether WatchList was on, and the content types the
// server answered the pod requests with (seen on the wire, not assumed).
// With -resource resourceslices it does the same for resource.k8s.io/v1
// ResourceSlices instead of pods.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func peakRSSBytes() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return ru.Maxrss * 1024 // KiB on Linux
}

func rssBytes() int64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		panic(err)
	}
	pages, err := strconv.ParseInt(strings.Fields(string(data))[1], 10, 64)
	if err != nil {
		panic(err)
	}
	return pages * int64(os.Getpagesize())
}

// settle runs the collector and gives freed memory back to the OS, so RSS
// shows what is held (as the Python side measures after gc.collect()).
func settle() (heapBytes uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// contentTypes records the Content-Type of every answer to a pod request.
type contentTypes struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen map[string]bool
	// The collection path's last segment of the resource watched.
	suffix string
}

func (c *contentTypes) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err == nil && strings.HasSuffix(req.URL.Path, c.suffix) {
		c.mu.Lock()
		c.seen[resp.Header.Get("Content-Type")] = true
		c.mu.Unlock()
	}
	return resp, err
}

func (c *contentTypes) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = map[string]bool{}
}

func (c *contentTypes) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.seen))
	for t := range c.seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster to sync from")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up after this long")
	asJSON := flag.Bool("json", false, "ask for JSON (rest.Config ContentType application/json) instead of client-go's default protobuf")
	resource := flag.String("resource", "pods", "what to inform on: pods, or resourceslices (resource.k8s.io/v1)")
	flag.Parse()
	if *resource != "pods" && *resource != "resourceslices" {
		fail("-resource: pods or resourceslices, not %q", *resource)
	}
	if *kubeconfig == "" {
		fail("-kubeconfig is required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	if *asJSON {
		config.ContentType = "application/json"
	}
	seen := &contentTypes{seen: map[string]bool{}, suffix: "/" + *resource}
	config.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		seen.next = rt
		return seen
	})
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail("client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	// One tiny request first, so the TLS setup and the connection are not
	// counted as memory held by the cached pods (as the Python side does).
	if *resource == "resourceslices" {
		if _, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			fail("warm-up list: %v", err)
		}
	} else if _, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		fail("warm-up list: %v", err)
	}
	seen.reset() // the informer's requests only
	baseHeap := settle()
	baseRSS := rssBytes()

	cpu0, t0 := cpuSeconds(), time.Now()
	factory := informers.NewSharedInformerFactory(client, 0)
	var informer cache.SharedIndexInformer
	if *resource == "resourceslices" {
		informer = factory.Resource().V1().ResourceSlices().Informer()
	} else {
		informer = factory.Core().V1().Pods().Informer()
	}
	var adds atomic.Int64
	// When the handler last returned from an add, in nanoseconds since t0.
	var lastAdd atomic.Int64
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			switch obj.(type) {
			case *corev1.Pod, *resourcev1.ResourceSlice:
				adds.Add(1)
			}
			lastAdd.Store(int64(time.Since(t0)))
		},
	})
	if err != nil {
		fail("handler: %v", err)
	}
	factory.Start(ctx.Done())
	// Not cache.WaitForCacheSync: it polls every 100 ms, which rounds the
	// sync up to the next tenth of a second. The registration's HasSynced
	// turns true when the handler has returned from the last initial add;
	// polled every millisecond, and the sync ends at that add, timed in
	// the handler, as the Python side times it.
	for !reg.HasSynced() {
		select {
		case <-ctx.Done():
			fail("the informer did not sync within %s", *timeout)
		case <-time.After(time.Millisecond):
		}
	}
	sawSynced, cpu := time.Since(t0).Seconds(), cpuSeconds()-cpu0
	elapsed := time.Duration(lastAdd.Load()).Seconds()
	types := seen.list()
	peak := peakRSSBytes()
	n := len(informer.GetStore().ListKeys())
	heap := settle()
	held := rssBytes() - baseRSS

	out := map[string]any{
		"sync_s":                elapsed,
		"synced_seen_s":         sawSynced,
		"cpu_s":                 cpu,
		"peak_rss":              peak,
		"objects":               n,
		"handler_adds":          adds.Load(),
		"bytes_per_object":      float64(held) / float64(n),
		"heap_bytes_per_object": float64(heap-baseHeap) / float64(n),
		"watch_list":            clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient),
		"content_types":         types,
		"go":                    runtime.Version(),
		"gomaxprocs":            runtime.GOMAXPROCS(0),
	}
	cancel()
	factory.Shutdown()
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("%v", err)
	}
}
