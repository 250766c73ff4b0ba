package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/transport/peer"
)

// startNode runs one real Sluice node in this process, on loopback ports
// the kernel picks, as `sluice serve` would with its defaults, and returns
// its gRPC address and a function that stops it. Only the examples use it:
// an application calls nodes it does not run.
func startNode() (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "sluice-example-")
	if err != nil {
		log.Fatal(err)
	}
	cfg := cluster.DefaultConfig()
	ml := memberlist.DefaultLocalConfig()
	ml.Name, ml.BindAddr, ml.BindPort, ml.LogOutput = "sluice-1", "127.0.0.1", 0, io.Discard
	cfg.Config = ml
	// A cluster of its own: no other node on this machine can join it.
	cfg.ClusterName = fmt.Sprint("example-", ln.Addr().(*net.TCPAddr).Port)
	cfg.GRPCAddr = ln.Addr().String()
	cfg.DataDir = dir
	cfg.Log = slog.New(slog.DiscardHandler)
	peers := peer.NewPeerClient(peer.PeerConfig{NodeName: ml.Name, NodeAddr: cfg.GRPCAddr, ClusterName: cfg.ClusterName, Timeout: cfg.ForwardTimeout})
	n, err := cluster.New(cfg, peers)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		log.Fatal(err)
	}
	srv, err := transport.NewServer(transport.ServerConfig{GRPCListener: ln, Handler: n, Peer: n, ClusterName: cfg.ClusterName})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	for !n.Ready() {
		if ctx.Err() != nil {
			log.Fatal("the example node did not become ready in 20 s")
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
	srv.SetReady(true)
	return cfg.GRPCAddr, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = n.Leave(ctx)
		_ = srv.Shutdown(ctx)
		_ = n.Shutdown(ctx)
		_ = peers.Close()
		_ = os.RemoveAll(dir)
	}
}
