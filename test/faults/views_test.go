//go:build faults && linux

package faults

// What the hosts report: each one's view of the membership, waiting until
// the views agree, and their metrics.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// View is what one host sees: each member's state ("alive", "suspect",
// "dead", "left") and whether it owns part of the ring.
type View map[string]string

// View asks h for its membership view.
func (h *Host) View() (View, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := h.Client().Status(ctx)
	if err != nil {
		return nil, err
	}
	v := View{}
	for _, m := range st.Members {
		s := m.State
		if s == "alive" && m.Share == 0 {
			s = "joining"
		}
		v[m.Name] = s
	}
	return v, nil
}

// sees says whether v has exactly the hosts in want alive (in the ring) and
// nobody suspect or joining.
func (v View) sees(want []*Host) bool {
	alive := 0
	for _, s := range v {
		switch s {
		case "alive":
			alive++
		case "suspect", "joining":
			return false
		}
	}
	if alive != len(want) {
		return false
	}
	for _, h := range want {
		if v[h.Name] != "alive" {
			return false
		}
	}
	return true
}

// WaitViews waits until every host of each group sees exactly its group
// alive, and returns how long that took.
func (c *Cluster) WaitViews(within time.Duration, groups ...[]*Host) time.Duration {
	c.t.Helper()
	start := time.Now()
	var last []string
	deadline := start.Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok := true
		last = last[:0]
		for _, g := range groups {
			for _, h := range g {
				v, err := h.View()
				if err != nil || !v.sees(g) {
					ok = false
				}
				last = append(last, fmt.Sprintf("%s: %v %v", h.Name, v, err))
			}
		}
		if ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("views did not settle within %v; last seen: %s", within, strings.Join(last, "; "))
		}
		<-tick.C
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		<-tick.C
	}
}

// Metric returns one unlabelled sample of h's /metrics (ok false when absent).
func (h *Host) Metric(name string) (float64, bool) {
	code, body, err := h.Get("/metrics")
	if err != nil || code != 200 {
		return 0, false
	}
	for l := range strings.Lines(body) {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}
