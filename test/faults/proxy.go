//go:build faults && linux

package faults

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"time"
)

// Delayer relays TCP connections and UDP datagrams to fixed targets and
// holds each piece of data for a delay drawn uniformly from base ± jitter
// (this kernel has no netem). A TCP stream keeps its order: each chunk
// leaves at its own delay or right after the chunk before it, whichever is
// later. Datagrams are delayed one by one and may overtake each other, as
// on a network with jitter. The delay applies to both directions of every
// relay and can be changed at any time (0: a plain relay).
//
// Every socket is made through inNS, which runs its function on a thread
// inside the network namespace the relay belongs to; Close stops every
// relay and waits for its goroutines.
type Delayer struct {
	inNS func(func()) error

	mu           sync.Mutex
	base, jitter time.Duration
	rng          *rand.Rand
	closed       bool
	socks        map[io.Closer]struct{}
	done         chan struct{}
	wg           sync.WaitGroup
}

// NewDelayer makes a Delayer whose sockets are made through inNS.
func NewDelayer(inNS func(func()) error) *Delayer {
	return &Delayer{inNS: inNS, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 14)),
		socks: map[io.Closer]struct{}{}, done: make(chan struct{})}
}

// SetDelay sets the delay of everything relayed from now on.
func (d *Delayer) SetDelay(base, jitter time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.base, d.jitter = base, jitter
}

func (d *Delayer) delay() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.base == 0 && d.jitter == 0 {
		return 0
	}
	return max(0, d.base+time.Duration((d.rng.Float64()*2-1)*float64(d.jitter)))
}

// track registers sockets for Close; false when the Delayer is closed
// (they are closed then).
func (d *Delayer) track(cs ...io.Closer) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		d.socks[c] = struct{}{}
	}
	return true
}

func (d *Delayer) untrack(cs ...io.Closer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range cs {
		delete(d.socks, c)
		c.Close()
	}
}

// Close stops every relay, closes every socket and waits for the
// goroutines and the deliveries still pending (at most one delay).
func (d *Delayer) Close() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.closed = true
	close(d.done)
	for c := range d.socks {
		c.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
}

// TCP listens on listen ("ip:0" for any port) and relays every connection
// to target; it returns the address it listens on.
func (d *Delayer) TCP(listen, target string) (string, error) {
	var ln net.Listener
	var err error
	if nsErr := d.inNS(func() { ln, err = net.Listen("tcp4", listen) }); nsErr != nil {
		return "", nsErr
	}
	if err != nil {
		return "", err
	}
	if !d.track(ln) {
		return "", net.ErrClosed
	}
	d.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			d.wg.Go(func() { d.relayTCP(in, target) })
		}
	})
	return ln.Addr().String(), nil
}

func (d *Delayer) relayTCP(in net.Conn, target string) {
	var out net.Conn
	var err error
	if nsErr := d.inNS(func() { out, err = net.DialTimeout("tcp4", target, 5*time.Second) }); nsErr != nil || err != nil {
		in.Close()
		return
	}
	if !d.track(in, out) {
		return
	}
	var pipes sync.WaitGroup
	pipes.Go(func() { d.pipe(out.(*net.TCPConn), in.(*net.TCPConn)) })
	pipes.Go(func() { d.pipe(in.(*net.TCPConn), out.(*net.TCPConn)) })
	pipes.Wait()
	d.untrack(in, out)
}

// pipe copies src to dst, each chunk held for its delay. At src's end it
// ends dst's write side (the peer sees EOF); on an error it closes both.
func (d *Delayer) pipe(dst, src *net.TCPConn) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	chunks := make(chan chunk, 256)
	var readErr error
	go func() {
		defer close(chunks)
		var last time.Time
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				at := time.Now().Add(d.delay())
				if at.Before(last) {
					at = last
				}
				last = at
				chunks <- chunk{append([]byte(nil), buf[:n]...), at}
			}
			if err != nil {
				readErr = err
				return
			}
		}
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	failed := false
	for c := range chunks {
		if failed {
			continue // drain, so the reader ends
		}
		if wait := time.Until(c.at); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-d.done:
				failed = true
				src.Close()
				continue
			}
		}
		if _, err := dst.Write(c.b); err != nil {
			failed = true
			src.Close()
		}
	}
	switch {
	case failed || !errors.Is(readErr, io.EOF):
		dst.Close()
		src.Close()
	default:
		dst.CloseWrite()
	}
}

// UDP listens on listen ("ip:0" for any port) and relays datagrams to
// target: each sender gets a socket of its own towards target, and what
// target sends back on it goes back to that sender from the listening
// address. It returns the address it listens on.
func (d *Delayer) UDP(listen, target string) (string, error) {
	raddr, err := net.ResolveUDPAddr("udp4", target)
	if err != nil {
		return "", err
	}
	var pc net.PacketConn
	if nsErr := d.inNS(func() { pc, err = net.ListenPacket("udp4", listen) }); nsErr != nil {
		return "", nsErr
	}
	if err != nil {
		return "", err
	}
	if !d.track(pc) {
		return "", net.ErrClosed
	}
	d.wg.Go(func() {
		sessions := map[string]*net.UDPConn{}
		buf := make([]byte, 64<<10)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, syscall.ECONNREFUSED) {
					continue
				}
				return
			}
			up := sessions[from.String()]
			if up == nil {
				var derr error
				if nsErr := d.inNS(func() { up, derr = net.DialUDP("udp4", nil, raddr) }); nsErr != nil || derr != nil {
					continue
				}
				if !d.track(up) {
					return
				}
				sessions[from.String()] = up
				d.wg.Go(func() {
					b := make([]byte, 64<<10)
					for {
						n, err := up.Read(b)
						if err != nil {
							if errors.Is(err, syscall.ECONNREFUSED) {
								continue // the target was not listening: ICMP, not the socket's end
							}
							return
						}
						p := append([]byte(nil), b[:n]...)
						d.later(func() { pc.WriteTo(p, from) })
					}
				})
			}
			p := append([]byte(nil), buf[:n]...)
			d.later(func() { up.Write(p) })
		}
	})
	return pc.LocalAddr().String(), nil
}

// later runs f after a delay (at once without one).
func (d *Delayer) later(f func()) {
	wait := d.delay()
	if wait == 0 {
		f()
		return
	}
	d.wg.Add(1)
	time.AfterFunc(wait, func() {
		defer d.wg.Done()
		f()
	})
}
