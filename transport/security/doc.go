// Package security is what secures a Sluice node on the wire: its TLS
// material (LoadTLS; TLS.Reload swaps it for new handshakes), the proofs by
// which members holding the cluster's gossip key recognise each other
// (Prover, ProofHeader), and who may call the internal RPCs and the
// operator pages (Guard, with WithProofs and WithStreamProofs on the
// calling side). It imports no package of Sluice: transport, which serves
// the public API and composes the node's servers, and transport/peer, the
// peer protocol, both build on it.
//
// # Security
//
// transport.ServerConfig.TLS (a *TLS from LoadTLS, whose Reload swaps the
// material for new handshakes) serves gRPC and HTTP over TLS 1.2+ and makes
// the internal RPCs (Peer, Admin), the status page and pprof require a
// client certificate chaining to the node CA (PERMISSION_DENIED, HTTP 403);
// with a client CA every caller needs a certificate. Without TLS,
// transport.ServerConfig.Prover makes the internal RPCs require a proof
// (ProofHeader: an HMAC of the method, a time, a nonce and the request's
// digest under a key derived from the gossip key, valid
// DefaultProofValidity and once; UNAUTHENTICATED otherwise).
// peer.PeerConfig.TLS and peer.PeerConfig.Prover are the client side.
// Refusals change nothing, are counted (Guard.Refused, which
// transport.Server.AuthRefused reports) and logged once per caller host.
// docs/security.md has the threat model.
package security
