package main

import (
	"context"
	"encoding/binary"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/transport"
)

// ownerSource answers RateLimiter.Owners from the node's ring: the
// partition → owner table the node routes by, which the owner-routing
// client (client.WithOwnerRouting) hashes keys against with
// client.OwnerKeyHash, the same function as ring.Hash
// (TestOwnerKeyHashIsRingHash). The answer is built once per ring table
// and readiness and shared by every caller.
type ownerSource struct {
	node  *cluster.Node
	cache atomic.Pointer[ownersCached]
}

type ownersCached struct {
	tbl   *ring.Table
	ready bool
	resp  *sluicev1.OwnersResponse
}

var _ transport.OwnerSource = (*ownerSource)(nil)

func (s *ownerSource) Owners(context.Context) (*sluicev1.OwnersResponse, error) {
	tbl := s.node.Ring().Table()
	ready := s.node.Ready()
	if c := s.cache.Load(); c != nil && c.tbl == tbl && c.ready == ready {
		return c.resp, nil
	}
	resp := ownersResponse(s.node.Name(), tbl)
	// A node that is not yet in its own ring (joining) or has left it
	// (draining) shows a table that is not the cluster's.
	_, inRing := memberIndex(tbl.Members(), s.node.Name())
	resp.Ready = ready && inRing
	s.cache.Store(&ownersCached{tbl: tbl, ready: ready, resp: resp})
	return resp, nil
}

// ownersResponse describes tbl. Its version is a hash of the partition
// count, the members' names and addresses and every partition's owner, so
// nodes with the same table answer the same version.
func ownersResponse(node string, tbl *ring.Table) *sluicev1.OwnersResponse {
	ms := tbl.Members() // sorted by name
	resp := &sluicev1.OwnersResponse{
		Node:       node,
		Hash:       client.OwnerHash,
		Partitions: int64(tbl.Partitions()),
		Members:    make([]*sluicev1.OwnerMember, len(ms)),
	}
	var d xxhash.Digest
	d.Reset()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(tbl.Partitions()))
	_, _ = d.Write(b[:])
	index := make(map[string]uint32, len(ms))
	for i, m := range ms {
		resp.Members[i] = &sluicev1.OwnerMember{Name: m.Name, GrpcAddr: m.Addr}
		index[m.Name] = uint32(i)
		_, _ = d.WriteString(m.Name)
		_, _ = d.WriteString("\x00")
		_, _ = d.WriteString(m.Addr)
		_, _ = d.WriteString("\x00")
	}
	if len(ms) > 0 {
		resp.Owners = make([]uint32, tbl.Partitions())
		for p := range resp.Owners {
			m, _ := tbl.PartitionOwner(p)
			resp.Owners[p] = index[m.Name]
			binary.LittleEndian.PutUint32(b[:4], resp.Owners[p])
			_, _ = d.Write(b[:4])
		}
	}
	resp.Version = d.Sum64()
	return resp
}

func memberIndex(ms []ring.Member, name string) (int, bool) {
	for i, m := range ms {
		if m.Name == name {
			return i, true
		}
	}
	return 0, false
}
