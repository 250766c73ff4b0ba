package main

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/cluster/rules"
	"github.com/sluicehq/sluice/transport"
)

// envoyRules gives the transport's Envoy service the envoy-format rules in
// force: transport.EnvoyRules over the rules watcher.
type envoyRules struct{ w *rules.Watcher }

var _ transport.EnvoyRules = envoyRules{}

// MatchEnvoy converts the entries (on the stack for up to 8 of them),
// matches them in the rules in force and converts the answer.
func (e envoyRules) MatchEnvoy(domain string, entries []transport.EnvoyEntry) transport.EnvoyMatch {
	var buf [8]rules.EnvoyEntry
	es := buf[:0]
	for _, x := range entries {
		es = append(es, rules.EnvoyEntry(x))
	}
	r, name, known := e.w.MatchEnvoy(domain, es)
	m := transport.EnvoyMatch{Known: known, Name: name, Found: r != nil}
	if r != nil {
		m.Rule = transport.EnvoyRule{
			Limit:           r.Limit,
			Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(r.Unit),
			Unlimited:       r.Unlimited,
			ShadowMode:      r.ShadowMode,
			QuotaMode:       r.QuotaMode,
			CountRefusedSet: r.CountRefusedSet,
			Name:            r.Name,
			Replaces:        r.Replaces,
			Shared:          r.Shared,
			Path:            r.Path,
		}
	}
	return m
}
