package main

import (
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/hitters"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/transport/rules"
)

// The node's metrics live in a registry the node owns (never
// prometheus.DefaultRegisterer: several nodes run in one test binary).
// Three kinds, by cost:
//   - counters the node already keeps as atomics (cluster.Status, the
//     cache's Stats, the Envoy and auth counters) are read by statusCollector
//     at scrape time: nothing is done per check;
//   - per-call metrics (checks by API and result, their durations, peer RPCs,
//     flushes) use handles resolved once, when the registry is built or when
//     a peer address or rule is first seen: no label lookup per call;
//   - Go runtime and process metrics come from client_golang's collectors.

// Buckets of the latency histograms, in seconds: from the ~30 µs of a
// local decision to the forward timeout and beyond. Native histograms
// (factor 1.1) are exposed alongside for scrapers that ask for them.
var latencyBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

// flushBuckets are the buckets of sluice_flush_duration_seconds.
var flushBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

func latencyOpts(name, help string) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{
		Name:                            name,
		Help:                            help,
		Buckets:                         latencyBuckets,
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  160,
		NativeHistogramMinResetDuration: time.Hour,
	}
}

// nodeMetrics is the node's registry and the handles the serving paths
// use. It is the transport's Observer (checks), the writeback cache's
// OnFlush hook and, through observedPeers, the timer of peer calls.
type nodeMetrics struct {
	reg *prometheus.Registry

	checks    [transport.NumAPIs][transport.NumResults]prometheus.Counter
	durations [transport.NumAPIs]prometheus.Observer

	flushDuration prometheus.Observer
	flushRecords  prometheus.Observer

	peers      *peerMetrics
	rules      *ruleMetrics
	envoyRules *envoyRuleMetrics
}

var _ transport.Observer = (*nodeMetrics)(nil)

// newNodeMetrics builds a registry with the per-call metrics and the Go and
// process collectors. w is the rules watcher (nil without --rules): per-rule
// counters exist only for the rules it has held.
func newNodeMetrics(w *rules.Watcher) *nodeMetrics {
	m := &nodeMetrics{reg: prometheus.NewRegistry()}
	checks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_checks_total",
		Help: "Checks answered by this node as the entry node, by API and result (under, over, error). A native batch counts one per item, an Envoy or forward-auth call one; a call refused whole counts one error.",
	}, []string{"api", "result"})
	durations := prometheus.NewHistogramVec(latencyOpts("sluice_check_duration_seconds",
		"Time from the start of a public check call to its answer, by API (forwards, failovers and batching included)."),
		[]string{"api"})
	for a := range transport.NumAPIs {
		for r := range transport.NumResults {
			m.checks[a][r] = checks.WithLabelValues(a.String(), r.String())
		}
		m.durations[a] = durations.WithLabelValues(a.String())
	}
	flushDuration := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_flush_duration_seconds",
		Help:    "Time the durable store took to write one flush of changed counters (failed flushes included).",
		Buckets: flushBuckets,
	})
	flushRecords := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_flush_batch_records",
		Help:    "Changed counters written by one flush.",
		Buckets: prometheus.ExponentialBuckets(1, 4, 10),
	})
	m.flushDuration, m.flushRecords = flushDuration, flushRecords
	m.peers = newPeerMetrics()
	m.rules = newRuleMetrics(w)
	m.envoyRules = newEnvoyRuleMetrics()
	b := currentBuild()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "sluice_build_info",
		Help:        "Always 1; its labels say which build this node runs: version, revision (commit, \"unknown\" when the build did not record it) and Go version.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	buildInfo.Set(1)
	m.reg.MustRegister(checks, durations, flushDuration, flushRecords, buildInfo,
		m.peers.dur, m.peers.errs, m.rules.vec, m.envoyRules.vec,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerNode adds the collector that reads the node's own counters at
// scrape time (and prunes the peer series of departed addresses). Its srv
// may be set later, before the server starts.
func (m *nodeMetrics) registerNode(c *statusCollector) {
	c.peers = m.peers
	m.reg.MustRegister(c)
}

// handler serves the registry at /metrics, in the text format or, for
// scrapers that ask, the protobuf format (native histograms).
func (m *nodeMetrics) handler(lg *slog.Logger) http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(lg.Handler(), slog.LevelWarn),
		ErrorHandling:     promhttp.ContinueOnError,
		Registry:          m.reg,
		EnableOpenMetrics: true,
	})
}

// ObserveCall implements transport.Observer.
func (m *nodeMetrics) ObserveCall(api transport.API, c transport.Counts, d time.Duration) {
	if api >= transport.NumAPIs {
		return
	}
	for r, n := range c {
		if n > 0 {
			m.checks[api][r].Add(float64(n))
		}
	}
	m.durations[api].Observe(d.Seconds())
}

// ObserveRule implements transport.Observer.
func (m *nodeMetrics) ObserveRule(name string, r transport.Result) { m.rules.observe(name, r) }

// ObserveEnvoyRule implements transport.Observer.
func (m *nodeMetrics) ObserveEnvoyRule(domain, path string, r transport.Result) {
	m.envoyRules.observe(domain, path, r)
}

// observeFlush is the cache's OnFlush hook.
func (m *nodeMetrics) observeFlush(records int, took time.Duration, _ error) {
	m.flushDuration.Observe(took.Seconds())
	m.flushRecords.Observe(float64(records))
}

// ruleMetrics counts checks per native rule: sluice_rule_checks_total{name,
// result}. A name gets series only once the rules have held it, so their
// number is bounded by the rules, not by what callers send.
type ruleMetrics struct {
	vec   *prometheus.CounterVec
	known func(name string) bool // nil: no rules
	mu    sync.Mutex             // serialises additions to byName
	// byName maps a rule's name to its counters by result; copied on
	// write, so readers take no lock.
	byName atomic.Pointer[map[string]*[transport.NumResults]prometheus.Counter]
}

func newRuleMetrics(w *rules.Watcher) *ruleMetrics {
	r := &ruleMetrics{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rule_checks_total",
		Help: "Checks answered by this node as the entry node whose limits came from a native rule, by rule name and result.",
	}, []string{"name", "result"})}
	if w != nil {
		r.known = func(name string) bool { _, ok := w.Lookup(name); return ok }
	}
	r.byName.Store(&map[string]*[transport.NumResults]prometheus.Counter{})
	return r
}

func (r *ruleMetrics) observe(name string, res transport.Result) {
	if res >= transport.NumResults {
		return
	}
	if h := (*r.byName.Load())[name]; h != nil {
		h[res].Inc()
		return
	}
	if r.known == nil || !r.known(name) {
		return // no such rule: the check failed, or its name is a request's
	}
	r.mu.Lock()
	h := (*r.byName.Load())[name]
	if h == nil {
		h = new([transport.NumResults]prometheus.Counter)
		for x := range transport.NumResults {
			h[x] = r.vec.WithLabelValues(name, x.String())
		}
		next := maps.Clone(*r.byName.Load())
		next[name] = h
		r.byName.Store(&next)
	}
	r.mu.Unlock()
	h[res].Inc()
}

// envoyRuleMetrics counts descriptors per envoy-format rule:
// sluice_envoy_rule_checks_total{domain, descriptor, result}, descriptor
// being the rule's path in the file without the domain ("key_value.key",
// as envoyproxy/ratelimit names its stats). Paths come from the rules
// file, so the series are bounded by it.
type envoyRuleMetrics struct {
	vec    *prometheus.CounterVec
	mu     sync.Mutex
	byPath atomic.Pointer[map[string]*[transport.NumResults]prometheus.Counter]
}

func newEnvoyRuleMetrics() *envoyRuleMetrics {
	e := &envoyRuleMetrics{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_envoy_rule_checks_total",
		Help: "Envoy descriptors checked against an envoy-format rule, by domain, descriptor path of the rule and result (over includes shadow mode).",
	}, []string{"domain", "descriptor", "result"})}
	e.byPath.Store(&map[string]*[transport.NumResults]prometheus.Counter{})
	return e
}

func (e *envoyRuleMetrics) observe(domain, path string, res transport.Result) {
	if res >= transport.NumResults || path == "" {
		return
	}
	if h := (*e.byPath.Load())[path]; h != nil {
		h[res].Inc()
		return
	}
	e.mu.Lock()
	h := (*e.byPath.Load())[path]
	if h == nil {
		desc := strings.TrimPrefix(path, domain+".")
		h = new([transport.NumResults]prometheus.Counter)
		for x := range transport.NumResults {
			h[x] = e.vec.WithLabelValues(domain, desc, x.String())
		}
		next := maps.Clone(*e.byPath.Load())
		next[path] = h
		e.byPath.Store(&next)
	}
	e.mu.Unlock()
	h[res].Inc()
}

// statusCollector exposes, at scrape time, the counters the node, its
// cache, its rules watcher and its server keep anyway.
type statusCollector struct {
	node    *cluster.Node
	rules   *rules.Watcher // nil without --rules
	dataDir string
	srv     *transport.Server // set once the server exists, before it starts
	peers   *peerMetrics      // pruned of addresses no member has
}

var _ prometheus.Collector = (*statusCollector)(nil)

// statusDesc is one metric of statusCollector.
type statusDesc struct {
	d    *prometheus.Desc
	kind prometheus.ValueType
}

func desc(name, help string, kind prometheus.ValueType, labels ...string) statusDesc {
	return statusDesc{prometheus.NewDesc(name, help, labels, nil), kind}
}

// The metrics of statusCollector; the names and meanings of those that
// the hand-written exposition had are unchanged.
var (
	descRate            = desc("sluice_checks_per_second", "Checks per second over the last second.", prometheus.GaugeValue)
	descForwarded       = desc("sluice_forwarded_total", "Checks sent to their owner.", prometheus.CounterValue)
	descForwardErrors   = desc("sluice_forward_errors_total", "Checks whose owner could not be reached.", prometheus.CounterValue)
	descFailovers       = desc("sluice_failovers_total", "Checks a replica answered because the owner failed.", prometheus.CounterValue)
	descRedirects       = desc("sluice_redirects_total", "Checks re-sent to the node a key moved to.", prometheus.CounterValue)
	descReplicated      = desc("sluice_replicated_total", "Counters sent to replicas.", prometheus.CounterValue)
	descReplErrors      = desc("sluice_replication_errors_total", "Counters whose replication failed (retried).", prometheus.CounterValue)
	descHandedOff       = desc("sluice_handed_off_total", "Counters pushed to new owners.", prometheus.CounterValue)
	descHandoffErrors   = desc("sluice_handoff_errors_total", "Counters whose push to a new owner failed.", prometheus.CounterValue)
	descPulls           = desc("sluice_pulls_total", "First-touch pulls of moved keys.", prometheus.CounterValue)
	descPullErrors      = desc("sluice_pull_errors_total", "Pulls whose node did not answer.", prometheus.CounterValue)
	descSettlesDeferred = desc("sluice_settles_deferred_total", "Moved keys a check found unsettled because no node that may hold a newer count answered its pull, and one that did not is still a member: the check went to the key's replica instead of being decided from an older copy, and the key is pulled again on its next touch.", prometheus.CounterValue)
	descRejoins         = desc("sluice_rejoins_total", "Members alive again after being declared dead (a partition healed or a restart).", prometheus.CounterValue)
	descPauses          = desc("sluice_pauses_total", "Times this process found it had not run for longer than the forward timeout (SIGSTOP, VM freeze, long GC): it then pulled its keys before deciding them.", prometheus.CounterValue)
	descPauseCauses     = desc("sluice_pause_causes_total", "Pauses (sluice_pauses_total) by what explains them: starved (the machine or the cgroup had no CPU for the process), busy (the process ran but not its heartbeat: a long collection), stopped (neither: SIGSTOP, a frozen VM, a clock step).", prometheus.CounterValue, "cause")
	descPauseQueries    = desc("sluice_pause_queries_total", "Rounds of questions to the members after a pause or an idle spell: narrowed (only the keys the members decided meanwhile are pulled before their next decision) kept (a member did not answer, its record did not reach back, it had taken this node out of its ring, or the gap began more than a move window ago: every owned key is pulled), or skipped (the node pulled too little since the pause for a round, one call per member, to pay off: every owned key is pulled).", prometheus.CounterValue, "result")
	descKeys            = desc("sluice_keys", "Live keys in this node's cache.", prometheus.GaugeValue)
	descUnreplicated    = desc("sluice_unreplicated_keys", "Changed keys not yet sent to replicas.", prometheus.GaugeValue)
	descUnflushed       = desc("sluice_unflushed_keys", "Changed keys not yet written to disk.", prometheus.GaugeValue)
	descWritable        = desc("sluice_store_writable", "1 when the last flush to the store succeeded, 0 while the disk is full or failing (the node decides from memory).", prometheus.GaugeValue)
	descFlushFailures   = desc("sluice_store_flush_failures_total", "Flushes the store refused or failed (changed keys stayed in memory).", prometheus.CounterValue)
	descStoreSize       = desc("sluice_store_size_bytes", "Bytes of the files in the data directory (the durable store).", prometheus.GaugeValue)
	descMembersAlive    = desc("sluice_members_alive", "Members this node sees alive.", prometheus.GaugeValue)
	descMembers         = desc("sluice_members", "Members this node knows, by state (alive, suspect, dead, left).", prometheus.GaugeValue, "state")
	descMemberChanges   = desc("sluice_membership_changes_total", "Membership events this node has seen, by event (join, leave, fail, update).", prometheus.CounterValue, "event")
	descReady           = desc("sluice_ready", "1 once the node has joined its cluster and takes its share of the keys.", prometheus.GaugeValue)
	descCacheLookups    = desc("sluice_cache_lookups_total", "Cache lookups (decisions, reads, merges), by result: hit (in memory) or miss.", prometheus.CounterValue, "result")
	descCacheLoads      = desc("sluice_cache_loads_total", "Store reads done for cache misses.", prometheus.CounterValue)
	descCacheEvicted    = desc("sluice_cache_evictions_total", "Counters the cache evicted from memory (written to the store first when changed).", prometheus.CounterValue)
	descRulesReloads    = desc("sluice_rules_reloads_total", "Rules reloads that put new rules in force.", prometheus.CounterValue)
	descRulesFailures   = desc("sluice_rules_reload_failures_total", "Rules reloads refused (the previous rules stayed).", prometheus.CounterValue)
	descRules           = desc("sluice_rules", "Rules in force (native rules and envoy descriptors with a limit).", prometheus.GaugeValue)
	descRulesInfo       = desc("sluice_rules_info", "The hash of the rules in force (as `sluice status` shows it); always 1.", prometheus.GaugeValue, "hash")
	descEnvoyCalls      = desc("sluice_envoy_calls_total", "Envoy ShouldRateLimit calls answered.", prometheus.CounterValue)
	descEnvoyDescs      = desc("sluice_envoy_descriptors_total", "Envoy descriptors that had a limit.", prometheus.CounterValue)
	descEnvoyOver       = desc("sluice_envoy_over_limit_total", "Envoy descriptors over their limit, shadow mode included.", prometheus.CounterValue)
	descLeaseGrants     = desc("sluice_lease_grants_total", "Quota leases of hot keys this node granted as their owner (docs/leases.md).", prometheus.CounterValue)
	descLeaseTokens     = desc("sluice_lease_granted_hits_total", "Hits in the quota leases this node granted as an owner: admitted at once, for the holders to spend.", prometheus.CounterValue)
	descLeasedKeys      = desc("sluice_leased_keys", "Keys this node holds a quota lease for now.", prometheus.GaugeValue)
	descLeaseDecided    = desc("sluice_lease_decisions_total", "Checks this node decided from a quota lease another node granted it.", prometheus.CounterValue)
	descLeaseUnused     = desc("sluice_lease_unused_hits_total", "Leased hits left unspent when their lease ended or was revoked: admitted by the owner, then by nobody (the leases' under-admission).", prometheus.CounterValue)
	descLeaseRefusals   = desc("sluice_lease_refusal_grants_total", "Refusal leases this node granted as an owner: a hot key's sender may refuse as many hits itself until the refusal's retry-after.", prometheus.CounterValue)
	descLeaseRefused    = desc("sluice_lease_refused_total", "Checks this node refused itself from a refusal lease another node granted it.", prometheus.CounterValue)
	descLeaseRevoked    = desc("sluice_lease_revocations_total", "Quota leases this node dropped before their end: membership changed, or it left.", prometheus.CounterValue)
	descLeaseTookBack   = desc("sluice_lease_returned_hits_total", "Unspent hits of the quota leases this node granted that their holders gave back and it took back into the keys' counters.", prometheus.CounterValue)
	descRegionLent      = desc("sluice_region_lent_hits_total", "Hits of global limits this node, as a key's owner in its home region, lent to other regions (docs/regions.md).", prometheus.CounterValue)
	descRegionFallback  = desc("sluice_region_fallback_checks_total", "Checks of global limits this node decided from its region's fallback share while cut off from the key's home region.", prometheus.CounterValue)
	descRegionCut       = desc("sluice_region_cut", "1 while this node counts the region as cut off: a call failed since its last answer, older than --region-cut-after.", prometheus.GaugeValue, "region")
	descRegionRTT       = desc("sluice_region_rtt_seconds", "Duration of this node's last answered region grant call to the region.", prometheus.GaugeValue, "region")
	descLeaseGaveBack   = desc("sluice_lease_gave_back_hits_total", "Unspent hits of quota leases this node held that it gave back and their owners took back (of sluice_lease_unused_hits_total; the rest was admitted by nobody).", prometheus.CounterValue)
	descIdleResumes     = desc("sluice_idle_resumes_total", "Decisions that found the pause heartbeat stopped after --heartbeat-idle without checks: the node then pulled its keys before deciding them, as after a pause.", prometheus.CounterValue)
	descEnvoyShadow     = desc("sluice_envoy_shadow_over_limit_total", "Envoy descriptors over their limit but answered OK (shadow_mode).", prometheus.CounterValue)
	descTopKeyHits      = desc("sluice_top_key_hits", "Hits of the keys this node decided most in the last 30 to 60 s: the heaviest 10 by admitted hits (by=\"admitted\", their admitted hits) and by refused hits (by=\"refused\", their refused hits), so at most 20 series at a time (`sluice keys top` merges the members' lists).", prometheus.GaugeValue, "by", "name", "key")
	descKeyAdmin        = desc("sluice_key_admin_total", "Admin key calls this node answered (sluice keys inspect, drain, reset), by result: inspected, drained, reset, or failed (refused as invalid, or the key could not be decided).", prometheus.CounterValue, "result")
	descOverrides       = desc("sluice_overrides", "Runtime overrides in force, as this node knows them (sluice overrides list; the cap is 1000).", prometheus.GaugeValue)
	descOverrideChanges = desc("sluice_override_changes_total", "Override changes this node answered (sluice overrides set, delete), by result: set, deleted, or failed (refused).", prometheus.CounterValue, "result")
	descOverrideRefused = desc("sluice_override_records_refused_total", "Override records refused from gossip, a peer's state or the node's file (logged with the reason).", prometheus.CounterValue)
	descAuthRefused     = desc("sluice_auth_refused_total", "Internal calls and operator pages refused for want of a node certificate or a valid proof.", prometheus.CounterValue)
)

var statusDescs = []statusDesc{descRate, descForwarded, descForwardErrors, descFailovers, descRedirects,
	descReplicated, descReplErrors, descHandedOff, descHandoffErrors, descPulls, descPullErrors, descSettlesDeferred, descRejoins, descPauses, descPauseCauses, descIdleResumes, descPauseQueries,
	descLeaseGrants, descLeaseTokens, descLeasedKeys, descLeaseDecided, descLeaseUnused, descLeaseRevoked, descLeaseRefusals, descLeaseRefused,
	descLeaseTookBack, descLeaseGaveBack, descRegionLent, descRegionFallback, descRegionCut, descRegionRTT,
	descKeys, descUnreplicated, descUnflushed, descWritable, descFlushFailures, descStoreSize,
	descMembersAlive, descMembers, descMemberChanges, descReady, descCacheLookups, descCacheLoads, descCacheEvicted,
	descRulesReloads, descRulesFailures, descRules, descRulesInfo,
	descEnvoyCalls, descEnvoyDescs, descEnvoyOver, descEnvoyShadow, descAuthRefused, descTopKeyHits, descKeyAdmin,
	descOverrides, descOverrideChanges, descOverrideRefused}

// topKeysMetric caps the label values of sluice_top_key_hits: the
// heaviest 10 keys of each kind.
const topKeysMetric = 10

// Describe implements prometheus.Collector.
func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range statusDescs {
		ch <- d.d
	}
}

// Collect implements prometheus.Collector.
func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	put := func(d statusDesc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d.d, d.kind, v, labels...)
	}
	st := c.node.Status()
	put(descRate, st.ChecksPerSecond)
	put(descForwarded, float64(st.Forwarded))
	put(descForwardErrors, float64(st.ForwardErrors))
	put(descFailovers, float64(st.Failovers))
	put(descRedirects, float64(st.Redirects))
	put(descReplicated, float64(st.Replicated))
	put(descReplErrors, float64(st.ReplicationErrors))
	put(descHandedOff, float64(st.HandedOff))
	put(descHandoffErrors, float64(st.HandoffErrors))
	put(descPulls, float64(st.Pulls))
	put(descPullErrors, float64(st.PullErrors))
	put(descSettlesDeferred, float64(st.SettlesDeferred))
	put(descRejoins, float64(st.Rejoins))
	put(descPauses, float64(st.Pauses))
	put(descPauseCauses, float64(st.PausesStarved), cluster.PauseStarved)
	put(descPauseCauses, float64(st.PausesBusy), cluster.PauseBusy)
	put(descPauseCauses, float64(st.Pauses-st.PausesStarved-st.PausesBusy), cluster.PauseStopped)
	put(descIdleResumes, float64(st.IdleResumes))
	put(descPauseQueries, float64(st.PauseQueriesNarrowed), "narrowed")
	put(descPauseQueries, float64(st.PauseQueriesKept), "kept")
	put(descPauseQueries, float64(st.PauseQueriesSkipped), "skipped")
	put(descLeaseGrants, float64(st.LeaseGrants))
	put(descLeaseTokens, float64(st.LeaseGrantTokens))
	put(descLeasedKeys, float64(st.LeasedKeys))
	put(descLeaseDecided, float64(st.LeaseDecisions))
	put(descLeaseUnused, float64(st.LeaseUnused))
	put(descLeaseRevoked, float64(st.LeasesRevoked))
	put(descLeaseRefusals, float64(st.LeaseRefusalGrants))
	put(descLeaseRefused, float64(st.LeaseRefused))
	put(descLeaseTookBack, float64(st.LeaseTookBack))
	put(descLeaseGaveBack, float64(st.LeaseGaveBack))
	if st.Region != "" {
		put(descRegionLent, float64(st.RegionLent))
		put(descRegionFallback, float64(st.RegionFallback))
		for _, l := range st.RegionLinks {
			put(descRegionCut, boolValue(l.Cut), l.Region)
			put(descRegionRTT, l.RTT.Seconds(), l.Region)
		}
	}
	put(descKeys, float64(st.Keys))
	put(descUnreplicated, float64(st.Unreplicated))
	put(descUnflushed, float64(st.Unflushed))
	put(descWritable, boolValue(st.StoreWritable))
	put(descFlushFailures, float64(st.FlushFailures))
	if size, err := dirSize(c.dataDir); err == nil {
		put(descStoreSize, float64(size))
	}
	states := map[string]int{cluster.StateAlive: 0, cluster.StateSuspect: 0, cluster.StateDead: 0, cluster.StateLeft: 0}
	addrs := make(map[string]bool, len(st.Members))
	for _, mem := range st.Members {
		states[mem.State]++
		addrs[mem.GRPCAddr] = true
	}
	if c.peers != nil {
		c.peers.prune(addrs) // seen at the next scrape
	}
	put(descMembersAlive, float64(states[cluster.StateAlive]))
	for s, n := range states {
		put(descMembers, float64(n), s)
	}
	ev := st.MemberEvents
	put(descMemberChanges, float64(ev.Joins), "join")
	put(descMemberChanges, float64(ev.Leaves), "leave")
	put(descMemberChanges, float64(ev.Failures), "fail")
	put(descMemberChanges, float64(ev.Updates), "update")
	put(descReady, boolValue(st.Ready))
	cs := c.node.Cache().Stats()
	put(descCacheLookups, float64(cs.Hits), "hit")
	put(descCacheLookups, float64(cs.Misses), "miss")
	put(descCacheLoads, float64(cs.Loads))
	put(descCacheEvicted, float64(cs.Evictions))
	put(descRulesInfo, 1, st.RulesHash)
	// Label values must be UTF-8 (MustNewConstMetric panics otherwise);
	// names and keys need not be.
	utf8 := func(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
	live, _, refused := c.node.OverrideStats()
	put(descOverrides, float64(live))
	put(descOverrideRefused, float64(refused))
	for _, h := range c.node.TopKeys(hitters.ByAdmitted, topKeysMetric) {
		put(descTopKeyHits, float64(h.Admitted), "admitted", utf8(h.Name), utf8(h.Key))
	}
	for _, h := range c.node.TopKeys(hitters.ByRefused, topKeysMetric) {
		put(descTopKeyHits, float64(h.Refused), "refused", utf8(h.Name), utf8(h.Key))
	}
	if c.rules != nil {
		rs := c.rules.Stats()
		put(descRulesReloads, float64(rs.Reloads))
		put(descRulesFailures, float64(rs.Failures))
		put(descRules, float64(c.rules.Len()))
	}
	if c.srv != nil {
		e := c.srv.EnvoyStats()
		put(descEnvoyCalls, float64(e.Calls))
		put(descEnvoyDescs, float64(e.Descriptor))
		put(descEnvoyOver, float64(e.OverLimit))
		put(descEnvoyShadow, float64(e.Shadow))
		put(descAuthRefused, float64(c.srv.AuthRefused()))
		ka := c.srv.KeyAdminStats()
		oc := c.srv.OverrideStats()
		put(descOverrideChanges, float64(oc.Set), "set")
		put(descOverrideChanges, float64(oc.Deleted), "deleted")
		put(descOverrideChanges, float64(oc.Failed), "failed")
		put(descKeyAdmin, float64(ka.Inspected), "inspected")
		put(descKeyAdmin, float64(ka.Drained), "drained")
		put(descKeyAdmin, float64(ka.Reset), "reset")
		put(descKeyAdmin, float64(ka.Failed), "failed")
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// dirSize is the total size of the regular files under dir.
func dirSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if d == nil {
				return err // dir itself
			}
			return nil // a file removed under the walk (compaction)
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				total += info.Size()
			}
		}
		return nil
	})
	return total, err
}

// degraded says why the node serves in a degraded state ("" when it does
// not), for /readyz: a store that takes no writes. The node still decides
// every check from memory, so it stays ready (docs/architecture.md §1, docs/store.md).
func degraded(node *cluster.Node) func() string {
	return func() string {
		st := node.Cache().StoreState()
		if st.Writable {
			return ""
		}
		return fmt.Sprintf("store not writable since %s (%d failed flushes, %d changed keys only in memory): %v",
			st.Since.UTC().Format(time.RFC3339), st.FailedFlushes, node.Cache().Dirty(), st.Err)
	}
}
