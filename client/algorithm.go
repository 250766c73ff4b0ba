package client

import (
	"fmt"
	"strings"
)

// Algorithm selects how a limit is counted (docs/algorithms.md). The
// numbers are those of the sluice.v1.Algorithm enum and never change.
type Algorithm uint8

// The algorithms of a limit.
const (
	// AlgorithmUnspecified is SlidingWindow on the nodes.
	AlgorithmUnspecified Algorithm = 0
	SlidingWindow        Algorithm = 1
	SlidingLog           Algorithm = 2
	TokenBucket          Algorithm = 3
	LeakyBucket          Algorithm = 4
	FixedWindow          Algorithm = 5
	GCRA                 Algorithm = 6
)

var algorithmNames = [...]string{"unspecified", "sliding_window", "sliding_log", "token_bucket", "leaky_bucket", "fixed_window", "gcra"}

// String is the algorithm's name as the CLI and rules files spell it
// ("token_bucket").
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm reads an algorithm by the name String gives, as the CLI
// and rules files spell it ("gcra", "token_bucket").
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algorithmNames[1:] {
		if s == n {
			return Algorithm(i + 1), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q: want one of %s", s, strings.Join(algorithmNames[1:], ", "))
}
