package writeback

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/writeback/key"
)

// Key names one counter (package key, a leaf that the ownership records
// share without depending on the store).
type Key = key.Key

// MaxLimit is the largest Key.Limit: limit MaxLimit-1 of a check
// (bucket.MaxLimitsPerRequest is 16).
const MaxLimit = 31

// Record is one counter as the store and, later, replicas hold it.
type Record struct {
	Key     Key
	State   bucket.State
	Version uint64 // bumped by every change; a higher Version is newer
}

// The layout of a stored value:
//
//	[format byte][Version uint64 big-endian][bucket.State encoding][crc32c of the preceding bytes, big-endian]
//
// and of a stored key: Name + "\x00" + Key for a key of one limit, and
// "\x00" + Limit byte + Name + "\x00" + Key for limit Limit-1 of a
// multi-limit check. Names are never empty and never contain a NUL, so the
// first byte tells the two apart whatever bytes the key holds. (Before
// 2026-11-25 a multi-limit counter was stored as Name + "\x00" + index in
// decimal + "\x00" + Key, which a key holding a NUL could also produce;
// Load still finds a counter stored that way: legacyStoreKey.) The State
// encoding carries its own version and length rules
// (bucket.State.UnmarshalBinary).
const (
	recordFormat   = 1
	recordOverhead = 1 + 8 + 4 // all but the State encoding
)

// A stored key of layout 2 (partKeyPrefix) puts the key's partition
// (Partitioning.Of) in front of the key above, so that the records of one
// partition lie together and a ring change reads only the partitions that
// moved (ForEachIn):
//
//	"\x00\x00" + partition (uint32 big-endian) + the key above
//
// No key above starts with two NULs (a limit byte is never 0), so the two
// layouts never meet; a store of layout 1 is rewritten on open
// (pebbleStore.relayout).
const partKeyPrefix = 6

// errBadRecord is wrapped by every record decoding error.
var errBadRecord = errors.New("bad store record")

// castagnoli is the crc32c table; never written after initialisation.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendStoreKey appends the store key of k to b.
func appendStoreKey(b []byte, k Key) []byte {
	if k.Limit != 0 {
		b = append(b, 0, k.Limit)
	}
	b = append(b, k.Name...)
	b = append(b, 0)
	return append(b, k.Key...)
}

// appendPartKey appends the layout-2 store key of k in partition part.
func appendPartKey(b []byte, part uint32, k Key) []byte {
	return appendStoreKey(appendPartPrefix(b, part), k)
}

// appendPartPrefix appends the first bytes of every layout-2 key of
// partition part: the bound of its key range.
func appendPartPrefix(b []byte, part uint32) []byte {
	return binary.BigEndian.AppendUint32(append(b, 0, 0), part)
}

// splitPartKey splits a layout-2 store key into its partition and the
// layout-1 key; false for a key of layout 1.
func splitPartKey(b []byte) (part uint32, rest []byte, ok bool) {
	if len(b) < partKeyPrefix || b[0] != 0 || b[1] != 0 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint32(b[2:6]), b[partKeyPrefix:], true
}

// legacyStoreKey is the store key a multi-limit counter had before the
// limit index was typed: Name + "\x00" + decimal index + "\x00" + Key.
func legacyStoreKey(b []byte, k Key) []byte {
	b = append(b, k.Name...)
	b = append(b, 0)
	b = strconv.AppendUint(b, uint64(k.Limit-1), 10)
	b = append(b, 0)
	return append(b, k.Key...)
}

// parseStoreKey decodes a store key (appendStoreKey).
func parseStoreKey(b []byte) (Key, error) {
	var limit uint8
	if len(b) > 0 && b[0] == 0 {
		if len(b) < 2 || b[1] == 0 || b[1] > MaxLimit {
			return Key{}, fmt.Errorf("%w: key %q has a bad limit index", errBadRecord, b)
		}
		limit, b = b[1], b[2:]
	}
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return Key{}, fmt.Errorf("%w: key %q has no NUL separator", errBadRecord, b)
	}
	if i == 0 {
		return Key{}, fmt.Errorf("%w: key %q has an empty name", errBadRecord, b)
	}
	return Key{Name: string(b[:i]), Key: string(b[i+1:]), Limit: limit}, nil
}

// appendRecordValue appends the stored value of (st, version) to b.
func appendRecordValue(b []byte, st bucket.State, version uint64) []byte {
	start := len(b)
	b = append(b, recordFormat)
	b = binary.BigEndian.AppendUint64(b, version)
	b, _ = st.AppendBinary(b) // AppendBinary never fails
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// decodeRecordValue decodes a value written by appendRecordValue. It refuses
// any input that is not exactly one valid value.
func decodeRecordValue(b []byte) (bucket.State, uint64, error) {
	var st bucket.State
	if len(b) <= recordOverhead {
		return st, 0, fmt.Errorf("%w: %d bytes, want more than %d", errBadRecord, len(b), recordOverhead)
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return st, 0, fmt.Errorf("%w: checksum %08x, want %08x", errBadRecord, got, sum)
	}
	if body[0] != recordFormat {
		return st, 0, fmt.Errorf("%w: format %d, want %d", errBadRecord, body[0], recordFormat)
	}
	version := binary.BigEndian.Uint64(body[1:9])
	if err := st.UnmarshalBinary(body[9:]); err != nil {
		return st, 0, fmt.Errorf("%w: %v", errBadRecord, err)
	}
	return st, version, nil
}

// decodeRecord decodes a stored key of layout 2 and its value into a
// Record.
func decodeRecord(key, value []byte) (Record, error) {
	_, rest, ok := splitPartKey(key)
	if !ok {
		return Record{}, fmt.Errorf("%w: key %q has no partition", errBadRecord, key)
	}
	k, err := parseStoreKey(rest)
	if err != nil {
		return Record{}, err
	}
	st, v, err := decodeRecordValue(value)
	if err != nil {
		return Record{}, err
	}
	return Record{Key: k, State: st, Version: v}, nil
}
