package server

import (
	"context"
	"net/http"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/coalesce"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
)

// newCoalescer is the coalescer of identical reads (--coalesce-reads, package coalesce), whose
// upstream reads go as the routes would send the request alone: a list at resourceVersion 0
// raised by the time-travel guard (raiseList), every one through the Attempter.
func (s *Server) newCoalescer(mem *budget.Budget) *coalesce.Coalescer {
	for _, k := range coalesce.Kinds {
		s.metrics.CoalescedReads.WithLabelValues(k)
		s.metrics.CoalesceUpstreamReads.WithLabelValues(k)
		s.metrics.CoalesceLagging.WithLabelValues(k)
		s.metrics.CoalesceMembers.WithLabelValues(k)
	}
	for _, r := range coalesce.BypassReasons {
		s.metrics.CoalesceBypassed.WithLabelValues(r)
	}
	return coalesce.New(coalesce.Config{
		MaxMembers: s.cfg.CoalesceMaxMembers,
		MaxGroups:  s.cfg.CoalesceMaxGroups,
		LagBytes:   int64(s.cfg.CoalesceLagBytes),
		TotalBytes: s.cfg.CoalesceTotalBytes,
		Budget:     mem,
	}, s.sendCoalesced, coalesce.Metrics{
		Coalesced:     s.metrics.CoalescedReads,
		UpstreamReads: s.metrics.CoalesceUpstreamReads,
		Members:       s.metrics.CoalesceMembers,
		Lagging:       s.metrics.CoalesceLagging,
		Bypassed:      s.metrics.CoalesceBypassed,
	}, s.log.Named("coalesce"))
}

// sendCoalesced sends one coalesced upstream read r with cred.
func (s *Server) sendCoalesced(ctx context.Context, r *http.Request, cred upstream.Credentials) (*http.Response, func(), error) {
	info := reqinfo.Parse(r)
	r, plan, settle := s.raiseList(r, &info, upstream.Plan{Credentials: cred})
	at, err := s.attempts.Do(ctx, r, plan)
	if err != nil {
		return nil, nil, err
	}
	if settle != nil {
		settle(at.Resp.StatusCode)
	}
	warnLentRefused(at.Resp, cred)
	return at.Resp, func() { at.Cancel(nil) }, nil
}

// serveCoalesced serves a read Classify found coalescable; when a bound keeps it out, as the
// routes after this one would (the list route or the pass-through). A list with credentials of
// its own (a token, an asserted certificate) of a group-version the apiserver serves itself,
// arriving while another request of the same list is served (a storm), shares with every
// identity allowed it, once an access review with its own credentials allowed it
// (docs/design.md section 18); otherwise, or when the review says anything but allowed, only
// with its own principal, and the apiserver answers its read.
func (s *Server) serveCoalesced(w http.ResponseWriter, r *http.Request, c *classified) {
	key := c.coalesceKey
	if rk, ok := coalesce.ReviewedKey(r, c.coalesceKind); ok && !c.cred.Lent() {
		busy, done := s.coalesce.Track(rk)
		defer done()
		if busy && s.local.Local(c.info.APIGroup, c.info.APIVersion) && s.watch.ReviewList(r, &c.info, c.cred) {
			key = rk
		}
		if r.Context().Err() != nil {
			return // the client left during the review
		}
	}
	if s.coalesce.Serve(w, r, key, c.coalesceKind, c.cred) {
		return
	}
	if s.cfg.TimeTravelGuard && c.info.Verb == "list" {
		s.listGuard(w, r, c)
		return
	}
	s.proxy.serve(w, r, c, upstream.Plan{Credentials: c.cred})
}
