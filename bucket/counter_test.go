package bucket

import "testing"

func TestValidateCounterKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, key string
		ok        bool
	}{
		{"api", "k", true},
		{"api\x000", "k", true},
		{"api\x0015", "k", true},
		{"api\x00", "k", false},
		{"api\x00123", "k", false},
		{"api\x00x", "k", false},
		{"api\x001\x002", "k", false},
		{"\x001", "k", false},
		{"api", "", false},
	} {
		if err := ValidateCounterKey(tc.name, tc.key); (err == nil) != tc.ok {
			t.Errorf("ValidateCounterKey(%q, %q) = %v, want ok %v", tc.name, tc.key, err, tc.ok)
		}
	}
}
