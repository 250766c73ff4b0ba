package bucket

import "fmt"

// Algorithm selects how a limit is counted. The numbers are those of the
// sluice.v1.Algorithm enum and never change.
type Algorithm uint8

// The algorithms. AlgorithmUnspecified means SlidingWindow.
const (
	AlgorithmUnspecified Algorithm = 0
	SlidingWindow        Algorithm = 1
	SlidingLog           Algorithm = 2
	TokenBucket          Algorithm = 3
	LeakyBucket          Algorithm = 4
	FixedWindow          Algorithm = 5
	GCRA                 Algorithm = 6
)

var algorithmNames = [...]string{
	AlgorithmUnspecified: "unspecified",
	SlidingWindow:        "sliding_window",
	SlidingLog:           "sliding_log",
	TokenBucket:          "token_bucket",
	LeakyBucket:          "leaky_bucket",
	FixedWindow:          "fixed_window",
	GCRA:                 "gcra",
}

// String returns the name used on the command line and in rules files.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the algorithm named s ("sliding_window", "gcra", ...).
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if i > 0 && n == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want sliding_window, sliding_log, token_bucket, leaky_bucket, fixed_window or gcra)", s)
}

// Status is the verdict of a check. The numbers are those of the
// sluice.v1.Status enum.
type Status uint8

// The statuses. StatusUnspecified goes with an error.
const (
	StatusUnspecified Status = 0
	UnderLimit        Status = 1
	OverLimit         Status = 2
)

// Limits of DESIGN §5, checked before any state changes.
const (
	MaxNameLen   = 128
	MaxKeyLen    = 1024
	MaxLimit     = int64(1) << 40
	MinWindowMS  = int64(1)
	MaxWindowMS  = int64(366 * 24 * 60 * 60 * 1000)
	MaxBatchSize = 1000
)

// Limit is one limit: at most Limit hits per WindowMS milliseconds, counted by
// Algorithm. Burst is the capacity of the bucket algorithms (0 means Limit).
type Limit struct {
	Algorithm Algorithm
	Limit     int64
	WindowMS  int64
	Burst     int64
}

// Request is one check: Hits against the limit for (Name, Key). Hits 0 peeks.
// Limit.Limit 0 means "take the limit from the rules for Name".
type Request struct {
	Name string
	Key  string
	Hits int64
	Limit
}

// Decision is the answer of an algorithm to one request.
type Decision struct {
	Status       Status
	Limit        int64
	Remaining    int64
	ResetAfterMS int64 // until the window or bucket is full again
	RetryAfterMS int64 // 0 exactly when allowed; see docs/algorithms.md
}

// Allowed reports whether the request was admitted.
func (d Decision) Allowed() bool { return d.Status == UnderLimit }

// Outcome is a Decision as it travels between nodes and back to the client:
// Owner names the node that decided; Err is set (with StatusUnspecified)
// when the request was invalid or could not be decided.
type Outcome struct {
	Decision
	Owner string
	Err   string
}

// ValidateKey checks name and key against DESIGN §5.
func ValidateKey(name, key string) error {
	switch {
	case len(name) == 0:
		return fmt.Errorf("name is empty")
	case len(name) > MaxNameLen:
		return fmt.Errorf("name is %d bytes, more than %d", len(name), MaxNameLen)
	case len(key) == 0:
		return fmt.Errorf("key is empty")
	case len(key) > MaxKeyLen:
		return fmt.Errorf("key is %d bytes, more than %d", len(key), MaxKeyLen)
	}
	for i := 0; i < len(name); i++ {
		if name[i] == 0 {
			return fmt.Errorf("name contains a NUL byte at offset %d", i)
		}
	}
	return nil
}

// Validate checks a request against DESIGN §5. A request with Limit 0 is
// valid here (its limit comes from the rules); Validate checks the limit
// fields only when Limit is set.
func (r *Request) Validate() error {
	if err := ValidateKey(r.Name, r.Key); err != nil {
		return err
	}
	if r.Hits < 0 {
		return fmt.Errorf("hits is %d, must be >= 0", r.Hits)
	}
	if r.Limit.Limit == 0 && r.WindowMS == 0 && r.Burst == 0 {
		if r.Algorithm > GCRA {
			return fmt.Errorf("unknown algorithm %d", r.Algorithm)
		}
		return nil
	}
	return r.Limit.Validate()
}

// Validate checks a limit against DESIGN §5.
func (l Limit) Validate() error {
	switch {
	case l.Algorithm > GCRA:
		return fmt.Errorf("unknown algorithm %d", l.Algorithm)
	case l.Algorithm != AlgorithmUnspecified && l.Algorithm != SlidingWindow:
		return fmt.Errorf("algorithm %s is not available yet (only sliding_window)", l.Algorithm)
	case l.Limit < 0:
		return fmt.Errorf("limit is %d, must be >= 0", l.Limit)
	case l.Limit > MaxLimit:
		return fmt.Errorf("limit is %d, more than 2^40", l.Limit)
	case l.WindowMS < MinWindowMS:
		return fmt.Errorf("window is %d ms, must be at least 1 ms", l.WindowMS)
	case l.WindowMS > MaxWindowMS:
		return fmt.Errorf("window is %d ms, more than 366 days", l.WindowMS)
	case l.Burst < 0:
		return fmt.Errorf("burst is %d, must be >= 0", l.Burst)
	case l.Burst > MaxLimit:
		return fmt.Errorf("burst is %d, more than 2^40", l.Burst)
	}
	return nil
}
