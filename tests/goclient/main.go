// Command goclient is "the existing controller" for warmwatch's end-to-end
// tests: it runs client-go (or controller-runtime) informers against a
// kubeconfig and reports, as JSON lines on stdout, every handler call, each
// informer's sync and a digest of each informer's cache.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

type options struct {
	kubeconfig    string
	context       string
	resources     stringList
	labelSelector string
	mode          string
	resync        time.Duration
	duration      time.Duration
	exitOnSync    bool
	noItems       bool
	noEvents      bool
	noDiscovery   bool
	qps           float64
	burst         int
	protobuf      bool
	json          bool
	objectDigest  bool
	// fidelity mode
	otherKubeconfig string
	otherContext    string
	rv              string
	checks          string
	timeout         time.Duration
}

var out = newEmitter(os.Stdout)

// fail reports a start-up error and exits 2.
func fail(format string, args ...interface{}) {
	out.emit(kindLine{Kind: "error", Message: fmt.Sprintf(format, args...)})
	os.Exit(2)
}

func main() {
	var o options
	fs := flag.NewFlagSet(os.Args[0], flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "path to a kubeconfig (required)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context to use (default: current-context)")
	fs.Var(&o.resources, "resource", "[GROUP/]VERSION/RESOURCE[@NAMESPACE], repeatable (v1/configmaps, apps/v1/deployments, example.com/v1/widgets@ns1)")
	fs.StringVar(&o.labelSelector, "label-selector", "", "label selector applied to every informer")
	fs.StringVar(&o.mode, "mode", "informer", "informer | typed | metadata | controller-runtime | fidelity")
	fs.DurationVar(&o.resync, "resync", 0, "informer resync period (0 = no resync)")
	fs.DurationVar(&o.duration, "duration", 0, "exit (after the final digest) after this long (0 = run until signalled)")
	fs.BoolVar(&o.exitOnSync, "exit-on-sync", false, "exit (after the final digest) once every informer has synced")
	fs.BoolVar(&o.noItems, "no-items", false, "omit the items array from digest lines")
	fs.BoolVar(&o.noEvents, "no-events", false, "print no event lines (a benchmark's client: a line per object costs the client a write and its reader a parse)")
	fs.BoolVar(&o.noDiscovery, "no-discovery", false, "do not check resources against discovery at start")
	fs.Float64Var(&o.qps, "qps", 1000, "client QPS")
	fs.IntVar(&o.burst, "burst", 2000, "client burst")
	fs.BoolVar(&o.protobuf, "protobuf", false, "typed and metadata modes: rest.Config ContentType/AcceptContentTypes protobuf, as kube-controller-manager")
	fs.BoolVar(&o.json, "json", false, "typed mode: rest.Config ContentType application/json (client-go 1.37's typed clients default to protobuf)")
	fs.BoolVar(&o.objectDigest, "object-digest", false, "digest lines also hash every whole object (objects, objectHashes)")
	fs.StringVar(&o.otherKubeconfig, "other-kubeconfig", "", "fidelity mode: the second server's kubeconfig (compared with --kubeconfig's)")
	fs.StringVar(&o.otherContext, "other-context", "", "fidelity mode: context in --other-kubeconfig")
	fs.StringVar(&o.rv, "rv", "", "fidelity mode: resourceVersion of the LISTs and the WatchList (empty: unset)")
	fs.StringVar(&o.checks, "checks", strings.Join(fidelityChecks, ","), "fidelity mode: which reads to compare")
	fs.DurationVar(&o.timeout, "timeout", time.Minute, "fidelity mode: per-request timeout")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })

	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fail("%v", err)
	}
	if fs.NArg() > 0 {
		fail("unexpected arguments: %q", fs.Args())
	}
	ctrllog.SetLogger(klog.NewKlogr())
	os.Exit(run(o))
}

func run(o options) int {
	if o.kubeconfig == "" {
		fail("--kubeconfig is required")
	}
	switch o.mode {
	case "informer", "controller-runtime":
		if o.protobuf {
			fail("--protobuf: mode %s uses unstructured objects, which client-go always reads as JSON", o.mode)
		}
	case "typed", "metadata":
	case "fidelity":
		if o.protobuf || o.json {
			fail("--protobuf/--json: fidelity mode always reads protobuf")
		}
		if o.otherKubeconfig == "" {
			fail("--mode fidelity needs --other-kubeconfig")
		}
		if o.timeout < time.Second {
			fail("--timeout must be at least 1s")
		}
		for _, c := range strings.Split(o.checks, ",") {
			if !slices.Contains(fidelityChecks, c) {
				fail("--checks: %q: want a comma-separated subset of %s", c, strings.Join(fidelityChecks, ","))
			}
		}
	default:
		fail("--mode %q: want informer, typed, metadata, controller-runtime or fidelity", o.mode)
	}
	if o.protobuf && o.json {
		fail("--protobuf and --json exclude each other")
	}
	if o.json && o.mode != "typed" {
		fail("--json: only typed mode has a choice (unstructured clients always read JSON, the metadata client always asks protobuf first)")
	}
	if len(o.resources) == 0 {
		fail("at least one --resource is required")
	}
	if o.labelSelector != "" {
		if _, err := labels.Parse(o.labelSelector); err != nil {
			fail("--label-selector: %v", err)
		}
	}
	if o.resync < 0 || o.duration < 0 {
		fail("--resync and --duration must not be negative")
	}
	var specs []resourceSpec
	seen := map[string]bool{}
	for _, r := range o.resources {
		s, err := parseResourceSpec(r)
		if err != nil {
			fail("%v", err)
		}
		key := s.GVR.String() + "@" + s.Namespace
		if seen[key] {
			fail("resource %q given twice", r)
		}
		seen[key] = true
		specs = append(specs, s)
	}

	cfg := loadConfig(o.kubeconfig, o.context, "kubeconfig")
	cfg.QPS = float32(o.qps)
	cfg.Burst = o.burst
	cfg.UserAgent = "warmwatch-goclient/" + o.mode + " " + rest.DefaultKubernetesUserAgent()
	if o.protobuf {
		useProtobuf(cfg)
	}
	if o.json {
		useJSON(cfg)
	}
	if o.mode == "fidelity" {
		return fidelityMain(o, cfg, specs)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		fail("kubeconfig: %v", err)
	}

	if !o.noDiscovery {
		if err := checkDiscovery(cfg, hc, specs); err != nil {
			fail("%v", err)
		}
	}

	watchList := clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient)
	klog.InfoS("client-go feature gate", "WatchListClient", watchList, "KUBE_FEATURE_WatchListClient", os.Getenv("KUBE_FEATURE_WatchListClient"))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	handlerFor := func(resource string) toolscache.ResourceEventHandler {
		if o.noEvents {
			return toolscache.ResourceEventHandlerFuncs{}
		}
		return toolscache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj interface{}, initial bool) {
				emitEvent(resource, "ADDED", obj, initial)
			},
			UpdateFunc: func(_, obj interface{}) {
				emitEvent(resource, "MODIFIED", obj, false)
			},
			DeleteFunc: func(obj interface{}) {
				emitEvent(resource, "DELETED", obj, false)
			},
		}
	}
	p := setupParams{cfg: cfg, hc: hc, specs: specs, resync: o.resync, labelSelector: o.labelSelector, handlerFor: handlerFor}
	var ws []*watched
	var start startFunc
	switch o.mode {
	case "informer":
		ws, start, err = setupInformer(p)
	case "typed":
		ws, start, err = setupTyped(p)
	case "metadata":
		ws, start, err = setupMetadata(p)
	case "controller-runtime":
		ws, start, err = setupControllerRuntime(ctx, p)
	}
	if err != nil {
		fail("%v", err)
	}

	names := specNames(specs)
	out.emit(startLine{Kind: "start", WatchList: watchList, Mode: o.mode, Resources: names, LabelSelector: o.labelSelector, Protobuf: o.protobuf, JSON: o.json, ObjectDigest: o.objectDigest})

	// digestMu serialises digest sets, and the final one holds it until exit,
	// so no digest line follows {"kind":"exit"}.
	var digestMu sync.Mutex
	emitDigests := func() {
		for _, w := range ws {
			out.emit(buildDigest(w.spec.Spec, itemsFromObjects(w.list(), o.objectDigest), !o.noItems, o.objectDigest))
		}
	}
	finish := func(reason string) {
		digestMu.Lock()
		out.closing.Store(true)
		klog.InfoS("exiting", "reason", reason)
		emitDigests()
		out.emit(kindLine{Kind: "exit"})
		os.Exit(0)
	}

	started := time.Now()
	start(ctx)

	allSynced := make(chan struct{})
	var syncWG sync.WaitGroup
	for _, w := range ws {
		syncWG.Add(1)
		go func(w *watched) {
			select {
			case <-w.reg.HasSyncedChecker().Done():
				out.emit(syncedLine{Kind: "synced", Resource: w.spec.Spec, Count: len(w.list()), ElapsedMs: time.Since(started).Milliseconds()})
				syncWG.Done()
			case <-ctx.Done():
			}
		}(w)
	}
	go func() { syncWG.Wait(); close(allSynced) }()

	stdinExit := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			switch strings.TrimSpace(sc.Text()) {
			case "digest":
				digestMu.Lock()
				emitDigests()
				digestMu.Unlock()
			case "dump":
				digestMu.Lock()
				for _, w := range ws {
					for _, line := range objectLines(w.spec.Spec, w.list()) {
						out.emit(line)
					}
				}
				out.emit(kindLine{Kind: "dumped"})
				digestMu.Unlock()
			case "exit":
				close(stdinExit)
				return
			case "":
			default:
				klog.InfoS("ignoring unknown stdin command", "line", sc.Text())
			}
		}
		if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
			klog.ErrorS(err, "reading stdin")
		}
		// EOF on stdin: keep running.
	}()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	var timeout <-chan time.Time
	if o.duration > 0 {
		timeout = time.After(o.duration)
	}
	var onSync <-chan struct{}
	if o.exitOnSync {
		onSync = allSynced
	}
	select {
	case s := <-sig:
		finish("signal " + s.String())
	case <-timeout:
		finish("duration")
	case <-onSync:
		finish("synced")
	case <-stdinExit:
		finish("stdin")
	}
	return 0
}

// loadConfig reads a kubeconfig (what names it in errors) or fails.
func loadConfig(path, context, what string) *rest.Config {
	if _, err := os.Stat(path); err != nil {
		fail("%s: %v", what, err)
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: path},
		&clientcmd.ConfigOverrides{CurrentContext: context},
	).ClientConfig()
	if err != nil {
		fail("%s: %v", what, err)
	}
	return cfg
}

// fidelityMain: --mode fidelity. Exit status 0 when every check matched, 1 otherwise.
func fidelityMain(o options, cfg *rest.Config, specs []resourceSpec) int {
	other := loadConfig(o.otherKubeconfig, o.otherContext, "other-kubeconfig")
	a, err := serverFor(cfg)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	b, err := serverFor(other)
	if err != nil {
		fail("other-kubeconfig: %v", err)
	}
	out.emit(startLine{Kind: "start", Mode: o.mode, Resources: specNames(specs), LabelSelector: o.labelSelector, Protobuf: true})
	ok := runFidelity(newFidelityChecker(o.timeout, o.rv, o.labelSelector), a, b, specs, strings.Split(o.checks, ","))
	out.emit(kindLine{Kind: "exit"})
	if !ok {
		return 1
	}
	return 0
}

func specNames(specs []resourceSpec) []string {
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Spec
	}
	return names
}

func emitEvent(resource, typ string, obj interface{}, initial bool) {
	if out.closing.Load() {
		return
	}
	ev := eventLine{Kind: "event", Resource: resource, Type: typ, Initial: initial}
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		ev.Tombstone = true
		ev.Namespace, ev.Name, _ = toolscache.SplitMetaNamespaceKey(t.Key)
		obj = t.Obj
	}
	if obj != nil {
		if m, err := meta.Accessor(obj); err == nil {
			ev.Namespace, ev.Name, ev.RV = m.GetNamespace(), m.GetName(), m.GetResourceVersion()
		}
	}
	out.emit(ev)
}

// checkDiscovery verifies that every resource is served, can be listed and
// watched, and that @NAMESPACE is only used on namespaced resources.
func checkDiscovery(cfg *rest.Config, hc *http.Client, specs []resourceSpec) error {
	dc, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, hc)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	lists := map[string]*metav1.APIResourceList{}
	for i := range specs {
		s := &specs[i]
		gv := s.groupVersion()
		l, ok := lists[gv]
		if !ok {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			l, err = dc.ServerResourcesForGroupVersionWithContext(ctx, gv)
			cancel()
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("unknown resource %s: the server does not serve group version %s", s.Spec, gv)
			}
			if err != nil {
				return fmt.Errorf("discovery of %s (for %s): %w", gv, s.Spec, err)
			}
			lists[gv] = l
		}
		idx := slices.IndexFunc(l.APIResources, func(r metav1.APIResource) bool { return r.Name == s.GVR.Resource })
		if idx < 0 {
			return fmt.Errorf("unknown resource %s: the server does not serve %q in %s", s.Spec, s.GVR.Resource, gv)
		}
		r := l.APIResources[idx]
		if !slices.Contains(r.Verbs, "list") || !slices.Contains(r.Verbs, "watch") {
			return fmt.Errorf("resource %s does not support list and watch (verbs %v)", s.Spec, r.Verbs)
		}
		s.Kind, s.Namespaced = r.Kind, r.Namespaced
		if s.Namespace != "" && !r.Namespaced {
			return fmt.Errorf("resource %s: %s is cluster-scoped, @NAMESPACE not allowed", s.Spec, s.GVR.Resource)
		}
	}
	return nil
}
