package test

import (
	"net"
	"testing"
)

// Two picks never return the same address, though the first's listener is
// closed when the second looks: parallel tests share loopback addresses,
// and their nodes bind what they were given only later.
func TestPickedAddressIsNotHandedOutTwice(t *testing.T) {
	t.Parallel()
	// An address no other test uses, and a port a fixed picker returns.
	const ip = "127.0.0.99"
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Skipf("no loopback address %s: %v", ip, err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	fixed := func() int { return port }
	first, err := pickAddr(ip, true, 3, fixed)
	if err != nil {
		t.Fatalf("first pick of a free port: %v", err)
	}
	second, err := pickAddr(ip, true, 3, fixed)
	if err == nil {
		t.Fatalf("the second pick returned %s, which the first had returned (%s)", second, first)
	}
	t.Logf("the second pick of %s: %v", first, err)
	// Another port on the same address is still given.
	if _, err := pickAddr(ip, false, 50, func() int { return 0 }); err != nil {
		t.Fatal(err)
	}
}
