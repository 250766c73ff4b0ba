package peer

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/keymove"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// Limits of Peer/Replicate and Peer/Pull.
const (
	// MaxCounters is the most counters one Replicate call, and keys one Pull
	// call, may carry; the server refuses a larger call whole
	// (InvalidArgument).
	MaxCounters = 100_000
	// MaxReleaseTTL is the longest a Pull with release makes the receiver
	// redirect its keys; release_ttl_ms is clamped to [0, MaxReleaseTTL].
	MaxReleaseTTL = 10 * time.Minute
)

// DefaultMaxRecvMsgSize is the largest message a node's gRPC server
// accepts by default (transport.DefaultMaxRecvMsgSize is this value): the
// peer client sizes its Replicate chunks and halves its Pulls by it.
const DefaultMaxRecvMsgSize = 4 << 20

// maxChunkBytes bounds the estimated wire size of one Replicate RPC: half the
// receiver's default message limit, so chunks of large states (a sliding
// log holds up to 10 000 timestamps, about 80 KB) stay well under it too.
const maxChunkBytes = DefaultMaxRecvMsgSize / 2

// counterOverhead bounds a Counter's wire bytes beyond its name, key and
// state: tags, lengths, the version, the message's own tag and length.
const counterOverhead = 32

func tooManyCounters(n int) error {
	return status.Errorf(codes.InvalidArgument, "%d counters, more than %d", n, MaxCounters)
}

// releaseTTL is a wire release_ttl_ms clamped to [0, MaxReleaseTTL].
func releaseTTL(ms int64) time.Duration {
	switch {
	case ms <= 0:
		return 0
	case ms >= MaxReleaseTTL.Milliseconds():
		return MaxReleaseTTL
	}
	return time.Duration(ms) * time.Millisecond
}

// releaseTTLMS is ttl for the wire: whole milliseconds rounded up (a release
// is never shorter than asked), clamped to [0, MaxReleaseTTL].
func releaseTTLMS(ttl time.Duration) int64 {
	switch {
	case ttl <= 0:
		return 0
	case ttl >= MaxReleaseTTL:
		return MaxReleaseTTL.Milliseconds()
	}
	return int64((ttl + time.Millisecond - 1) / time.Millisecond)
}

// Replicate decodes the counters; a malformed one is refused (counted,
// logged once per call with the first bad index and why) and not given to
// the PeerHandler, which gets the valid ones.
func (g *Server) Replicate(ctx context.Context, req *sluicev1.ReplicateRequest) (*sluicev1.ReplicateResponse, error) {
	h := g.cfg.Peer
	if h == nil {
		return nil, status.Error(codes.Unimplemented, "replication is not available on this server")
	}
	from, ms := req.GetFrom(), req.GetCounters()
	if err := g.sameCluster("replicate", from, req.GetCluster()); err != nil {
		return nil, err
	}
	if len(ms) > MaxCounters {
		g.log.Warn("refused replication", "from", from, "counters", len(ms))
		return nil, tooManyCounters(len(ms))
	}
	var handoff bool
	switch k := req.GetKind(); k {
	case sluicev1.ReplicateRequest_KIND_REPLICA:
	case sluicev1.ReplicateRequest_KIND_HANDOFF:
		handoff = true
	default:
		g.log.Warn("refused replication", "from", from, "kind", int32(k))
		return nil, status.Errorf(codes.InvalidArgument, "unknown replication kind %d", k)
	}

	counters := make([]bucket.Counter, 0, len(ms))
	var refused, first int
	var why error
	for i, m := range ms {
		c, err := CounterFromProto(m)
		if err != nil {
			if refused == 0 {
				first, why = i, err
			}
			refused++
			continue
		}
		counters = append(counters, c)
	}
	if refused > 0 {
		g.log.Warn("refused malformed counters", "from", from, "refused", refused, "of", len(ms), "index", first, "reason", why)
	}
	var installed, stale int
	if len(counters) > 0 {
		installed, stale = h.Replicate(ctx, from, handoff, counters)
	}
	return &sluicev1.ReplicateResponse{Installed: int64(installed), Stale: int64(stale), Refused: int64(refused)}, nil
}

// Pull validates every key (one bad key refuses the call), asks the
// PeerHandler and answers one Counter per key, in order.
func (g *Server) Pull(ctx context.Context, req *sluicev1.PullRequest) (*sluicev1.PullResponse, error) {
	h := g.cfg.Peer
	if h == nil {
		return nil, status.Error(codes.Unimplemented, "pull is not available on this server")
	}
	from, ks := req.GetFrom(), req.GetKeys()
	if err := g.sameCluster("pull", from, req.GetCluster()); err != nil {
		return nil, err
	}
	if len(ks) > MaxCounters {
		g.log.Warn("refused pull", "from", from, "keys", len(ks))
		return nil, tooManyCounters(len(ks))
	}
	fromAddr := req.GetFromAddr()
	if fromAddr != "" {
		if err := checkHostPort(fromAddr); err != nil {
			g.log.Warn("refused pull", "from", from, "reason", "from_addr: "+err.Error())
			return nil, status.Errorf(codes.InvalidArgument, "from_addr: %v", err)
		}
	}
	keys := make([]bucket.Counter, len(ks))
	for i, k := range ks {
		if err := bucket.ValidateCounterKey(k.GetName(), k.GetKey()); err != nil {
			g.log.Warn("refused pull", "from", from, "index", i, "reason", err)
			return nil, status.Errorf(codes.InvalidArgument, "key %d: %v", i, err)
		}
		keys[i] = bucket.Counter{Name: k.GetName(), Key: k.GetKey()}
	}
	resp := &sluicev1.PullResponse{}
	if len(keys) == 0 {
		return resp, nil
	}
	ans := make([]keymove.PullAnswer, len(keys))
	h.Pull(ctx, from, fromAddr, keys, req.GetRelease(), releaseTTL(req.GetReleaseTtlMs()), ans)

	msgs := make([]sluicev1.Counter, len(keys))
	resp.Counters = make([]*sluicev1.Counter, len(keys))
	for i := range keys {
		m := &msgs[i]
		m.Name, m.Key, m.Version = ks[i].GetName(), ks[i].GetKey(), keys[i].Version
		if m.Version != 0 {
			m.State, _ = keys[i].State.MarshalBinary() // never fails
		}
		resp.Counters[i] = m
		a := &ans[i]
		if a.MovedTo != "" && resp.MovedTo == nil {
			resp.MovedTo = make([]string, len(keys))
		}
		if resp.MovedTo != nil {
			resp.MovedTo[i] = a.MovedTo
		}
		for _, hd := range a.Holders[:min(len(a.Holders), keymove.MaxHolders)] {
			resp.Holders = append(resp.Holders, &sluicev1.PullHolder{Index: uint32(i), Addr: hd.Addr, Release: hd.Release})
		}
	}
	return resp, nil
}

// bulkDeadline is ctx when it has a deadline, else ctx bounded by d.
func bulkDeadline(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, noop
	}
	return context.WithTimeout(ctx, d)
}

// Replicate sends counters to the node at addr (Peer/Replicate), which
// installs those newer than what it holds; handoff tells it that it now owns
// them. The counters go in RPCs of at most MaxCounters counters and about
// 2 MiB each, one after another on addr's connection; installed and stale
// are summed over the RPCs that answered. The call ends by ctx's deadline,
// or BulkTimeout when ctx has none. Counters the peer refused as malformed
// are an error (after the other chunks are sent); so is an RPC's failure,
// which stops the call (the counts then cover the chunks before it).
func (pc *PeerClient) Replicate(ctx context.Context, addr string, handoff bool, counters []bucket.Counter) (installed, stale int, err error) {
	if len(counters) == 0 {
		return 0, 0, nil
	}
	p, err := pc.peer(addr)
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := bulkDeadline(ctx, pc.bulkTimeout)
	defer cancel()
	dl, _ := ctx.Deadline()

	req := &sluicev1.ReplicateRequest{From: pc.name, Cluster: pc.cluster, Kind: sluicev1.ReplicateRequest_KIND_REPLICA}
	if handoff {
		req.Kind = sluicev1.ReplicateRequest_KIND_HANDOFF
	}
	var enc counterEncoder
	var refused int64
	for start := 0; start < len(counters); {
		end := pc.chunkEnd(counters, start)
		req.Counters = enc.encode(counters[start:end])
		resp, err := p.client.Replicate(ctx, req)
		if err != nil {
			return installed, stale, fmt.Errorf("transport: replicate %d counters to %s: %w", len(counters), addr, callerErr(ctx, dl, err))
		}
		installed += int(resp.GetInstalled())
		stale += int(resp.GetStale())
		refused += resp.GetRefused()
		start = end
	}
	if refused > 0 {
		return installed, stale, fmt.Errorf("transport: replicate to %s: peer refused %d of %d counters as malformed", addr, refused, len(counters))
	}
	return installed, stale, nil
}

// chunkEnd is the end of the Replicate chunk that begins at cs[start]: at
// most maxCounters counters and, beyond the first, maxChunkBytes estimated
// wire bytes.
func (pc *PeerClient) chunkEnd(cs []bucket.Counter, start int) int {
	end, size := start, 0
	for end < len(cs) && end-start < pc.maxCounters {
		c := &cs[end]
		n := counterOverhead + len(c.Name) + len(c.Key) + c.State.EncodedLen()
		if end > start && size+n > maxChunkBytes {
			break
		}
		size += n
		end++
	}
	return end
}

// counterEncoder builds the wire counters of successive chunks, reusing its
// messages and one state buffer per chunk.
type counterEncoder struct {
	msgs []sluicev1.Counter
	ptrs []*sluicev1.Counter
	buf  []byte
}

// encode returns cs as wire counters, valid until the next encode.
func (e *counterEncoder) encode(cs []bucket.Counter) []*sluicev1.Counter {
	n, size := len(cs), 0
	for i := range cs {
		size += cs[i].State.EncodedLen()
	}
	if cap(e.msgs) < n {
		e.msgs = make([]sluicev1.Counter, n)
		e.ptrs = make([]*sluicev1.Counter, n)
	}
	if cap(e.buf) < size {
		e.buf = make([]byte, 0, size)
	}
	e.msgs, e.ptrs, e.buf = e.msgs[:n], e.ptrs[:n], e.buf[:0]
	for i := range cs {
		c, m := &cs[i], &e.msgs[i]
		m.Name, m.Key, m.Version, m.State = c.Name, c.Key, c.Version, nil
		if c.Version != 0 {
			off := len(e.buf)
			e.buf, _ = c.State.AppendBinary(e.buf) // never fails
			m.State = e.buf[off:len(e.buf):len(e.buf)]
		}
		e.ptrs[i] = m
	}
	return e.ptrs
}

// Pull asks the node at addr for its counters of keys (Peer/Pull) and fills
// each element's State and Version in place (Version 0: it holds none); only
// Name and Key are read. It fills ans[i] (len(ans) == len(keys)) with what
// the answer says about keys[i] besides: moved_to and holders. With
// release, that node stops deciding those keys for ttl (clamped to
// MaxReleaseTTL) and redirects them here. Keys go in one RPC, or several of
// at most MaxCounters keys; an RPC whose answer is too large for the 4 MiB
// message limit (big sliding logs) is retried as two halves. The call ends
// by ctx's deadline, or Timeout when ctx has none.
//
// keys and ans are changed only when every answer arrived and is well
// formed: a count or key that does not match the question, a state that
// does not decode, a moved_to of the wrong length or a bad holder is an
// error and nothing is filled.
func (pc *PeerClient) Pull(ctx context.Context, addr string, keys []bucket.Counter, release bool, ttl time.Duration, ans []keymove.PullAnswer) error {
	if len(ans) != len(keys) {
		return fmt.Errorf("transport: pull: %d keys but %d answers", len(keys), len(ans))
	}
	if len(keys) == 0 {
		return nil
	}
	p, err := pc.peer(addr)
	if err != nil {
		return err
	}
	ctx, cancel := bulkDeadline(ctx, pc.timeout)
	defer cancel()
	dl, _ := ctx.Deadline()

	got := make([]bucket.Counter, len(keys))
	gotAns := make([]keymove.PullAnswer, len(keys))
	msgs := make([]sluicev1.CounterKey, len(keys))
	ptrs := make([]*sluicev1.CounterKey, len(keys))
	for i := range keys {
		msgs[i].Name, msgs[i].Key = keys[i].Name, keys[i].Key
		ptrs[i] = &msgs[i]
	}
	req := &sluicev1.PullRequest{From: pc.name, FromAddr: pc.addr, Cluster: pc.cluster, Release: release, ReleaseTtlMs: releaseTTLMS(ttl)}
	size := pc.maxCounters
	for start := 0; start < len(keys); {
		end := min(start+size, len(keys))
		req.Keys = ptrs[start:end]
		resp, err := p.client.Pull(ctx, req)
		if err != nil {
			if status.Code(err) == codes.ResourceExhausted && end-start > 1 && ctx.Err() == nil {
				size = (end - start) / 2
				continue
			}
			return fmt.Errorf("transport: pull %d keys from %s: %w", len(keys), addr, callerErr(ctx, dl, err))
		}
		if err := decodePull(resp.GetCounters(), keys[start:end], got[start:end]); err != nil {
			return fmt.Errorf("transport: pull from %s: %w", addr, err)
		}
		if mv := resp.GetMovedTo(); len(mv) > 0 {
			if len(mv) != end-start {
				return fmt.Errorf("transport: pull from %s: %d moved_to entries for %d keys", addr, len(mv), end-start)
			}
			for i, a := range mv {
				gotAns[start+i].MovedTo = a
			}
		}
		if err := decodeHolders(resp.GetHolders(), gotAns[start:end]); err != nil {
			return fmt.Errorf("transport: pull from %s: %w", addr, err)
		}
		start = end
	}
	for i := range keys {
		keys[i].State, keys[i].Version = got[i].State, got[i].Version
	}
	copy(ans, gotAns)
	return nil
}

// decodeHolders checks a pull answer's holders (each names one of the
// keys asked, by index, and a host:port; at most keymove.MaxHolders per
// key) and adds them to got. A bad entry refuses the whole answer.
func decodeHolders(hs []*sluicev1.PullHolder, got []keymove.PullAnswer) error {
	if len(hs) > keymove.MaxHolders*len(got) {
		return fmt.Errorf("%d holders for %d keys (at most %d per key)", len(hs), len(got), keymove.MaxHolders)
	}
	per := make(map[uint32]int)
	for j, h := range hs {
		i := h.GetIndex()
		if int64(i) >= int64(len(got)) {
			return fmt.Errorf("holder %d names key %d of %d", j, i, len(got))
		}
		if err := checkHostPort(h.GetAddr()); err != nil {
			return fmt.Errorf("holder %d: %w", j, err)
		}
		if per[i]++; per[i] > keymove.MaxHolders {
			return fmt.Errorf("more than %d holders for key %d", keymove.MaxHolders, i)
		}
	}
	for _, h := range hs { // all checked: nothing is added from a refused answer
		i := h.GetIndex()
		got[i].Holders = append(got[i].Holders, keymove.Holder{Addr: h.GetAddr(), Release: h.GetRelease()})
	}
	return nil
}

// checkHostPort checks that addr is a host:port of a sane length.
func checkHostPort(addr string) error {
	if len(addr) == 0 || len(addr) > 261 {
		return fmt.Errorf("address of %d bytes", len(addr))
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("address %q is not host:port", addr)
	}
	return nil
}

// decodePull checks and decodes the answers ms to the question keys into got.
func decodePull(ms []*sluicev1.Counter, keys, got []bucket.Counter) error {
	if len(ms) != len(keys) {
		return fmt.Errorf("peer answered %d of %d keys", len(ms), len(keys))
	}
	for i, m := range ms {
		if m.GetName() != keys[i].Name || m.GetKey() != keys[i].Key {
			return fmt.Errorf("answer %d is for another key", i)
		}
		c, err := CounterFromProto(m)
		if err != nil {
			return fmt.Errorf("answer %d: %w", i, err)
		}
		got[i] = c
	}
	return nil
}
