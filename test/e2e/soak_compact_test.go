package e2e

// The soak's forced compactions ("the soak ... adds forced compactions to its
// faults"). A compaction only forces a 410 on a watch served by etcd: the watch cache serves
// a resume from its own window whatever etcd compacted, and a live etcd watch is not ended by
// a compaction (TestAbsorbGoneCompaction shows both). So the soak's apiservers run with the
// watch cache off for one resource, soakCompactResource, on all three (goneHere retries a 410
// on the other apiservers first: only a 410 that every apiserver gives reaches the feed), and
// a few informers of the soak's namespace watch it through watchsan while soakSecrets writes
// it, only during the compaction faults (the extra load is a handful of quiet watches and a
// few writes per fault).
//
// The fault: every fault layer refuses new watches (503) and cuts every connection, so every
// watch breaks, quiet ones too; the secrets change (soakSecrets.outage: updates, a delete, a
// create, a create-then-delete); etcd is compacted at its current revision, past every
// resume point; the layers let watches through again. Every secrets watch's resume is then
// answered 410 by every apiserver. A feed with a complete state absorbs it: the private JSON
// watch-list "secrets/json" (a token of its own), "secrets/protobuf" (on the lent identity in
// the sharing soak, where its watch-list hands off onto a shared feed, which takes its state),
// both with watches that time out after 15 minutes so that each stays one stream, and the
// sharing soak's shared JSON feed. The soak fails if a compaction fault produced no 410 at all
// (a fault that tested nothing), if either one-stream informer relisted, and on any lost,
// duplicated or regressing event of the secrets informers, as for the configmaps'. The shared
// informers' relists are reported, not failed: one whose re-watch came in during an absorb,
// or from below its list's resourceVersion after it, gets a private feed without a state
// (docs/design.md section 12), and its 410 then reaches it.
//
// This is the one fault that touches all three apiservers at once, for as long as the
// outage's writes and the compaction take (well under a second): it stands for etcd, which
// they share.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/internal/watch"
	"github.com/watchsan/watchsan/test/cluster"
)

const (
	// soakCompactResource is the resource whose watch cache the soak's apiservers run without.
	soakCompactResource = "secrets"
	// soakSecretObjects is how many secrets soakSecrets cycles through (create, update,
	// update, delete, ...), a few per compaction fault.
	soakSecretObjects = 6
	// soakSecretsPerOutage is how many of them each compaction fault's outage changes.
	soakSecretsPerOutage = 3
	// soakSecretsAbsorbing and soakSecretsAbsorbingProto are the secrets informers whose
	// feeds must absorb (each one stream for the soak's length).
	soakSecretsAbsorbing      = "secrets/json"
	soakSecretsAbsorbingProto = "secrets/protobuf"
)

// soakCompactFlag is the apiserver flag that serves soakCompactResource's watches from etcd.
const soakCompactFlag = "--watch-cache-sizes=" + soakCompactResource + "#0"

// soakCompaction is what one compaction fault did and caused.
type soakCompaction struct {
	rev     string             // the revision etcd was compacted at
	gone    map[string]float64 // watchsan_watch_gone_absorbed_total's increase, by outcome
	relists int64              // the secrets informers' relists it caused
}

func (c soakCompaction) gones() float64 {
	var n float64
	for _, v := range c.gone {
		n += v
	}
	return n
}

// startSecretInformers starts the secrets informers through watchsan: soakSecretsAbsorbing
// with own (a client config with the admin token of its own) and a protobuf one with cfg (the
// soak's client config: in the sharing soak without a token, on the lent identity), both with
// watches that time out after 15 minutes (their streams stay the watch-lists' for the soak),
// and in the sharing soak two JSON ones with cfg that re-watch every soakShareRewatch and so
// share a feed. The JSON one has a token of its own, so that its watch-list stays private; the
// protobuf one's, on the lent identity, hands off onto a shared feed once its initial events
// are over (design.md section 11), which takes its state (section 12): both absorb.
func (s *soak) startSecretInformers(own, cfg *rest.Config, ns string) {
	add := func(name string, base *rest.Config, cd sanCodec, rewatch time.Duration) {
		c := rest.CopyConfig(base)
		c.ContentType, c.AcceptContentTypes = cd.contentType, cd.accept
		s.secInfs = append(s.secInfs, startCountingInformerOf(s.t, name, c, ns, soakCompactResource, rewatch))
	}
	add(soakSecretsAbsorbing, own, sanCodecJSON, 15*time.Minute)
	add(soakSecretsAbsorbingProto, cfg, sanCodecProtobuf, 15*time.Minute)
	if s.share {
		for i := range 2 {
			add(fmt.Sprintf("secrets/json-shared#%d", i+1), cfg, sanCodecJSON, soakShareRewatch)
		}
	}
}

// compact is the compaction fault (see the top of this file).
func (s *soak) compact() {
	s.setFault("compact")
	gone0 := s.goneByOutcome()
	var relists0 int64
	for _, w := range s.secInfs {
		relists0 += w.relists()
	}
	t0 := time.Now()
	for _, f := range s.fronts {
		f.set(s.t, faults.Faults{Fail503FirstK: 1 << 30})
	}
	for _, f := range s.fronts {
		f.cutConnections()
	}
	changes := s.sec.outage()
	rev := s.sec.revision()
	compactEtcd(s.t, s.c, rev)
	for _, f := range s.fronts {
		f.set(s.t, faults.Faults{})
	}
	held := time.Since(t0)
	caughtUp := s.sec.waitStores(s.secInfs, soakCatchUp)
	gone1 := s.goneByOutcome()
	run := soakCompaction{rev: rev, gone: map[string]float64{}}
	for _, o := range watch.AbsorbOutcomes {
		if d := gone1[o] - gone0[o]; d != 0 {
			run.gone[o] = d
		}
	}
	for _, w := range s.secInfs {
		run.relists += w.relists()
	}
	run.relists -= relists0
	s.mu.Lock()
	s.compactions = append(s.compactions, run)
	s.mu.Unlock()
	s.logf("compact: every watch cut and held off for %v, %s, etcd compacted at %s; 410s at resume: %s; secrets informers relisted %d times; their stores equal a fresh list: %v",
		held.Round(time.Millisecond), changes, rev, outcomes(run.gone), run.relists, caughtUp)
	if !caughtUp {
		s.t.Errorf("compaction at %s: the secrets informers' stores did not equal a fresh list within %v", rev, soakCatchUp)
	}
}

// goneByOutcome reads watchsan_watch_gone_absorbed_total by outcome.
func (s *soak) goneByOutcome() map[string]float64 {
	m := map[string]float64{}
	for _, o := range watch.AbsorbOutcomes {
		m[o] = s.p.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": o})
	}
	return m
}

// outcomes renders counts by outcome, e.g. "absorbed=1 format=1"; "none" when empty.
func outcomes(m map[string]float64) string {
	var parts []string
	for _, o := range watch.AbsorbOutcomes {
		if v := m[o]; v != 0 {
			parts = append(parts, fmt.Sprintf("%s=%v", o, v))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// finishSecrets waits for the secrets informers to equal a fresh list and audits them; it
// returns the audits, in s.secInfs' order.
func (s *soak) finishSecrets() []soakAudit {
	if !s.sec.waitStores(s.secInfs, soakCatchUp) {
		s.t.Errorf("the end: the secrets informers' stores did not equal a fresh list within %v", soakCatchUp)
	}
	audits := make([]soakAudit, len(s.secInfs))
	for i, w := range s.secInfs {
		audits[i] = auditHistory(s.sec.history(), w.history(), w.req.relists())
	}
	return audits
}

// checkCompactions fails the soak on a compaction fault that produced no 410, on a relist of
// an informer whose feed absorbs, and on the secrets informers' audits.
func (s *soak) checkCompactions(audits []soakAudit) {
	s.mu.Lock()
	runs := slices.Clone(s.compactions)
	s.mu.Unlock()
	if s.kinds["compact"] > 0 && len(runs) == 0 {
		s.t.Errorf("compaction faults ran but none was recorded")
	}
	for i, r := range runs {
		if r.gones() == 0 {
			s.t.Errorf("compaction fault %d (at %s): no resume was answered 410 (watchsan_watch_gone_absorbed_total did not move): the fault tested nothing", i+1, r.rev)
		}
	}
	for i, w := range s.secInfs {
		if (w.name == soakSecretsAbsorbing || w.name == soakSecretsAbsorbingProto) && w.relists() != 0 {
			s.t.Errorf("%s relisted %d times; its feed (its watch-list's, with a complete state) absorbs a 410 (%s)", w.name, w.relists(), w.counts())
		}
		if a := audits[i]; a.failed() {
			s.t.Errorf("%s: %d lost, %d duplicated, %d regressing (%d per object, %d across objects), %d unexpected, %d with the wrong type; first problems:\n  %s",
				w.name, a.lost-a.excused, a.dups, a.regress+a.reorder, a.regress, a.reorder, a.unknown, a.wrongType, strings.Join(a.problems, "\n  "))
		}
	}
}

// compactReport is the report's part on the compaction faults and the secrets informers
// (audits nil when the soak stopped early).
func (s *soak) compactReport(b *strings.Builder, audits []soakAudit) {
	s.mu.Lock()
	runs := slices.Clone(s.compactions)
	s.mu.Unlock()
	total := map[string]float64{}
	var perFault []string
	for _, r := range runs {
		for o, v := range r.gone {
			total[o] += v
		}
		perFault = append(perFault, fmt.Sprintf("%s: %v (%s)", r.rev, r.gones(), outcomes(r.gone)))
	}
	fmt.Fprintf(b, "compaction faults: %d; 410s at resume in them: %s; per fault (compacted at: 410s): %s\n", len(runs), outcomes(total), strings.Join(perFault, ", "))
	fmt.Fprintf(b, "410s at resume in the whole soak (watchsan_watch_gone_absorbed_total): %s; events synthesized: ADDED %v MODIFIED %v DELETED %v\n",
		outcomes(s.goneByOutcome()),
		s.p.Metric("watchsan_watch_absorb_events_total", map[string]string{"type": "ADDED"}),
		s.p.Metric("watchsan_watch_absorb_events_total", map[string]string{"type": "MODIFIED"}),
		s.p.Metric("watchsan_watch_absorb_events_total", map[string]string{"type": "DELETED"}))
	fmt.Fprintf(b, "%s informers (watch cache off; %d changes written):\n", soakCompactResource, s.sec.count())
	fmt.Fprintf(b, "%-22s %6s %6s %5s %10s %5s %8s %8s %8s %9s %7s\n", "informer", "seen", "lost", "dup", "regressing", "unexp", "excused", "resyncs", "tombst", "re-watches", "relists")
	for i, w := range s.secInfs {
		if audits == nil {
			fmt.Fprintf(b, "%-22s %68s %9d %7d\n", w.name, "", w.req.rewatches.Load(), w.relists())
			continue
		}
		a := audits[i]
		fmt.Fprintf(b, "%-22s %6d %6d %5d %10d %5d %8d %8d %8d %9d %7d\n", w.name, a.seen, a.lost-a.excused, a.dups,
			a.regress+a.reorder, a.unknown, a.excused, a.resyncs, a.tombstones, w.req.rewatches.Load(), w.relists())
	}
}

// ---- the secrets writer ----

// soakSecrets writes the soak's secrets, directly on the apiservers, only while a compaction
// fault holds every watch off (and once before the informers start), and records every change
// as recordingWriter does, so that auditHistory can check the informers. Every apiserver is up
// then; a failed write fails the soak.
type soakSecrets struct {
	t   *testing.T
	ns  string
	cs  []kubernetes.Interface // one per apiserver
	seq int
	// cur is each object's state now (nil: absent), updates how often it was updated since its
	// create; next is the pool index the next outage starts at; outages counts them.
	cur     map[string]*corev1.Secret
	updates map[string]int
	next    int
	outages int
	ops     map[string][]cmChange
	changes int
}

func newSoakSecrets(t *testing.T, c *cluster.Cluster, ns string) *soakSecrets {
	s := &soakSecrets{t: t, ns: ns, cur: map[string]*corev1.Secret{}, updates: map[string]int{}, ops: map[string][]cmChange{}}
	for i := range c.APIServers {
		cs, err := kubernetes.NewForConfig(c.RESTConfig(i, c.AdminToken))
		if err != nil {
			t.Fatal(err)
		}
		s.cs = append(s.cs, cs)
	}
	for i := range soakSecretObjects {
		s.step(fmt.Sprintf("sec-%d", i))
	}
	return s
}

func (s *soakSecrets) api() interface {
	Create(context.Context, *corev1.Secret, metav1.CreateOptions) (*corev1.Secret, error)
	Update(context.Context, *corev1.Secret, metav1.UpdateOptions) (*corev1.Secret, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
	List(context.Context, metav1.ListOptions) (*corev1.SecretList, error)
} {
	return s.cs[(s.seq+s.outages)%len(s.cs)].CoreV1().Secrets(s.ns)
}

func (s *soakSecrets) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	s.t.Cleanup(cancel)
	return ctx
}

// step moves object name on: created when absent, else updated twice, then deleted.
func (s *soakSecrets) step(name string) string {
	s.t.Helper()
	cur := s.cur[name]
	s.seq++
	seq := strconv.Itoa(s.seq)
	switch {
	case cur == nil:
		o, err := s.api().Create(s.ctx(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string][]byte{"seq": []byte(seq)}}, metav1.CreateOptions{})
		if err != nil {
			s.t.Fatalf("creating secret %s: %v", name, err)
		}
		s.cur[name], s.updates[name] = o, 0
		s.record(cmChange{Type: "ADDED", Name: name, RV: o.ResourceVersion, Seq: seq, At: time.Now()})
		return "create " + name
	case s.updates[name] < 2:
		next := cur.DeepCopy()
		next.Data = map[string][]byte{"seq": []byte(seq)}
		o, err := s.api().Update(s.ctx(), next, metav1.UpdateOptions{})
		if err != nil {
			s.t.Fatalf("updating secret %s: %v", name, err)
		}
		s.cur[name] = o
		s.updates[name]++
		s.record(cmChange{Type: "MODIFIED", Name: name, RV: o.ResourceVersion, Seq: seq, At: time.Now()})
		return "update " + name
	default:
		if err := s.api().Delete(s.ctx(), name, metav1.DeleteOptions{}); err != nil {
			s.t.Fatalf("deleting secret %s: %v", name, err)
		}
		delete(s.cur, name)
		s.record(cmChange{Type: "DELETED", Name: name, Seq: string(cur.Data["seq"]), At: time.Now()})
		return "delete " + name
	}
}

func (s *soakSecrets) record(c cmChange) {
	s.ops[c.Name] = append(s.ops[c.Name], c)
	s.changes++
}

// outage makes one compaction fault's changes: soakSecretsPerOutage objects each moved on
// one step, and a create-then-delete no informer may see (in no list, and no watch is
// through). It says what it did.
func (s *soakSecrets) outage() string {
	s.t.Helper()
	var did []string
	for k := range soakSecretsPerOutage {
		did = append(did, s.step(fmt.Sprintf("sec-%d", (s.next+k)%soakSecretObjects)))
	}
	s.next += soakSecretsPerOutage
	s.outages++
	brief := fmt.Sprintf("brief-%d", s.outages)
	if _, err := s.api().Create(s.ctx(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: brief}}, metav1.CreateOptions{}); err != nil {
		s.t.Fatalf("creating secret %s: %v", brief, err)
	}
	if err := s.api().Delete(s.ctx(), brief, metav1.DeleteOptions{}); err != nil {
		s.t.Fatalf("deleting secret %s: %v", brief, err)
	}
	return strings.Join(append(did, "create-then-delete "+brief), ", ")
}

// revision is etcd's current revision: a consistent list of the secrets, served by etcd (the
// watch cache is off for them), is at it.
func (s *soakSecrets) revision() string {
	s.t.Helper()
	l, err := s.api().List(s.ctx(), metav1.ListOptions{Limit: 1})
	if err != nil {
		s.t.Fatalf("listing secrets: %v", err)
	}
	return l.ResourceVersion
}

// list is a fresh list in countedStore's form.
func (s *soakSecrets) list() (string, error) {
	l, err := s.api().List(s.ctx(), metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	var keys []string
	for _, o := range l.Items {
		keys = append(keys, o.Name+"@"+o.ResourceVersion)
	}
	slices.Sort(keys)
	return strings.Join(keys, " "), nil
}

// waitStores waits up to d until every informer's store equals a fresh list; it reports
// whether it did, and logs the differing stores if not.
func (s *soakSecrets) waitStores(infs []*countingInformer, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		want, err := s.list()
		if err == nil {
			var behind []string
			for _, w := range infs {
				if got := countedStore(w); got != want {
					behind = append(behind, fmt.Sprintf("%s has [%s]", w.name, got))
				}
			}
			if len(behind) == 0 {
				return true
			}
			if time.Now().After(deadline) {
				s.t.Logf("secrets: a fresh list has [%s]; %s", want, strings.Join(behind, "; "))
				for _, w := range infs {
					s.t.Logf("%s", w.counts())
				}
				return false
			}
		} else if time.Now().After(deadline) {
			s.t.Logf("listing secrets: %v", err)
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *soakSecrets) history() map[string][]cmChange {
	out := map[string][]cmChange{}
	for k, v := range s.ops {
		out[k] = slices.Clone(v)
	}
	return out
}

func (s *soakSecrets) count() int { return s.changes }

// countedStore is w's store as "name@resourceVersion", sorted.
func countedStore(w *countingInformer) string {
	var keys []string
	for _, o := range w.informer.GetStore().List() {
		if name, rv, _, ok := countedFacts(o); ok {
			keys = append(keys, name+"@"+rv)
		}
	}
	slices.Sort(keys)
	return strings.Join(keys, " ")
}
