package cluster

// A check's limits: resolved from an override, the request's own, or the
// rules, and checked for what reserve, settle and lease operations need.

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
)

// limits are the resolved limits of a request: one, plus more decided
// atomically with it (nil for a single limit, the common case).
type limits struct {
	one  *bucket.Limit // into the request or the rules; never written
	more []bucket.Limit
}

// all returns every limit (allocates; for the multi-limit path).
func (l limits) all() []bucket.Limit {
	return append([]bucket.Limit{*l.one}, l.more...)
}

// prepare validates r and resolves its limits: the inline limit and
// r.More, or r.More alone, or the rules for r.Name. A limit of 0 takes the
// rules (docs/architecture.md §4: "0: take limit and window from the rules file"), even
// when the request also carries a window. A resolved request, forwarded by
// the node that resolved it, carries its limits inline, a rule's limit of 0
// included, and is decided with them: the owner needs no rules. When it
// fails it fills o with the error and returns false.
func (n *Node) prepare(r *check.Request, resolved bool, o *check.Outcome) (limits, bool) {
	if r.Op != check.OpNone {
		// A concurrency limit's operation carries its limit (a release
		// may carry none); no override or rule applies.
		*o = check.Outcome{}
		if err := r.Validate(); err != nil {
			o.Err = err.Error()
			return limits{}, false
		}
		if r.Op == check.OpRelease && r.Limit.Limit == 0 {
			r.Limit = releaseLimit
		}
		return limits{one: &r.Limit}, true
	}
	lims, ok := n.prepareLimits(r, resolved, o)
	if ok && (r.ReserveTTLMS > 0 || r.ReservationID != "") {
		if why := reservable(lims); why != "" {
			o.Err = why
			return limits{}, false
		}
	}
	return lims, ok
}

// releaseLimit stands in for the limit of a release that gives none: a
// release needs only its lease, and answers the holders left as the free
// slots of the largest limit.
var releaseLimit = bucket.Limit{Limit: bucket.MaxHolders, WindowMS: 1}

// prepareLimits is prepare but for the checks of reserve and settle.
func (n *Node) prepareLimits(r *check.Request, resolved bool, o *check.Outcome) (limits, bool) {
	*o = check.Outcome{}
	if err := r.Validate(); err != nil {
		o.Err = err.Error()
		return limits{}, false
	}
	if !resolved {
		// An operator's override wins over the request's own limits and
		// the rules (docs/operations.md, "Overrides").
		if lims, ok := n.overrideLimits(r.Name, r.Key); ok {
			return lims, true
		}
	}
	switch {
	case r.Limit.Limit != 0 || (resolved && r.WindowMS != 0):
		return limits{one: &r.Limit, more: r.More}, true
	case len(r.More) > 0:
		return limits{one: &r.More[0], more: r.More[1:]}, true
	}
	if n.cfg.Rules != nil {
		if ls, ok := n.cfg.Rules.Lookup(r.Name); ok && len(ls) > 0 {
			return limits{one: &ls[0], more: ls[1:]}, true
		}
	}
	o.Err = fmt.Sprintf("no limit given and no rule for name %q", r.Name)
	return limits{}, false
}

// ValidateCheck reports the error Check would answer r with before
// deciding anything: r is invalid (check.Request.Validate), or gives no
// limit and the rules in force have none for its name. nil means Check
// would decide r (or fail to reach a decision: that is not r's fault). It
// changes nothing and does not block; the HTTP API asks it about every item
// of a batch before deciding any.
func (n *Node) ValidateCheck(r *check.Request) error {
	if r.Reset {
		return errors.New(errResetNotACheck)
	}
	if r.Op != check.OpNone {
		return errors.New(errLeaseNotACheck)
	}
	var o check.Outcome
	if _, ok := n.prepare(r, false, &o); !ok {
		return errors.New(o.Err)
	}
	return nil
}
