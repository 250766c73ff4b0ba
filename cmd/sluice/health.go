package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Exit codes of `sluice health`.
const (
	exitHealthy   = 0
	exitUnhealthy = 1
)

// health asks a node's /healthz (or /readyz with --ready) over HTTP and
// exits 0 on 200, 1 otherwise: the probe of a container built FROM scratch
// (Docker HEALTHCHECK, a Kubernetes exec probe), which has no curl. Its
// flags read the same SLUICE_ variables as serve's, so in a node's
// environment it finds the node's HTTP port and TLS files by itself.
func health(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("http-addr", ":8080", "the node's HTTP address, as given to serve (an empty or unspecified host means 127.0.0.1)")
	ready := fs.Bool("ready", false, "ask /readyz (joined and serving) instead of /healthz (the process answers)")
	timeout := fs.Duration("timeout", 2*time.Second, "deadline of the probe")
	var tf clientFlags
	tf.register(fs, false)
	if err := parseWithEnv(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitHealthy
		}
		fmt.Fprintf(stderr, "sluice health: %v\n", err)
		return exitError
	}
	url, client, err := healthRequest(*addr, *ready, tf)
	if err != nil {
		fmt.Fprintf(stderr, "sluice health: %v\n", err)
		return exitError
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	msg, err := probe(ctx, client, url)
	if err != nil {
		fmt.Fprintf(stderr, "sluice health: %v\n", err)
		return exitUnhealthy
	}
	fmt.Fprintf(stdout, "%s: %s\n", url, msg)
	return exitHealthy
}

// probe GETs url once and returns its body when the answer is 200; any
// other answer, or none, is the error.
func probe(ctx context.Context, client *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	msg := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s %s", url, resp.Status, msg)
	}
	return msg, nil
}

// waitReady asks a node's /readyz until it answers 200 or the timeout
// passes: what a script runs between starting nodes and using them
// (`sluice wait --http-addr 127.0.0.1:8080 --timeout 30s`). Exit 0 ready, 1
// not ready in time (the last answer is printed), 2 bad flags.
func waitReady(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice wait", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("http-addr", ":8080", "the node's HTTP address, as given to serve (an empty or unspecified host means 127.0.0.1)")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the node to be ready")
	every := fs.Duration("interval", 100*time.Millisecond, "time between two probes")
	var tf clientFlags
	tf.register(fs, false)
	if err := parseWithEnv(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitHealthy
		}
		fmt.Fprintf(stderr, "sluice wait: %v\n", err)
		return exitError
	}
	if *timeout <= 0 || *every <= 0 {
		fmt.Fprintf(stderr, "sluice wait: --timeout and --interval must be positive (got %v, %v)\n", *timeout, *every)
		return exitError
	}
	url, client, err := healthRequest(*addr, true, tf)
	if err != nil {
		fmt.Fprintf(stderr, "sluice wait: %v\n", err)
		return exitError
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	tick := time.NewTicker(*every)
	defer tick.Stop()
	var last error // the last answer, or failure, before the deadline cut one short
	for {
		pctx, pcancel := context.WithTimeout(ctx, min(*every*10, 2*time.Second))
		msg, err := probe(pctx, client, url)
		pcancel()
		if err == nil {
			fmt.Fprintf(stdout, "%s: %s\n", url, msg)
			return exitHealthy
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(stderr, "sluice wait: not ready after %v: %v\n", *timeout, last)
			return exitUnhealthy
		case <-tick.C:
		}
	}
}

// healthRequest returns the URL to probe and a client for it: HTTPS when
// TLS files are given. Without --tls-server-name the node's certificate is
// checked as peers check it, by its chain to --tls-ca only: a node
// certificate need not name 127.0.0.1.
func healthRequest(addr string, ready bool, tf clientFlags) (string, *http.Client, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", nil, fmt.Errorf("--http-addr: %w", err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	path := "/healthz"
	if ready {
		path = "/readyz"
	}
	tr := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	scheme := "http"
	if tf.tls.CA != "" || tf.tls.Cert != "" {
		scheme = "https"
		tc, err := tf.tls.TLSConfig()
		if err != nil {
			return "", nil, err
		}
		if tc.ServerName == "" {
			roots := tc.RootCAs
			tc.InsecureSkipVerify = true // verified by the chain below
			tc.VerifyConnection = func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					return errors.New("the node presented no certificate")
				}
				inter := x509.NewCertPool()
				for _, c := range cs.PeerCertificates[1:] {
					inter.AddCert(c)
				}
				_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
					KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
				return err
			}
		}
		tr.TLSClientConfig = tc
	}
	return scheme + "://" + net.JoinHostPort(host, port) + path, &http.Client{Transport: tr}, nil
}
