package writeback

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/sluicehq/sluice/bucket"
)

// Key names one counter: the limit's namespace and the entity counted. It is
// a comparable value, used as is as the cache's map key.
type Key struct {
	Name string // e.g. "api.create_url"; never contains a NUL byte
	Key  string // e.g. "user:42"
}

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
// and of a stored key: Name + "\x00" + Key. The State encoding carries its
// own version and length rules (bucket.State.UnmarshalBinary).
const (
	recordFormat   = 1
	recordOverhead = 1 + 8 + 4 // all but the State encoding
)

// errBadRecord is wrapped by every record decoding error.
var errBadRecord = errors.New("bad store record")

// castagnoli is the crc32c table; never written after initialisation.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendStoreKey appends the store key of k to b.
func appendStoreKey(b []byte, k Key) []byte {
	b = append(b, k.Name...)
	b = append(b, 0)
	return append(b, k.Key...)
}

// parseStoreKey splits a store key at its first NUL.
func parseStoreKey(b []byte) (Key, error) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return Key{}, fmt.Errorf("%w: key %q has no NUL separator", errBadRecord, b)
	}
	return Key{Name: string(b[:i]), Key: string(b[i+1:])}, nil
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

// decodeRecord decodes a stored key and value into a Record.
func decodeRecord(key, value []byte) (Record, error) {
	k, err := parseStoreKey(key)
	if err != nil {
		return Record{}, err
	}
	st, v, err := decodeRecordValue(value)
	if err != nil {
		return Record{}, err
	}
	return Record{Key: k, State: st, Version: v}, nil
}
