package e2e

// The status page in a real browser (docs/operations.md, "The status page"): Debian's
// Chromium, headless, driven over the DevTools protocol (chromedp), loads the admin listener's
// /status from a watchsan whose upstreams are in different states, and the test reads what the
// rendered page shows.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"image/png"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/watchsan/watchsan/test/cluster"
)

var updateScreenshot = flag.Bool("update-status-screenshot", false, "write the status page's screenshot to docs/status-page.png")

// chromium returns the path of Debian's Chromium, skipping the test when it is not installed
// (.ci/run installs it, so CI runs the test).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("chromium is not installed (apt-get install -y chromium chromium-driver; .ci/run installs it): the status page's browser test cannot run")
	return ""
}

// TestStatusPageInBrowser: watchsan in front of three upstreams, a real apiserver (healthy),
// a port nothing listens on (refused) and an endpoint whose certificate a CA watchsan does not
// trust signed (the handshake fails before any request), with a client's watch open through
// it, which resumes across a restart of the apiserver. In headless Chromium the page shows
// each upstream's state and its cause, a feed row for the open watch with its resourceVersion
// and upstream, and the resume; it refreshes itself and loads nothing from elsewhere. The screenshot goes to docs/status-page.png with
// -update-status-screenshot.
func TestStatusPageInBrowser(t *testing.T) {
	browser := chromium(t)
	c := newCluster(t, cluster.Options{APIServers: 1})
	a := c.APIServers[0]
	dir := t.TempDir()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "https://" + ln.Addr().String()
	ln.Close()

	untrustedCA, err := cluster.NewCA(dir, "a-ca-watchsan-does-not-trust")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := untrustedCA.IssueServing("untrusted-upstream")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	tln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	untrusted := "https://" + tln.Addr().String()
	srv := &http.Server{ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no request gets here: the handshake fails", http.StatusServiceUnavailable)
	})}
	go func() { _ = srv.Serve(tln) }()
	t.Cleanup(func() { srv.Close() })

	kc := filepath.Join(dir, "admin.kubeconfig")
	if err := c.WriteKubeconfig(kc, a.URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "--kubeconfig="+kc, "--upstream="+a.URL, "--upstream="+refused, "--upstream="+untrusted,
		"--upstream-ca-file="+c.CAFile, "--allow-credentials-to-upstream="+refused, "--allow-credentials-to-upstream="+untrusted,
		"--health-interval=200ms", "--log-level=info")

	// What the JSON says first: the page is waited for on it, then read in the browser.
	var st struct {
		Upstreams []struct{ Name, State, ErrorKind string } `json:"upstreams"`
		Feeds     struct {
			Feeds []struct{ Resource, Namespace, LastDeliveredRV, Backend string } `json:"feeds"`
		} `json:"feeds"`
	}
	read := func() bool {
		_, body := get(t, p.AdminURL+"/status.json")
		return json.Unmarshal([]byte(body), &st) == nil
	}
	eventually(t, 30*time.Second, "/status.json to show the three states", func() bool {
		if !read() {
			return false
		}
		states := map[string]string{}
		for _, u := range st.Upstreams {
			states[u.Name] = u.State + "/" + u.ErrorKind
		}
		return states[a.URL] == "healthy/" && states[refused] == "unhealthy/refused" && states[untrusted] == "unhealthy/tls"
	})

	// A client's watch through watchsan from a list's resourceVersion: a shared feed.
	ctx := ctxT(t, 3*time.Minute)
	var list struct {
		Metadata struct{ ResourceVersion string } `json:"metadata"`
	}
	code, body := get(t, p.URL+"/api/v1/namespaces/default/configmaps")
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil {
		t.Fatalf("list through watchsan: %d %s", code, body)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/api/v1/namespaces/default/configmaps?watch=true&allowWatchBookmarks=true&resourceVersion="+list.Metadata.ResourceVersion, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("watch through watchsan: %s", resp.Status)
	}
	events := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			select {
			case events <- sc.Text():
			default:
			}
		}
	}()
	cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"status-page"},"data":{"k":"v"}}`
	cresp, err := http.Post(p.URL+"/api/v1/namespaces/default/configmaps", "application/json", strings.NewReader(cm))
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		Metadata struct{ ResourceVersion string } `json:"metadata"`
	}
	_ = json.NewDecoder(cresp.Body).Decode(&created)
	cresp.Body.Close()
	if cresp.StatusCode != 201 {
		t.Fatalf("create through watchsan: %s", cresp.Status)
	}
	select {
	case <-events:
	case <-ctx.Done():
		t.Fatal("the watch got no event")
	}

	eventually(t, 30*time.Second, "/status.json to show the feed at the created resourceVersion", func() bool {
		if !read() {
			return false
		}
		for _, f := range st.Feeds.Feeds {
			if f.Resource == "configmaps" && f.LastDeliveredRV == created.Metadata.ResourceVersion {
				return true
			}
		}
		return false
	})

	// A restart of the apiserver breaks the feed's upstream watch, which resumes: a recent
	// event the page lists.
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := a.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	var recent struct {
		Events []struct{ Kind, Upstream string } `json:"events"`
	}
	eventually(t, 90*time.Second, "/status.json to list the feed's resume and the apiserver healthy again", func() bool {
		_, body := get(t, p.AdminURL+"/status.json")
		if json.Unmarshal([]byte(body), &recent) != nil || !read() {
			return false
		}
		resumed := false
		for _, e := range recent.Events {
			resumed = resumed || e.Kind == "resume" && e.Upstream == a.URL
		}
		healthy := false
		for _, u := range st.Upstreams {
			healthy = healthy || u.Name == a.URL && u.State == "healthy"
		}
		return resumed && healthy
	})

	// The log line of the recovery says what the apiserver was not healthy for.
	recovered := false
	for _, line := range matching(p, "upstream healthy", a.URL) {
		var m map[string]any
		recovered = recovered || json.Unmarshal([]byte(line), &m) == nil && m["after"] != nil && m["was"] != "unknown"
	}
	if !recovered {
		t.Errorf("no 'upstream healthy' line for %s after the restart naming what it was not healthy for (field after)", a.URL)
	}

	// The browser.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 1000), chromedp.Flag("disable-gpu", true))
	actx, cancelA := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	bctx, cancelT := context.WithTimeout(bctx, 90*time.Second)
	defer cancelT()
	row := func(upstream string) chromedp.CSS {
		return chromedp.CSS(fmt.Sprintf(`#upstreams tr[data-upstream=%q]`, upstream))
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(p.AdminURL+"/status"), chromedp.WaitVisible(chromedp.CSS(`#upstreams`))); err != nil {
		t.Fatalf("browser: loading /status: %v", err)
	}
	var failed error
	text := func(sel chromedp.CSS) string {
		v, err := chromedp.Run(bctx, chromedp.Text(sel))
		if err != nil && failed == nil {
			failed = fmt.Errorf("%s: %w", sel, err)
		}
		return v
	}
	title, err := chromedp.Run(bctx, chromedp.Title())
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	healthyRow, refusedRow, untrustedRow := text(row(a.URL)), text(row(refused)), text(row(untrusted))
	feedRow, readiness := text(`#feeds tr[data-resource="configmaps"]`), text(`#readiness`)
	eventRow := text(`#events tr[data-kind="resume"]`)
	if failed != nil {
		t.Fatalf("browser: %v", failed)
	}
	refresh, err := chromedp.Run(bctx, chromedp.AttributeValue(chromedp.CSS(`meta[http-equiv="refresh"]`), "content"))
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	// Anything the page loaded besides itself: scripts, styles, images, frames.
	external, err := chromedp.Run(bctx, chromedp.Evaluate[int](`performance.getEntriesByType("resource").length + document.querySelectorAll("script,link[rel=stylesheet],img,iframe").length`))
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browser: screenshot: %v", err)
	}
	t.Logf("status page %q: readiness %q\n healthy: %s\n refused: %s\n untrusted: %s\n feed: %s\n event: %s",
		title, squash(readiness), squash(healthyRow), squash(refusedRow), squash(untrustedRow), squash(feedRow), squash(eventRow))

	check := func(what, text string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s shows %q; want it to contain %q", what, squash(text), w)
			}
		}
	}
	check("the healthy upstream's row", healthyRow, a.URL, "healthy")
	if strings.Contains(healthyRow, "unhealthy") {
		t.Errorf("the healthy upstream's row says unhealthy: %q", squash(healthyRow))
	}
	check("the refused upstream's row", refusedRow, refused, "unhealthy", "refused", "connection refused")
	check("the untrusted upstream's row", untrustedRow, untrusted, "unhealthy", "tls", "x509: certificate signed by unknown authority")
	check("the feed's row", feedRow, "configmaps", "namespace default", created.Metadata.ResourceVersion, a.URL, "json")
	check("the readiness banner", readiness, "ready")
	check("the resume's row", eventRow, "resume", a.URL)
	if !refresh.Exists || refresh.Value == "" {
		t.Error("the page does not refresh itself (no meta refresh)")
	}
	if external != 0 {
		t.Errorf("the page loaded %d resources besides itself; want none", external)
	}
	if _, err := png.Decode(bytes.NewReader(shot)); err != nil || len(shot) < 10_000 {
		t.Fatalf("screenshot: %d bytes, %v", len(shot), err)
	}
	out := filepath.Join(t.TempDir(), "status-page.png")
	if *updateScreenshot {
		root, err := cluster.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		out = filepath.Join(root, "docs", "status-page.png")
	}
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", out, len(shot))
	p.requireProxied(2, nil) // the list and the create; the watch is counted when it ends
	requireNoPanic(t, p)
}

// squash folds a rendered text's whitespace to single spaces.
func squash(s string) string { return strings.Join(strings.Fields(s), " ") }
