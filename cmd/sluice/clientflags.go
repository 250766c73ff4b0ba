package main

import (
	"flag"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/transport/security"
)

// clientFlags are the security flags of the commands that call a node
// (check, status, bench).
type clientFlags struct {
	tls           client.TLSFiles
	gossipKeyFile string // status only: sign Admin calls for a node without TLS
}

func (c *clientFlags) register(fs *flag.FlagSet, withGossipKey bool) {
	fs.StringVar(&c.tls.CA, "tls-ca", "", "CA certificate(s) that signed the nodes' certificates: call over TLS and verify the node")
	fs.StringVar(&c.tls.Cert, "tls-cert", "", "client certificate to present (a node with --client-ca requires one; Admin calls need one of the node CA)")
	fs.StringVar(&c.tls.Key, "tls-key", "", "private key of --tls-cert")
	fs.StringVar(&c.tls.ServerName, "tls-server-name", "", "name the node's certificate must carry (default: the host dialled)")
	if withGossipKey {
		fs.StringVar(&c.gossipKeyFile, "gossip-key-file", "", "the cluster's gossip key file: sign the Admin call for nodes that authenticate members by it (no TLS)")
	}
}

// dialOptions returns the options that make a client.Node speak TLS
// and sign internal calls as the flags ask.
func (c *clientFlags) dialOptions() ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	if c.tls != (client.TLSFiles{}) {
		tc, err := c.tls.TLSConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	}
	if c.gossipKeyFile != "" {
		keys, err := readGossipKeys(c.gossipKeyFile)
		if err != nil {
			return nil, err
		}
		p, err := security.NewProver(keys, 0)
		if err != nil {
			return nil, err
		}
		opts = append(opts, security.WithProofs(p))
	}
	return opts, nil
}
