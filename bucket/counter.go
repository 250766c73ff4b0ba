package bucket

import (
	"fmt"
	"strings"
)

// Counter is one key's counter state as it travels between nodes:
// replication to replicas, handoff to a new owner, pulls. Version grows with
// every change (it follows the owner's clock in nanoseconds); of two copies
// of a key the one with the greater Version is the newer.
type Counter struct {
	Name    string
	Key     string
	State   State
	Version uint64
}

// ValidateCounterKey checks the name and key of a Counter: those of a
// request (ValidateKey), where the name may also carry the suffix "\x00"
// and a decimal limit index below 100 that the cache uses for the limits
// of a multi-limit check.
func ValidateCounterKey(name, key string) error {
	base, idx, sub := strings.Cut(name, "\x00")
	if err := ValidateKey(base, key); err != nil {
		return err
	}
	if !sub {
		return nil
	}
	if len(idx) == 0 || len(idx) > 2 || strings.Trim(idx, "0123456789") != "" {
		return fmt.Errorf("name has a bad limit index %q after its NUL", idx)
	}
	return nil
}
