// Package key names one counter. It is a leaf: the ownership protocol
// (cluster/ownership) keeps its records by Key without depending on the
// store, and writeback keeps its records and its cache by the same type
// (writeback.Key is an alias).
package key

// Key names one counter: the limit's namespace, the entity counted, and
// which limit of the check it counts. It is a comparable value, used as is
// as a map key.
type Key struct {
	Name string // e.g. "api.create_url"; never contains a NUL byte
	Key  string // e.g. "user:42"; any bytes
	// Limit is 0 for the counter of a check with one limit, and i+1 for
	// limit i of a multi-limit check (writeback.SubKey): at most
	// writeback.MaxLimit.
	Limit uint8
}
