package ring

import (
	"encoding/binary"
	"math/bits"
)

// The primes of XXH64 (doc/xxhash_spec.md of github.com/Cyan4973/xxHash).
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
	prime5 uint64 = 2870177450012600261
)

// shortJoined is the longest joined key hashJoined takes: XXH64 of fewer
// than 32 bytes has no four-lane stripe.
const shortJoined = 31

// hashJoined returns XXH64 (seed 0) of name + "\x00" + key, for joined
// lengths up to shortJoined, reading the two strings where they are.
// Joining them in a buffer first costs more on the path of every check:
// the hash then reads 8-byte words that the copies have just written in
// other sizes, which stalls the processor's store forwarding.
// TestHashJoinedIsXXH64 holds it to xxhash.Sum64.
func hashJoined(name, key string) uint64 {
	nl := len(name)
	n := nl + 1 + len(key)
	h := prime5 + uint64(n)
	i := 0
	for ; i+8 <= n; i += 8 {
		var w uint64
		switch {
		case i+8 <= nl:
			w = binary.LittleEndian.Uint64([]byte(name[i : i+8]))
		case i > nl:
			w = binary.LittleEndian.Uint64([]byte(key[i-nl-1 : i-nl+7]))
		default:
			w = spanning(name, key, i)
		}
		h ^= bits.RotateLeft64(w*prime2, 31) * prime1
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if i+4 <= n {
		var w uint32
		switch {
		case i+4 <= nl:
			w = binary.LittleEndian.Uint32([]byte(name[i : i+4]))
		case i > nl:
			w = binary.LittleEndian.Uint32([]byte(key[i-nl-1 : i-nl+3]))
		default:
			w = uint32(spanning(name, key, i))
		}
		h ^= uint64(w) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
		i += 4
	}
	for ; i < n; i++ {
		var c byte
		switch {
		case i < nl:
			c = name[i]
		case i > nl:
			c = key[i-nl-1]
		}
		h ^= uint64(c) * prime5
		h = bits.RotateLeft64(h, 11) * prime1
	}
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// spanning returns the little-endian word at offset i of name + "\x00" +
// key when it starts in name and ends in key (i ≤ len(name) < i+8), as
// far as the joined key reaches (bytes past its end are zero).
func spanning(name, key string, i int) uint64 {
	a := len(name) - i // bytes from name, 0..7
	var lo uint64
	if len(name) >= 8 {
		lo = binary.LittleEndian.Uint64([]byte(name[len(name)-8:])) >> (8 * (8 - a))
	} else {
		for b := a - 1; b >= 0; b-- {
			lo = lo<<8 | uint64(name[i+b])
		}
	}
	// Then the NUL (zero), then key's first 7-a bytes.
	var hi uint64
	if len(key) >= 8 {
		hi = binary.LittleEndian.Uint64([]byte(key[:8]))
	} else {
		for b := len(key) - 1; b >= 0; b-- {
			hi = hi<<8 | uint64(key[b])
		}
	}
	if a == 7 {
		return lo // the NUL ends the word
	}
	return lo | hi<<(8*(a+1))
}
