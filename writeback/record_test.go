package writeback

import (
	"bytes"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	st := bucket.State{Algorithm: bucket.SlidingWindow, Start: 60e9, Count: 7, Prev: 3, Expires: 180e9}
	v := appendRecordValue(nil, st, 42)
	if len(v) != recordOverhead+bucket.EncodedSize {
		t.Fatalf("len %d, want %d", len(v), recordOverhead+bucket.EncodedSize)
	}
	k := Key{Name: "api.create_url", Key: "user:\x00odd"}
	rec, err := decodeRecord(appendStoreKey(nil, k), v)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Record{Key: k, State: st, Version: 42}); rec != want {
		t.Fatalf("got %+v, want %+v", rec, want)
	}
	for i := range v {
		bad := bytes.Clone(v)
		bad[i] ^= 0x40
		if _, _, err := decodeRecordValue(bad); err == nil {
			t.Errorf("flipped byte %d accepted", i)
		}
	}
	if _, err := parseStoreKey([]byte("no-separator")); err == nil {
		t.Error("key without NUL accepted")
	}
}

// FuzzRecordDecode: the decoder never panics, and whatever it accepts
// encodes back to the same bytes.
func FuzzRecordDecode(f *testing.F) {
	st := bucket.State{Algorithm: bucket.SlidingWindow, Start: 60e9, Count: 7, Prev: 3, Expires: 180e9}
	f.Add([]byte("api\x00user:1"), appendRecordValue(nil, st, 1))
	f.Add([]byte("x"), appendRecordValue(nil, bucket.State{}, 0))
	f.Add([]byte{}, []byte{recordFormat})
	f.Fuzz(func(t *testing.T, key, value []byte) {
		rec, err := decodeRecord(key, value)
		if err != nil {
			return
		}
		if got := appendRecordValue(nil, rec.State, rec.Version); !bytes.Equal(got, value) {
			t.Fatalf("value %x decoded to %+v, encodes to %x", value, rec, got)
		}
		if got := appendStoreKey(nil, rec.Key); !bytes.Equal(got, key) {
			t.Fatalf("key %q decoded to %+v, encodes to %q", key, rec.Key, got)
		}
	})
}
