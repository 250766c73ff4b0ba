package main

import (
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/transport/rules"
)

// envoyRules gives the transport's Envoy service the envoy-format rules in
// force: transport.EnvoyRules over the rules watcher.
type envoyRules struct{ w *rules.Watcher }

var _ transport.EnvoyRules = envoyRules{}

// MatchEnvoy matches the entries in the rules in force.
func (e envoyRules) MatchEnvoy(domain string, entries []rules.EnvoyEntry) transport.EnvoyMatch {
	r, name, known := e.w.MatchEnvoy(domain, entries)
	m := transport.EnvoyMatch{Known: known, Name: name, Found: r != nil}
	if r != nil {
		m.Rule = *r
	}
	return m
}
