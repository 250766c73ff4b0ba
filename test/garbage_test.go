package test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// garbageConnDeadline bounds every connection of the garbage test: it is
// written, read and closed within this time.
const garbageConnDeadline = 2 * time.Second

// h2Preface is the client connection preface of HTTP/2 (RFC 9113 §3.4).
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// TestRandomBytesDoNotStopANode sends a live node what no client should:
// random bytes, truncated HTTP/2 prefaces and frames, a valid preface
// followed by garbage frames, oversized headers (HTTP/2 and HTTP/1.1), and
// connections opened and left half-open, on its gRPC and HTTP ports, and
// random datagrams and bytes on its gossip port (UDP and TCP). Every
// connection ends within garbageConnDeadline. Afterwards the node still
// decides a real check, answers /healthz, and is still running. The
// randomness is seeded; the seed is printed (SLUICE_GARBAGE_SEED repeats it).
// Long on purpose: one story (each kind of garbage in turn, then a real check).
func TestRandomBytesDoNotStopANode(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SLUICE_GARBAGE_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SLUICE_GARBAGE_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("seed %d (SLUICE_GARBAGE_SEED=%d repeats this run)", seed, seed)

	p := newProc(t, 0, "127.0.0.80")
	p.start(t)
	waitMembers(t, []*proc{p})
	c := dial(t, p.grpc)
	check := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.Check(ctx, checkReq("garbage", "k", 1, 1000, 60_000))
		if err != nil {
			t.Fatalf("%s: check: %v", what, err)
		}
		if r := resp.Responses[0]; r.Error != "" || r.Status != sluicev1.Status_STATUS_UNDER_LIMIT {
			t.Fatalf("%s: check answered %v", what, r)
		}
	}
	check("before")

	type attack struct {
		name  string
		addr  string
		conns int
		send  func(rng *rand.Rand) []byte
		// halfOpen: the connection is held open, written or not, until
		// the real check below has been answered.
		halfOpen bool
	}
	var attacks []attack
	for _, port := range []struct{ name, addr string }{{"grpc", p.grpc}, {"http", p.http}, {"gossip", p.gossip}} {
		attacks = append(attacks,
			attack{name: port.name + ": random bytes", addr: port.addr, conns: 16, send: randomBytes},
			attack{name: port.name + ": truncated HTTP/2 preface", addr: port.addr, conns: 8, send: truncatedPreface},
			attack{name: port.name + ": preface then garbage frames", addr: port.addr, conns: 16, send: garbageFrames},
			attack{name: port.name + ": preface then truncated frame", addr: port.addr, conns: 8, send: truncatedFrame},
			attack{name: port.name + ": oversized HTTP/2 headers", addr: port.addr, conns: 4, send: oversizedH2Headers},
			attack{name: port.name + ": oversized HTTP/1.1 headers", addr: port.addr, conns: 4, send: oversizedH1Headers},
			attack{name: port.name + ": half-open, nothing sent", addr: port.addr, conns: 32, halfOpen: true,
				send: func(*rand.Rand) []byte { return nil }},
			attack{name: port.name + ": half-open, half a preface", addr: port.addr, conns: 32, halfOpen: true,
				send: func(*rand.Rand) []byte { return []byte(h2Preface[:len(h2Preface)/2]) }},
		)
	}

	// The half-open connections stay open until released, after the real
	// check that runs while they are held.
	release := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	tally := map[string]map[string]int{} // attack → outcome → connections
	for i, a := range attacks {
		for j := range a.conns {
			rng := rand.New(rand.NewPCG(seed, uint64(i<<16|j)))
			payload := a.send(rng)
			wg.Go(func() {
				res := garbageConn(a.addr, payload, a.halfOpen, release)
				mu.Lock()
				defer mu.Unlock()
				if tally[a.name] == nil {
					tally[a.name] = map[string]int{}
				}
				tally[a.name][res]++
			})
		}
	}
	// Random datagrams on the gossip port (memberlist's UDP): some start
	// with a message type byte memberlist knows, the rest are noise.
	udp, err := net.Dial("udp", p.gossip)
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	urng := rand.New(rand.NewPCG(seed, 1<<40))
	datagrams := 0
	for range 500 {
		b := make([]byte, 1+urng.IntN(1400))
		fillRandom(urng, b)
		if urng.IntN(2) == 0 {
			b[0] = byte(urng.IntN(16))
		}
		if _, err := udp.Write(b); err == nil {
			datagrams++
		}
	}

	// While the half-open connections are held: a real check.
	waitHalfOpen := time.Now()
	check("while half-open connections are held")
	close(release)
	wg.Wait()
	for _, a := range attacks {
		var outcomes []string
		for res, n := range tally[a.name] {
			outcomes = append(outcomes, fmt.Sprintf("%d %s", n, res))
		}
		slices.Sort(outcomes)
		t.Logf("%-45s %2d connections: %s", a.name, a.conns, strings.Join(outcomes, "; "))
	}
	t.Logf("gossip (UDP): %d random datagrams sent; half-open connections held %v", datagrams, time.Since(waitHalfOpen).Round(time.Millisecond))

	// Afterwards: still running, still deciding, still healthy.
	select {
	case <-p.exited:
		t.Fatalf("the node exited: %v", p.err)
	default:
	}
	check("after")
	resp, err := http.Get("http://" + p.http + "/healthz")
	if err != nil {
		t.Fatalf("/healthz after: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz after: %d %s", resp.StatusCode, body)
	}
	waitMembers(t, []*proc{p})
	if l := p.log.String(); strings.Contains(l, "panic") {
		t.Errorf("the node's log mentions a panic:\n%s", l)
	}
}

// garbageConn dials addr, writes payload, and reads whatever comes back
// until the server closes, the deadline passes, or (half-open) release is
// closed. It returns what happened, for the log.
func garbageConn(addr string, payload []byte, halfOpen bool, release <-chan struct{}) string {
	conn, err := net.DialTimeout("tcp", addr, garbageConnDeadline)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer conn.Close()
	if halfOpen {
		if len(payload) > 0 {
			conn.SetWriteDeadline(time.Now().Add(garbageConnDeadline))
			conn.Write(payload)
		}
		// Held until the check has passed (a bounded wait: the test's
		// check has a 5 s deadline), then closed.
		<-release
		return "held open, then closed"
	}
	conn.SetDeadline(time.Now().Add(garbageConnDeadline))
	_, werr := conn.Write(payload)
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	n, rerr := io.Copy(io.Discard, conn)
	var ne net.Error
	switch {
	case rerr == nil:
		return fmt.Sprintf("closed by the node after %d bytes back", n)
	case errors.As(rerr, &ne) && ne.Timeout():
		return fmt.Sprintf("still open at the deadline (%d bytes back)", n)
	case werr != nil:
		return "reset while writing"
	default:
		return fmt.Sprintf("reset after %d bytes back", n)
	}
}

func fillRandom(rng *rand.Rand, b []byte) {
	for i := 0; i < len(b); i += 8 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], rng.Uint64())
		copy(b[i:], w[:])
	}
}

func randomBytes(rng *rand.Rand) []byte {
	b := make([]byte, 1+rng.IntN(64<<10))
	fillRandom(rng, b)
	return b
}

func truncatedPreface(rng *rand.Rand) []byte {
	return []byte(h2Preface[:1+rng.IntN(len(h2Preface)-1)])
}

// frame encodes an HTTP/2 frame header (RFC 9113 §4.1) with the given
// declared length, followed by payload (which may be shorter or longer).
func frame(length int, typ, flags byte, stream uint32, payload []byte) []byte {
	b := []byte{byte(length >> 16), byte(length >> 8), byte(length), typ, flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[5:], stream&0x7fffffff)
	return append(b, payload...)
}

// emptySettings is a valid SETTINGS frame with no parameters.
var emptySettings = frame(0, 0x4, 0, 0, nil)

// garbageFrames is the preface, a valid SETTINGS frame, then frames of
// random type, flags, stream and payload, some declaring lengths past the
// maximum frame size.
func garbageFrames(rng *rand.Rand) []byte {
	b := append([]byte(h2Preface), emptySettings...)
	for range 1 + rng.IntN(20) {
		p := make([]byte, rng.IntN(512))
		fillRandom(rng, p)
		length := len(p)
		if rng.IntN(4) == 0 {
			length = rng.IntN(1 << 24) // declared, not sent
		}
		b = append(b, frame(length, byte(rng.IntN(12)), byte(rng.IntN(256)), rng.Uint32(), p)...)
	}
	return b
}

// truncatedFrame is the preface and SETTINGS, then a frame header cut off,
// or a HEADERS frame whose declared payload never comes.
func truncatedFrame(rng *rand.Rand) []byte {
	b := append([]byte(h2Preface), emptySettings...)
	f := frame(1000, 0x1, 0x4, 1, []byte{0x82, 0x86})
	return append(b, f[:1+rng.IntN(len(f)-1)]...)
}

// hpackLiteral encodes a header field as an HPACK literal without indexing
// and with a new name (RFC 7541 §6.2.2), without Huffman coding.
func hpackLiteral(name, value string) []byte {
	b := []byte{0x00}
	b = hpackInt(b, 7, len(name))
	b = append(b, name...)
	b = hpackInt(b, 7, len(value))
	return append(b, value...)
}

// hpackInt appends n with an N-bit prefix (RFC 7541 §5.1); the prefix byte's
// high bits (the Huffman flag here) are 0.
func hpackInt(b []byte, prefix uint, n int) []byte {
	max := 1<<prefix - 1
	if n < max {
		return append(b, byte(n))
	}
	b = append(b, byte(max))
	n -= max
	for n >= 128 {
		b = append(b, byte(n%128+128))
		n /= 128
	}
	return append(b, byte(n))
}

// oversizedH2Headers opens a gRPC-looking request whose header block is
// about 1 MiB (far past grpc-go's 16 KiB header list limit), sent as a
// HEADERS frame and CONTINUATION frames of 16 KiB.
func oversizedH2Headers(rng *rand.Rand) []byte {
	block := []byte{0x83, 0x86} // :method POST, :scheme http
	block = append(block, hpackLiteral(":path", "/sluice.v1.RateLimiter/Check")...)
	block = append(block, hpackLiteral("content-type", "application/grpc")...)
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = 'a' + byte(rng.IntN(26))
	}
	block = append(block, hpackLiteral("x-big", string(big))...)
	b := append([]byte(h2Preface), emptySettings...)
	const maxFrame = 16 << 10
	for i := 0; i < len(block); i += maxFrame {
		chunk := block[i:min(i+maxFrame, len(block))]
		typ, flags := byte(0x9), byte(0) // CONTINUATION
		if i == 0 {
			typ = 0x1 // HEADERS
		}
		if i+maxFrame >= len(block) {
			flags |= 0x4 // END_HEADERS
		}
		b = append(b, frame(len(chunk), typ, flags, 1, chunk)...)
	}
	return b
}

// oversizedH1Headers is an HTTP/1.1 request with a 2 MiB header (past
// net/http's 1 MiB default).
func oversizedH1Headers(rng *rand.Rand) []byte {
	var b bytes.Buffer
	b.WriteString("POST /v1/check HTTP/1.1\r\nHost: sluice\r\nX-Big: ")
	for range 2 << 20 {
		b.WriteByte('a' + byte(rng.IntN(26)))
	}
	b.WriteString("\r\nContent-Length: 0\r\n\r\n")
	return b.Bytes()
}
