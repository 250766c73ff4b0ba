package main

import (
	"fmt"
	"net/http"

	"github.com/sluicehq/sluice/cluster"
)

// metricsHandler serves the node's counters at /metrics in the Prometheus
// text exposition format (version 0.0.4), read from Node.Status on each
// scrape: nothing is computed per check.
type metricsHandler struct{ node *cluster.Node }

func (m metricsHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	st := m.node.Status()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	metric := func(name, kind, help string, v float64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %g\n", name, help, name, kind, name, v)
	}
	metric("sluice_checks_total", "counter", "Checks answered through this node.", float64(st.Checks))
	metric("sluice_checks_per_second", "gauge", "Checks per second over the last second.", st.ChecksPerSecond)
	metric("sluice_forwarded_total", "counter", "Checks sent to their owner.", float64(st.Forwarded))
	metric("sluice_forward_errors_total", "counter", "Checks whose owner could not be reached.", float64(st.ForwardErrors))
	metric("sluice_failovers_total", "counter", "Checks a replica answered because the owner failed.", float64(st.Failovers))
	metric("sluice_redirects_total", "counter", "Checks re-sent to the node a key moved to.", float64(st.Redirects))
	metric("sluice_replicated_total", "counter", "Counters sent to replicas.", float64(st.Replicated))
	metric("sluice_replication_errors_total", "counter", "Counters whose replication failed (retried).", float64(st.ReplicationErrors))
	metric("sluice_handed_off_total", "counter", "Counters pushed to new owners.", float64(st.HandedOff))
	metric("sluice_handoff_errors_total", "counter", "Counters whose push to a new owner failed.", float64(st.HandoffErrors))
	metric("sluice_pulls_total", "counter", "First-touch pulls of moved keys.", float64(st.Pulls))
	metric("sluice_pull_errors_total", "counter", "Pulls whose node did not answer.", float64(st.PullErrors))
	metric("sluice_rejoins_total", "counter", "Members alive again after being declared dead (a partition healed or a restart).", float64(st.Rejoins))
	metric("sluice_keys", "gauge", "Live keys in this node's cache.", float64(st.Keys))
	metric("sluice_unreplicated_keys", "gauge", "Changed keys not yet sent to replicas.", float64(st.Unreplicated))
	metric("sluice_unflushed_keys", "gauge", "Changed keys not yet written to disk.", float64(st.Unflushed))
	alive := 0
	for _, mem := range st.Members {
		if mem.State == cluster.StateAlive {
			alive++
		}
	}
	metric("sluice_members_alive", "gauge", "Members this node sees alive.", float64(alive))
}
