package e2e

// Absorbing a 410 for a client that lists and then watches from its list's resourceVersion
// (docs/design.md section 12, "a client's own list"): kubectl get -w, older reflectors and
// most scripts. Its watch begins at the list's resourceVersion, so the feed never sees the
// objects that did not change since; the state watchsan keeps for it is the client's own list,
// read as it passed through. A real apiserver restarted six times (SIGKILL and SIGTERM
// alternating), with creates, updates, deletes, a create-then-delete and a delete-and-recreate
// made on a second apiserver of the same etcd while the first one is down: every resume from
// before a restart is answered 410 by the restarted watch cache.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
)

// listWatchRestarts is how many times the watched apiserver is restarted.
const listWatchRestarts = 6

// TestAbsorbListThenWatchAcrossRestarts runs three clients that list and then watch from the
// list's resourceVersion through one watchsan in front of apiserver-0 alone, sharing on as by
// default, lending the admin identity to kubectl: a plain JSON client (GET the list, then GET
// ?watch=true from its resourceVersion), the real kubectl get -w (Table rows, its default
// output; listing in pages of 10) and kubectl get -w -o json. Across six
// restarts none may see an ERROR or an end of its watch; the JSON client's store must equal a
// fresh list after every restart, with every change delivered exactly once and no
// resourceVersion going back; both kubectls must show every change made meanwhile.
func TestAbsorbListThenWatchAcrossRestarts(t *testing.T) {
	c, ns, writer, ctx := absorbCluster(t, "listwatch", "", 20*time.Minute)
	cms := writer.CoreV1().ConfigMaps(ns)

	// watchsan lends the admin identity (a kubeconfig naming apiserver-0) to kubectl, which
	// sends no credentials over plain http; the JSON client sends the admin token, its own.
	dir := t.TempDir()
	lent := filepath.Join(dir, "lent.kubeconfig")
	if err := c.WriteKubeconfig(lent, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, append([]string{"--kubeconfig=" + lent}, resilienceFlags...)...)
	jc := startListWatchClient(t, ctx, p.URL, c.AdminToken, ns)
	kc := filepath.Join(dir, "watchsan.kubeconfig")
	if err := c.WriteKubeconfig(kc, p.URL, "", ""); err != nil {
		t.Fatal(err)
	}
	kubectls := []*kubectlWatch{
		// The Table one lists in pages of 10 (the namespace has 25 configmaps): a list in
		// pages, each its own request, kept once its last page is read.
		startKubectlWatch(t, ctx, c, kc, "kubectl get -w --chunk-size=10 (Table)", ns, false, "--chunk-size=10"),
		startKubectlWatch(t, ctx, c, kc, "kubectl get -w -o json", ns, true),
	}
	for _, k := range kubectls {
		if !testutil.Until(30*time.Second, func() bool { return k.seen("ADDED", "cycle-4") }) {
			t.Fatalf("%s printed no ADDED cycle-4 within 30s: ended %v (%s)\nstdout: %s\nstderr: %s", k.name, k.ended(), k.endErr(), lastOf(k.lines(), 5), k.stderr())
		}
	}
	bump := writer.CoreV1().ConfigMaps("default")
	a := c.APIServers[0]
	for round := range listWatchRestarts {
		stoppedAt := time.Now()
		sig := absorbStop(t, a, round)
		if _, err := bump.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "absorb-bump-"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		changes := absorbOutageChanges(t, ctx, cms, round)
		if err := a.Restart(ctxT(t, 2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		want := absorbList(t, ctx, cms)
		if !jc.ended() {
			testutil.Until(90*time.Second, func() bool { return jc.store() == want || jc.ended() })
		}
		seq := fmt.Sprint(round + 1)
		expect := [][2]string{{"ADDED", "new-" + seq}, {"MODIFIED", fmt.Sprintf("keep-%02d", round)}, {"DELETED", fmt.Sprintf("keep-%02d", 19-round)}}
		if round%2 == 0 {
			expect = append(expect, [2]string{"DELETED", fmt.Sprintf("cycle-%d", round/2)})
		}
		for _, k := range kubectls {
			if !k.ended() {
				testutil.Until(90*time.Second, func() bool {
					for _, e := range expect {
						if !k.seen(e[0], e[1]) {
							return k.ended()
						}
					}
					return true
				})
			}
		}
		t.Logf("round %d (%v, changes: %s) after %v: JSON client ended %v, store equal %v; %s",
			round, sig, changes, time.Since(stoppedAt).Round(time.Millisecond), jc.ended(), jc.store() == want, kubectlSummary(kubectls, expect))
	}

	t.Logf("watchsan: %s", resumeSummary(p))
	t.Logf("JSON client: %d events: %s", len(jc.events()), jc.summary())
	if err := jc.endErr(); err != "" {
		t.Errorf("the JSON client's watch ended: %s", err)
	}
	if got, want := jc.store(), absorbList(t, ctx, cms); got != want {
		t.Errorf("the JSON client's store differs from a fresh list:\n store %s\n list  %s", got, want)
	}
	if err := jc.exactlyOnce(); err != "" {
		t.Errorf("the JSON client's events: %s", err)
	}
	for _, k := range kubectls {
		t.Logf("%s: %d lines, last: %s", k.name, len(k.lines()), lastOf(k.lines(), 3))
		if k.ended() {
			t.Errorf("%s ended: %s\nstderr: %s", k.name, k.endErr(), k.stderr())
		}
		for round := range listWatchRestarts {
			seq := fmt.Sprint(round + 1)
			for _, e := range [][2]string{{"ADDED", "new-" + seq}, {"MODIFIED", fmt.Sprintf("keep-%02d", round)}, {"DELETED", fmt.Sprintf("keep-%02d", 19-round)}} {
				if !k.seen(e[0], e[1]) {
					t.Errorf("%s never showed %s %s", k.name, e[0], e[1])
				}
			}
		}
	}
	requireAbsorbed(t, p, "watchsan")
	t.Logf("clients' lists kept as their watches' state: parked %v, over-budget %v, unread %v",
		p.Metric("watchsan_watch_absorb_client_lists_total", map[string]string{"result": "parked"}),
		p.Metric("watchsan_watch_absorb_client_lists_total", map[string]string{"result": "over-budget"}),
		p.Metric("watchsan_watch_absorb_client_lists_total", map[string]string{"result": "unread"}))
	if n := p.Metric("watchsan_watch_relists_forced_total", nil); n != 0 {
		t.Errorf("watchsan told %v clients to relist, want 0", n)
	}
}

func lastOf(s []string, n int) string {
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return strings.Join(s, " | ")
}

func kubectlSummary(ks []*kubectlWatch, expect [][2]string) string {
	var out []string
	for _, k := range ks {
		shown := 0
		for _, e := range expect {
			if k.seen(e[0], e[1]) {
				shown++
			}
		}
		out = append(out, fmt.Sprintf("%s: ended %v, %d of %d changes shown", k.name, k.ended(), shown, len(expect)))
	}
	return strings.Join(out, "; ")
}

// lwObject is what the list-then-watch client reads of an object.
type lwObject struct {
	Metadata struct {
		Name            string `json:"name"`
		UID             string `json:"uid"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
}

// listWatchClient lists a namespace's configmaps in JSON and watches from the list's
// resourceVersion, as a script or kubectl does, keeping a store of name/uid/resourceVersion.
type listWatchClient struct {
	mu    sync.Mutex
	objs  map[string]lwObject
	evs   []string // "TYPE name uid rv", in order
	end   string   // why the watch ended ("": it did not)
	rvs   []uint64 // every event's resourceVersion, in order
	types map[string]int
}

func startListWatchClient(t *testing.T, ctx context.Context, base, token, ns string) *listWatchClient {
	t.Helper()
	c := &listWatchClient{objs: map[string]lwObject{}, types: map[string]int{}}
	get := func(q string) *http.Response {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/namespaces/"+ns+"/configmaps"+q, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Accept", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			t.Fatalf("GET %s: %s %s", q, resp.Status, b)
		}
		return resp
	}
	resp := get("")
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []lwObject `json:"items"`
	}
	err := json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range list.Items {
		c.objs[o.Metadata.Name] = o
	}
	resp = get("?watch=true&resourceVersion=" + list.Metadata.ResourceVersion)
	t.Cleanup(func() { resp.Body.Close() })
	go func() {
		defer resp.Body.Close()
		dec := json.NewDecoder(resp.Body)
		for {
			var ev struct {
				Type   string          `json:"type"`
				Object json.RawMessage `json:"object"`
			}
			err := dec.Decode(&ev)
			c.mu.Lock()
			if err != nil {
				c.end = "the stream ended: " + err.Error()
				c.mu.Unlock()
				return
			}
			var o lwObject
			_ = json.Unmarshal(ev.Object, &o)
			c.types[ev.Type]++
			switch ev.Type {
			case "ADDED", "MODIFIED":
				c.objs[o.Metadata.Name] = o
			case "DELETED":
				delete(c.objs, o.Metadata.Name)
			case "ERROR":
				c.end = "ERROR " + string(ev.Object)
				c.mu.Unlock()
				return
			}
			if ev.Type != "BOOKMARK" {
				c.evs = append(c.evs, fmt.Sprintf("%s %s %s %s", ev.Type, o.Metadata.Name, o.Metadata.UID, o.Metadata.ResourceVersion))
				var rv uint64
				fmt.Sscan(o.Metadata.ResourceVersion, &rv)
				c.rvs = append(c.rvs, rv)
			}
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *listWatchClient) ended() bool { return c.endErr() != "" }

func (c *listWatchClient) endErr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.end
}

func (c *listWatchClient) events() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.evs)
}

func (c *listWatchClient) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.types)
}

// store is the client's objects in absorbList's form.
func (c *listWatchClient) store() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var keys []string
	for _, o := range c.objs {
		keys = append(keys, o.Metadata.Name+"/"+o.Metadata.UID+"/"+o.Metadata.ResourceVersion)
	}
	slices.Sort(keys)
	return strings.Join(keys, " ")
}

// exactlyOnce says what is wrong with the events: a resourceVersion going back, an ADDED or
// MODIFIED of one object at one resourceVersion twice, a second DELETED of one uid.
func (c *listWatchClient) exactlyOnce() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]bool{}
	for i, e := range c.evs {
		if i > 0 && c.rvs[i] < c.rvs[i-1] {
			return fmt.Sprintf("event %d (%s) goes back from %d", i, e, c.rvs[i-1])
		}
		f := strings.Fields(e)
		k := e
		if f[0] == "DELETED" {
			k = "DELETED " + f[2]
		}
		if seen[k] {
			return fmt.Sprintf("event %d (%s) delivered twice", i, e)
		}
		seen[k] = true
	}
	return ""
}

// kubectlWatch is a running kubectl get cm -w --output-watch-events (and extra): its output
// read as events (type and name), in Table rows or, with asJSON, in -o json.
type kubectlWatch struct {
	name   string
	mu     sync.Mutex
	seenEv map[string]bool
	out    []string
	errb   strings.Builder
	done   bool
	err    error
}

func startKubectlWatch(t *testing.T, ctx context.Context, c *cluster.Cluster, kubeconfig, name, ns string, asJSON bool, extra ...string) *kubectlWatch {
	t.Helper()
	args := append([]string{"get", "configmaps", "-n", ns, "-w", "--output-watch-events"}, extra...)
	if asJSON {
		args = append(args, "-o", "json")
	}
	cmd := c.KubectlCmd(ctx, kubeconfig, args...)
	k := &kubectlWatch{name: name, seenEv: map[string]bool{}}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			k.mu.Lock()
			k.errb.WriteString(sc.Text() + "\n")
			k.mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		if asJSON {
			dec := json.NewDecoder(stdout)
			for {
				var ev struct {
					Type   string   `json:"type"`
					Object lwObject `json:"object"`
				}
				if err := dec.Decode(&ev); err != nil {
					return
				}
				k.add(ev.Type, ev.Object.Metadata.Name, fmt.Sprintf("%s %s %s", ev.Type, ev.Object.Metadata.Name, ev.Object.Metadata.ResourceVersion))
			}
		}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) >= 2 {
				k.add(f[0], f[1], sc.Text())
			}
		}
	}()
	go func() {
		wg.Wait()
		err := cmd.Wait()
		k.mu.Lock()
		k.done, k.err = true, err
		k.mu.Unlock()
	}()
	return k
}

func (k *kubectlWatch) add(typ, name, line string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.seenEv[typ+" "+name] = true
	k.out = append(k.out, line)
}

func (k *kubectlWatch) seen(typ, name string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.seenEv[typ+" "+name]
}

func (k *kubectlWatch) ended() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.done
}

func (k *kubectlWatch) endErr() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return fmt.Sprint(k.err)
}

func (k *kubectlWatch) lines() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.out)
}

func (k *kubectlWatch) stderr() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.errb.String()
}
