package e2e

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
)

// coalesceUpstream puts a fault layer in front of the cluster's first apiserver, passing every
// client's own credentials on; it returns the layer and its URL.
func coalesceUpstream(t *testing.T, c *cluster.Cluster) (*faults.Layer, string) {
	target, err := url.Parse(c.APIServers[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(c.CAData) {
		t.Fatal("cluster CA: no certificate")
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport:     faultLayerTransport(t, roots),
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	layer := faults.New(rp, nil)
	srv := httptest.NewServer(layer)
	t.Cleanup(func() {
		srv.Close()
	})
	return layer, srv.URL
}

// cmPage is as much of a ConfigMapList page as the storm tests read.
type cmPage struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	} `json:"items"`
}

// syncResult is one client's paginated list: its names, the resourceVersion of its snapshot,
// or the status and body of a refusal.
type syncResult struct {
	names map[string]bool
	rv    string
	code  int
	body  string
	ctype string
	err   error
}

// listAll lists base page by page (limit per page) with token, as a reflector's pager does.
func listAll(hc *http.Client, base, token string, limit int) syncResult {
	res := syncResult{names: map[string]bool{}}
	cont := ""
	for page := 0; page < 1000; page++ {
		u := fmt.Sprintf("%s?limit=%d", base, limit)
		if cont != "" {
			u += "&continue=" + url.QueryEscape(cont)
		}
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Accept", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			res.err = err
			return res
		}
		res.code, res.ctype = resp.StatusCode, resp.Header.Get("Content-Type")
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			res.body = string(b)
			return res
		}
		var p cmPage
		err = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if err != nil {
			res.err = fmt.Errorf("page %d: %w", page, err)
			return res
		}
		if page == 0 {
			res.rv = p.Metadata.ResourceVersion
		} else if p.Metadata.ResourceVersion != res.rv {
			res.err = fmt.Errorf("page %d at resourceVersion %s, the first at %s: not one snapshot", page, p.Metadata.ResourceVersion, res.rv)
			return res
		}
		for _, it := range p.Items {
			if res.names[it.Metadata.Name] {
				res.err = fmt.Errorf("%s listed twice", it.Metadata.Name)
				return res
			}
			res.names[it.Metadata.Name] = true
		}
		if cont = p.Metadata.Continue; cont == "" {
			return res
		}
	}
	res.err = fmt.Errorf("more than 1000 pages")
	return res
}

// With --coalesce-reads (on by default), a storm of identical paginated lists of two identities
// allowed to list (each admitted by an access review of its own) goes upstream as a few reads, and the ReadIndex rule holds against the real apiserver: the
// first wave's read is held in flight (its answer, read by the apiserver at once, kept by a
// fault layer) while a configmap is written and a second wave arrives; every client of the
// second wave must see that configmap (a client joining the read already in flight would
// not). A client of another identity without list rights gets the apiserver's own 403 during
// the storm, and identical discovery GETs coalesce too.
func TestCoalescedListStormRealAPIServer(t *testing.T) {
	c := newCluster(t, cluster.Options{Users: []cluster.User{{Name: "storm-nobody"}, {Name: "storm-reader"}}})
	admin, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 4*time.Minute)
	const ns, objects, limit = cluster.LimitedNamespace, 120, 50
	// A second identity with the limited user's rights: both identities' lists share reads.
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "storm-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: cluster.LimitedRole},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "storm-reader"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The apiserver's authorizer learns of the binding from its own informer, seconds later on
	// a loaded machine; an access review before then is rightly denied, and watchsan keeps a
	// denial 30 s (docs/design.md section 11). The storm starts once the apiserver itself
	// lets storm-reader list.
	reader, err := kubernetes.NewForConfig(c.RESTConfig(0, c.Tokens["storm-reader"]))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the apiserver lets storm-reader list", func() bool {
		_, err := reader.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil
	})
	data := map[string]string{"v": strings.Repeat("x", 2048)}
	var wg sync.WaitGroup
	errs := make(chan error, objects)
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < objects; i += 6 {
				if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("storm-%03d", i)}, Data: data}, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	layer, upstreamURL := coalesceUpstream(t, c)
	p := startProxy(t, "--upstream="+upstreamURL, "--no-credentials", "--log-level=info")
	waitUpstreamUp(t, p, upstreamURL)
	base := p.URL + "/api/v1/namespaces/" + ns + "/configmaps"
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	listKind := map[string]string{"kind": "list"}
	coalesced := func() float64 { return p.Metric("watchsan_coalesced_reads_total", listKind) }

	gate := faults.NewGate()
	if err := layer.Set(faults.Faults{HoldListAnswers: gate}); err != nil {
		t.Fatal(err)
	}
	defer gate.Open()
	before := layer.Stats().Requests
	const wave = 30
	results := make([]syncResult, 2*wave)
	var clients sync.WaitGroup
	launch := func(i int, token string) {
		clients.Add(1)
		go func() {
			defer clients.Done()
			results[i] = listAll(hc, base, token, limit)
		}()
	}
	run := func(from int) {
		for i := from; i < from+wave; i++ {
			token := c.UserToken
			if i%2 == 1 {
				token = c.Tokens["storm-reader"]
			}
			launch(i, token)
		}
	}
	// Wave 1: a first list of the limited user, alone (its own principal's read: a lone list
	// costs no review), held in flight; a second one, which finds the first being served and
	// so is reviewed and opens the read shared across identities, held too; then the other
	// identity's 28, each reviewed, which join that shared read's pending one. Without sharing
	// across identities they would send a third read.
	launch(0, c.UserToken)
	eventually(t, 30*time.Second, "the first list held in flight", func() bool { return layer.Stats().ListsHeld >= 1 })
	launch(1, c.UserToken)
	eventually(t, 30*time.Second, "the first shared read held in flight", func() bool { return layer.Stats().ListsHeld >= 2 })
	for i := 2; i < wave; i++ {
		launch(i, c.Tokens["storm-reader"])
	}
	if !testutil.Until(30*time.Second, func() bool { return coalesced() >= wave-3 }) {
		reviews := map[string]float64{}
		for _, r := range []string{"allowed", "denied", "unauthorized", "forbidden", "error", "cached-denied", "coalesced"} {
			reviews[r] = p.Metric("watchsan_shared_feed_access_reviews_total", map[string]string{"result": r})
		}
		t.Fatalf("wave 1: %v of %d lists coalesced after 30 s; access reviews %v; upstream lists %v",
			coalesced(), wave, reviews, p.Metric("watchsan_coalesce_upstream_reads_total", listKind))
	}
	if got := p.Metric("watchsan_coalesce_upstream_reads_total", listKind); got != 2 {
		t.Errorf("%v upstream lists for wave 1, want 2 (the first alone, the rest of both identities shared once reviewed)", got)
	}
	if got := p.Metric("watchsan_shared_feed_access_reviews_total", map[string]string{"result": "allowed"}); got < 1 {
		t.Errorf("%v access reviews allowed, want at least one per identity", got)
	}
	var refused syncResult
	clients.Add(1)
	go func() { // another identity, same path, no rights: the apiserver's own 403
		defer clients.Done()
		refused = listAll(hc, base, c.Tokens["storm-nobody"], limit)
	}()
	eventually(t, 30*time.Second, "the identity without rights' own list sent", func() bool { return layer.Stats().ListsHeld >= 3 })
	late, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "storm-late"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mark := coalesced()
	run(wave)
	eventually(t, 30*time.Second, "wave 2 joined the pending read", func() bool { return coalesced() >= mark+wave })
	gate.Open()
	clients.Wait()

	for i, r := range results {
		if r.err != nil || r.code != http.StatusOK {
			t.Fatalf("client %d: %v, %d %s", i, r.err, r.code, r.body)
		}
		if !strings.HasPrefix(r.ctype, "application/json") {
			t.Errorf("client %d: Content-Type %q, want the apiserver's application/json", i, r.ctype)
		}
		n := 0
		for name := range r.names {
			if strings.HasPrefix(name, "storm-") && name != "storm-late" {
				n++
			}
		}
		if n != objects {
			t.Errorf("client %d listed %d of the %d configmaps", i, n, objects)
		}
		if i >= wave && !r.names["storm-late"] {
			t.Errorf("client %d of wave 2 began after storm-late was written (resourceVersion %s) and got a list at %s without it: a stale answer",
				i, late.ResourceVersion, r.rv)
		}
	}
	if refused.code != http.StatusForbidden || !strings.Contains(refused.body, "storm-nobody") || strings.Contains(refused.body, "storm-0") {
		t.Errorf("the identity without rights got %d %.300s (%v), want the apiserver's 403 naming it and no configmap", refused.code, refused.body, refused.err)
	}
	pages := (objects + 1 + limit - 1) / limit
	clientReads := 2 * wave * pages
	upstream := layer.Stats().Requests - before
	reads := p.Metric("watchsan_coalesce_upstream_reads_total", listKind)
	reviews := p.Metric("watchsan_shared_feed_access_reviews_total", nil) - p.Metric("watchsan_shared_feed_access_reviews_total", map[string]string{"result": "coalesced"})
	t.Logf("%d client list requests: %v upstream lists, %v access reviews, %d requests upstream in all", clientReads, reads, reviews, upstream)
	if reads > float64(clientReads/6) || float64(upstream) > reads+reviews+2 {
		t.Errorf("%v upstream lists (%d requests in all, %v reviews) for %d client list requests: the storm was not coalesced", reads, upstream, reviews, clientReads)
	}
	if lag := p.Metric("watchsan_coalesce_lagging_members_total", nil); lag != 0 {
		t.Errorf("%v members ended for lagging, want 0", lag)
	}

	// Discovery: identical GETs of /apis (aggregated and not) by one principal coalesce.
	if err := layer.Set(faults.Faults{}); err != nil {
		t.Fatal(err)
	}
	discBefore := layer.Stats().Requests
	bodies := make([]string, 40)
	var disc sync.WaitGroup
	for i := range bodies {
		disc.Add(1)
		go func(i int) {
			defer disc.Done()
			req, _ := http.NewRequest(http.MethodGet, p.URL+"/apis", nil)
			req.Header.Set("Authorization", "Bearer "+c.UserToken)
			req.Header.Set("Accept", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json")
			resp, err := hc.Do(req)
			if err != nil {
				bodies[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			bodies[i] = resp.Header.Get("Content-Type") + "\n" + string(b)
		}(i)
	}
	disc.Wait()
	for i, b := range bodies {
		if !strings.Contains(b, "apidiscovery.k8s.io") || !strings.Contains(b, "APIGroupDiscoveryList") {
			t.Fatalf("discovery client %d got %.300s", i, b)
		}
	}
	if got := layer.Stats().Requests - discBefore; got >= int64(len(bodies)) {
		t.Errorf("%d discovery requests reached the apiserver for %d clients", got, len(bodies))
	}
	t.Logf("discovery: %d clients, %d upstream requests", len(bodies), layer.Stats().Requests-discBefore)
	p.requireProxied(float64(clientReads), nil)
}

// A member of a coalesced read that stops reading is ended once it is --coalesce-lag-bytes
// (8 MiB here, of a 21 MiB list: more than a socket absorbs of a client that does not read, less than the list minus that) behind (its response cut: its client sees an error and retries, never a short answer), and
// the member reading along gets the whole answer without waiting for it.
func TestCoalescedReadLaggingMemberRealAPIServer(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	admin, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 4*time.Minute)
	const ns, objects = cluster.LimitedNamespace, 24
	big := map[string]string{"v": strings.Repeat("y", 900<<10)} // 24 x 900 KiB: more than any socket buffers hold
	for i := 0; i < objects; i++ {
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("big-%02d", i)}, Data: big}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	layer, upstreamURL := coalesceUpstream(t, c)
	p := startProxy(t, "--upstream="+upstreamURL, "--no-credentials", "--log-level=info", "--coalesce-lag-bytes=8388608")
	waitUpstreamUp(t, p, upstreamURL)
	gate := faults.NewGate()
	if err := layer.Set(faults.Faults{HoldListAnswers: gate}); err != nil {
		t.Fatal(err)
	}
	defer gate.Open()
	u := p.URL + "/api/v1/namespaces/" + ns + "/configmaps"
	get := func() (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		req.Header.Set("Authorization", "Bearer "+c.UserToken)
		req.Header.Set("Accept", "application/json")
		req.Header.Set("Accept-Encoding", "identity")
		return (&http.Transport{}).RoundTrip(req)
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	// Two first reads, held in flight: the first alone on its principal's key, the second,
	// which finds it served, on the key shared across identities; the two clients below then
	// join that key's pending read together.
	blockerc, slowc, fastc := make(chan answer, 2), make(chan answer, 1), make(chan answer, 1)
	go func() { r, err := get(); blockerc <- answer{r, err} }()
	eventually(t, 30*time.Second, "the first read held", func() bool { return layer.Stats().ListsHeld >= 1 })
	go func() { r, err := get(); blockerc <- answer{r, err} }()
	eventually(t, 30*time.Second, "the second read held", func() bool { return layer.Stats().ListsHeld >= 2 })
	go func() { r, err := get(); slowc <- answer{r, err} }()
	var fastBody bytes.Buffer
	go func() { // reads its answer as it comes, as fast as it can (a decoder under -race is slower than a socket buffer fills)
		r, err := get()
		if err == nil && r.StatusCode == http.StatusOK {
			_, err = io.Copy(&fastBody, r.Body)
			r.Body.Close()
		}
		fastc <- answer{r, err}
	}()
	eventually(t, 30*time.Second, "the two clients joined one pending read", func() bool {
		return p.Metric("watchsan_coalesced_reads_total", map[string]string{"kind": "list"}) >= 1
	})
	gate.Open()
	for i := 0; i < 2; i++ {
		blocker := <-blockerc
		if blocker.err != nil {
			t.Fatal(blocker.err)
		}
		go func() { _, _ = io.Copy(io.Discard, blocker.resp.Body); blocker.resp.Body.Close() }()
	}
	// The slow client reads nothing until the end; the fast one must get everything meanwhile.
	fast := <-fastc
	var fastList cmPage
	if fast.err == nil {
		fast.err = json.Unmarshal(fastBody.Bytes(), &fastList)
	}
	if fast.err != nil || fast.resp.StatusCode != http.StatusOK || len(fastList.Items) != objects {
		t.Fatalf("fast client: %v, %d items, want %d (members ended for lagging: %v)", fast.err, len(fastList.Items), objects,
			p.Metric("watchsan_coalesce_lagging_members_total", nil))
	}
	slow := <-slowc
	if slow.err != nil || slow.resp.StatusCode != http.StatusOK {
		t.Fatalf("slow client: %v %v", slow.err, slow.resp)
	}
	defer slow.resp.Body.Close()
	eventually(t, 30*time.Second, "the slow member ended for lagging", func() bool {
		return p.Metric("watchsan_coalesce_lagging_members_total", map[string]string{"kind": "list"}) >= 1
	})
	if n, err := io.Copy(io.Discard, slow.resp.Body); err == nil {
		t.Errorf("the lagging client read %d bytes and a clean end: a short answer, want an error", n)
	}
}
