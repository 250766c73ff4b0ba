package main

import (
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/sluicehq/sluice/cluster"
)

// One thread below one core.
//
// Go's default GOMAXPROCS follows the process's CPU limit (its cgroup's
// quota), but never goes below 2. A node limited to a fraction of a core
// (a sidecar with `resources.limits.cpu: 250m`) then runs its Go code on
// two threads, which spend the period's quota in half the time and wait
// out the rest together. A garbage collection falls across several such
// periods: its stop-the-world phases and the assists it asks of the
// node's goroutines, heartbeat included, stretch to 100–400 ms of wall
// time. The node stops answering for longer than the forward timeout, its
// peers' forwards time out, and it notices a pause and pulls its keys
// (docs/scaling.md, "Capacity"). On one thread the same quota comes in
// steadier slices and the collections run between them.
//
// So while its cgroup allows it less than one core, the node sets
// GOMAXPROCS to 1; when the limit is raised to a core or more, or taken
// away, it gives the runtime its default back (runtime.SetDefaultGOMAXPROCS,
// which follows the limit again). It looks at the limit when it starts
// and every procsRecheck. A GOMAXPROCS set in the environment is the
// operator's choice: the node then leaves it alone.

// procsRecheck is how often the node reads its CPU limit again.
const procsRecheck = 10 * time.Second

// procsAction decides, from the CPU limit (limited: there is one) and
// whether the node has set GOMAXPROCS to 1 (isOne), whether to set it to 1
// now (one) or to give the runtime its default back (restore).
func procsAction(limit float64, limited, isOne bool) (one, restore bool) {
	below := limited && limit < 1
	return below && !isOne, !below && isOne
}

// subCoreProcs applies procsAction. Its functions are the runtime's and
// the cgroup's (startSubCoreProcs) or a test's.
type subCoreProcs struct {
	limit   func() (float64, bool)
	setOne  func()
	restore func()
	log     *slog.Logger
	isOne   bool
}

// adjust reads the limit and acts on it.
func (p *subCoreProcs) adjust() {
	limit, limited := p.limit()
	one, restore := procsAction(limit, limited, p.isOne)
	switch {
	case one:
		p.setOne()
		p.isOne = true
		p.log.Info("CPU limit below one core: Go code runs on one thread (GOMAXPROCS=1), so that garbage collections do not stop the node for longer than the forward timeout; set GOMAXPROCS to choose otherwise",
			"limit_cores", limit)
	case restore:
		p.restore()
		p.isOne = false
		p.log.Info("CPU limit at least one core, or none: GOMAXPROCS back to the runtime's default", "gomaxprocs", runtime.GOMAXPROCS(0))
	}
}

// startSubCoreProcs starts following the CPU limit, unless GOMAXPROCS is
// set in the environment; stop ends it (GOMAXPROCS stays as it is).

func startSubCoreProcs(log *slog.Logger) (stop func()) {
	if os.Getenv("GOMAXPROCS") != "" {
		return func() {}
	}
	p := &subCoreProcs{limit: cluster.CPULimit, setOne: func() { runtime.GOMAXPROCS(1) },
		restore: runtime.SetDefaultGOMAXPROCS, log: log}
	p.adjust()
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(procsRecheck)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				p.adjust()
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}
