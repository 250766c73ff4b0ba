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
	rec, err := decodeRecord(appendPartKey(nil, 7, k), v)
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
	if _, err := decodeRecord(appendStoreKey(nil, k), v); err == nil {
		t.Error("key without a partition accepted")
	}
}

// FuzzRecordDecode: the decoder never panics, and whatever it accepts
// encodes back to the same bytes.
func FuzzRecordDecode(f *testing.F) {
	st := bucket.State{Algorithm: bucket.SlidingWindow, Start: 60e9, Count: 7, Prev: 3, Expires: 180e9}
	f.Add(appendPartKey(nil, 3, Key{Name: "api", Key: "user:1"}), appendRecordValue(nil, st, 1))
	f.Add(appendPartKey(nil, 1<<20, SubKey(Key{Name: "api", Key: "u"}, 2)), appendRecordValue(nil, st, 1))
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
		part, _, _ := splitPartKey(key)
		if got := appendPartKey(nil, part, rec.Key); !bytes.Equal(got, key) {
			t.Fatalf("key %q decoded to %+v, encodes to %q", key, rec.Key, got)
		}
	})
}

// The store key of a multi-limit check's counter (SubKey) decodes back to
// the same Key, and differs from that of any single-limit key: a key may
// hold NUL bytes and digits, so "api" + "1\x00user:1" must not meet limit
// 1 of ("api", "user:1"). Before the limit index was typed, both were the
// bytes "api\x001\x00user:1", and the sub-key decoded as the other: a
// drain (which reads the store) handed it off under the wrong key.
func TestSubKeyStoreKeys(t *testing.T) {
	t.Parallel()
	v := appendRecordValue(nil, bucket.State{Algorithm: bucket.FixedWindow, Start: 60e9, Count: 2, Expires: 120e9}, 7)
	base := Key{Name: "api", Key: "user:1"}
	seen := map[string]Key{}
	for _, k := range []Key{base, SubKey(base, 0), SubKey(base, 1), SubKey(base, 15), {Name: "api", Key: "1\x00user:1"}, {Name: "api", Key: "\x00"}} {
		sk := appendPartKey(nil, 0, k)
		if other, dup := seen[string(sk)]; dup {
			t.Fatalf("%+v and %+v have the same store key %q", k, other, sk)
		}
		seen[string(sk)] = k
		rec, err := decodeRecord(sk, v)
		if err != nil {
			t.Fatalf("%+v: %v", k, err)
		}
		if rec.Key != k {
			t.Fatalf("%+v decoded as %+v", k, rec.Key)
		}
	}
}

// A multi-limit counter stored under its old key (legacyStoreKey, before
// the limit index was typed) in a store of layout 1 is still found by Load
// after the store is regrouped by partition, and a key whose bytes only
// look like it is not taken for it.
func TestLoadFindsLegacySubKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k := SubKey(Key{Name: "api", Key: "user:1"}, 1)
	state := bucket.State{Algorithm: bucket.FixedWindow, Start: 60e9, Count: 4, Expires: 120e9}
	writeLayout1(t, dir, map[string][]byte{string(legacyStoreKey(nil, k)): appendRecordValue(nil, state, 9)})
	st, err := OpenPartitionedStore(dir, quietLogger(), testParts)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, ok, err := st.Load(k)
	if err != nil || !ok || rec.Key != k || rec.State != state || rec.Version != 9 {
		t.Fatalf("Load(%+v) = %+v, %v, %v; want the legacy record", k, rec, ok, err)
	}
	if _, ok, _ := st.Load(Key{Name: "api", Key: "user:1"}); ok {
		t.Error("the single-limit key found the multi-limit counter")
	}
	if err := st.Write([]Record{{Key: k, State: state, Version: 10}}); err != nil {
		t.Fatal(err)
	}
	if rec, ok, _ := st.Load(k); !ok || rec.Version != 10 {
		t.Errorf("after a write: %+v, %v; want the new record (version 10)", rec, ok)
	}
}
