package client

import (
	"encoding/binary"
	"math/bits"
)

// XXH64 with seed 0, written from the algorithm's public specification:
// the key hash of owner routing (OwnerKeyHash) must equal the nodes' own
// (ring.Hash), without the client depending on a hashing module.

const (
	xxPrime1 uint64 = 0x9E3779B185EBCA87
	xxPrime2 uint64 = 0xC2B2AE3D27D4EB4F
	xxPrime3 uint64 = 0x165667B19E3779F9
	xxPrime4 uint64 = 0x85EBCA77C2B2AE63
	xxPrime5 uint64 = 0x27D4EB2F165667C5

	// The first and last accumulators start at seed + prime 1 + prime 2
	// and seed - prime 1, modulo 2^64.
	xxInit1 uint64 = 0x60EA27EEADC0B5D6
	xxInit4 uint64 = 0x61C8864E7A143579
)

// xxRound mixes one 8-byte lane into an accumulator.
func xxRound(acc, lane uint64) uint64 {
	acc += lane * xxPrime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * xxPrime1
}

// xxMerge folds an accumulator into the hash of a long input.
func xxMerge(h, acc uint64) uint64 {
	h ^= xxRound(0, acc)
	return h*xxPrime1 + xxPrime4
}

// xxh64 is a streaming XXH64 (seed 0) digest. Its zero value is not ready:
// start from newXXH64. It lives on the caller's stack and allocates
// nothing.
type xxh64 struct {
	v     [4]uint64 // the four accumulators of 32-byte stripes
	buf   [32]byte  // the start of a stripe not yet complete
	n     int       // bytes in buf
	total uint64    // bytes written
}

func newXXH64() xxh64 {
	return xxh64{v: [4]uint64{xxInit1, xxPrime2, 0, xxInit4}}
}

// stripe mixes one whole 32-byte stripe into the accumulators.
func (d *xxh64) stripe(b []byte) {
	d.v[0] = xxRound(d.v[0], binary.LittleEndian.Uint64(b[0:8]))
	d.v[1] = xxRound(d.v[1], binary.LittleEndian.Uint64(b[8:16]))
	d.v[2] = xxRound(d.v[2], binary.LittleEndian.Uint64(b[16:24]))
	d.v[3] = xxRound(d.v[3], binary.LittleEndian.Uint64(b[24:32]))
}

func (d *xxh64) writeString(s string) {
	d.total += uint64(len(s))
	if d.n > 0 {
		c := copy(d.buf[d.n:], s)
		d.n += c
		s = s[c:]
		if d.n < len(d.buf) {
			return
		}
		d.stripe(d.buf[:])
		d.n = 0
	}
	for len(s) >= 32 {
		var b [32]byte
		copy(b[:], s[:32])
		d.stripe(b[:])
		s = s[32:]
	}
	d.n = copy(d.buf[:], s)
}

func (d *xxh64) sum() uint64 {
	var h uint64
	if d.total >= 32 {
		h = bits.RotateLeft64(d.v[0], 1) + bits.RotateLeft64(d.v[1], 7) +
			bits.RotateLeft64(d.v[2], 12) + bits.RotateLeft64(d.v[3], 18)
		for _, v := range d.v {
			h = xxMerge(h, v)
		}
	} else {
		h = xxPrime5 // seed 0 + prime 5
	}
	h += d.total
	return xxFinish(h, d.buf[:d.n])
}

// xxFinish mixes in the last (under 32) bytes and avalanches.
func xxFinish(h uint64, b []byte) uint64 {
	for ; len(b) >= 8; b = b[8:] {
		h ^= xxRound(0, binary.LittleEndian.Uint64(b))
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	}
	if len(b) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(b)) * xxPrime1
		h = bits.RotateLeft64(h, 23)*xxPrime2 + xxPrime3
		b = b[4:]
	}
	for _, c := range b {
		h ^= uint64(c) * xxPrime5
		h = bits.RotateLeft64(h, 11) * xxPrime1
	}
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return h
}
