// Package cluster runs a real Kubernetes control plane for tests and demos: one etcd and one or
// more kube-apiservers sharing it, on free loopback ports, with generated certificates, an
// admin credential and a credential limited by RBAC. The binaries come from the pinned build
// cache (`make cluster-bins`); see Binaries.
//
// Every process runs in a process group of its own, is SIGKILLed by the kernel if the program
// that started it dies (Linux), and is killed by Stop, which also removes every file.
package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// AdminUser is the user name of Cluster.AdminToken (group system:masters).
	AdminUser = "admin"
	// LimitedUser is the user name of Cluster.UserToken. RBAC lets it get, list and watch
	// configmaps in LimitedNamespace and nothing else beyond what every authenticated user may
	// do (discovery, /version, self reviews).
	LimitedUser = "limited"
	// LimitedNamespace is the namespace whose configmaps LimitedUser may read.
	LimitedNamespace = "limited"
	// LimitedRole names the Role and RoleBinding that grant LimitedUser its access.
	LimitedRole = "watchsan-limited-reader"

	// DefaultStartTimeout bounds Start when its context has no deadline.
	DefaultStartTimeout = 3 * time.Minute

	// etcdPrefix is the key prefix every apiserver of a cluster shares.
	etcdPrefix = "/registry"
)

// Options configure a cluster. The zero value is one apiserver with default flags, its output in
// log files.
type Options struct {
	// APIServers is how many apiservers share the etcd; 0 means 1.
	APIServers int
	// APIServerFlags are appended to every apiserver's command line, after the harness's own
	// flags (for a single-valued flag the last one wins), e.g. "--shutdown-delay-duration=2s".
	APIServerFlags []string
	// FeatureGates, if set, is passed as --feature-gates to every apiserver, e.g.
	// "CBORServingAndStorage=true" to serve CBOR (alpha in 1.37, off by default).
	FeatureGates string
	// EtcdProxy puts a TCP proxy of its own between each apiserver and etcd, so that a test
	// can cut one apiserver off etcd while it keeps serving (APIServer.PauseEtcd): its watch
	// cache stops advancing, as a lagging apiserver's does.
	EtcdProxy bool
	// BindAddresses, if set, binds apiserver i to BindAddresses[i] (all loopback, e.g.
	// 127.0.0.2), advertised as its address, all on one port; the serving certificate covers
	// them. Empty: every apiserver on 127.0.0.1, each on a port of its own.
	BindAddresses []string
	// Audit gives every apiserver an audit log of its own (APIServer.AuditLog, read with
	// ReadAuditLog): every resource request it receives, at Metadata level (audit.go).
	Audit bool
	// Users are more static-token users, each with its token in Cluster.Tokens, for clients
	// that must be told apart (in an audit log, by RBAC): a controller manager, a scheduler,
	// nodes.
	Users []User
	// AggregatorProxyClient gives every apiserver --proxy-client-cert-file and
	// --proxy-client-key-file, the front-proxy client certificate (FrontProxyCertFile, kubeadm's
	// front-proxy-client): with it the aggregator proxies a request for an APIService's group
	// to the aggregated API server with the requesting user in X-Remote-User and
	// X-Remote-Group, which that server trusts on FrontProxyCAFile. false: no such flags, and
	// an aggregated API server cannot tell the aggregator's requests from anyone's.
	AggregatorProxyClient bool
	// Log, if set, also receives every process's output, each line prefixed with the process
	// name. Output always goes to log files in Dir too (their tails are in start errors and in
	// LogTails); nil means only there. Errors from Log are ignored.
	Log io.Writer
}

// User is a static-token user of Options.Users.
type User struct {
	Name   string
	Groups []string
}

// Cluster is a running control plane. Its exported fields are set by Start and not changed
// after; do not modify them.
type Cluster struct {
	// Dir is the temporary directory with certificates, tokens, etcd's data and the logs; Stop
	// removes it.
	Dir string
	// EtcdURL is etcd's client URL (http, loopback).
	EtcdURL string
	// APIServers are the apiservers, all on one etcd with the same prefix.
	APIServers []*APIServer
	// CAFile and CAData are the one CA that signed the serving certificate every apiserver
	// shares (valid for 127.0.0.1, ::1, localhost and the kubernetes Service) and the admin
	// client certificate.
	CAFile string
	CAData []byte
	// CA is that CA, to issue more certificates the apiservers trust (the apiservers verify
	// kubelets' serving certificates with it too).
	CA *CA
	// AdminToken is a static token of AdminUser, in group system:masters.
	AdminToken string
	// UserToken is a static token of LimitedUser (see LimitedNamespace).
	UserToken string
	// Tokens are the static tokens of Options.Users, by user name.
	Tokens map[string]string
	// AdminCertFile and AdminKeyFile are a client certificate and key for a user in
	// system:masters, for clients that authenticate with certificates.
	AdminCertFile, AdminKeyFile string
	// ServingCertFile and ServingKeyFile are the apiservers' serving certificate and key (valid
	// for 127.0.0.1, ::1 and localhost, signed by CAFile), for test servers on loopback.
	ServingCertFile, ServingKeyFile string
	// FrontProxyCAFile is every apiserver's --requestheader-client-ca-file, and
	// FrontProxyCertFile/KeyFile the client certificate for FrontProxyUser it signed: a request
	// with it is authenticated as X-Remote-User and X-Remote-Group say (frontproxy.go).
	FrontProxyCAFile, FrontProxyCertFile, FrontProxyKeyFile string
	// KubectlPath is the kubectl built with the apiserver.
	KubectlPath string

	bins Bins
	pki  *pki
	// auditPolicy is the policy file with Options.Audit, "" without.
	auditPolicy string
	opts        Options
	logMu       sync.Mutex // serializes writes to opts.Log
	client      *http.Client
	stopOnce    sync.Once
	// pickPorts returns n free loopback ports; nil means freePorts. A hook for tests.
	pickPorts func(n int) ([]int, error)
	// phases records how long each part of Start took, for reports.
	phases []phase

	mu         sync.Mutex // guards the fields below, and every APIServer's and Component's proc
	stopped    bool
	etcd       *proc
	components []*Component // StartComponent
}

// Start starts etcd and the apiservers, waits until every apiserver is ready, and sets up the
// limited user's RBAC (a namespace, a Role and a RoleBinding), waiting until every apiserver
// enforces it. ctx bounds only the start (DefaultStartTimeout if it has no deadline); the
// processes live until Stop. On error nothing is left running and the error carries the tail of
// the failing process's log.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultStartTimeout)
		defer cancel()
	}
	bins, err := Binaries()
	if err != nil {
		return nil, err
	}
	n := max(o.APIServers, 1)
	dir, err := os.MkdirTemp("", "watchsan-cluster-")
	if err != nil {
		return nil, fmt.Errorf("cluster dir: %w", err)
	}
	c := &Cluster{
		Dir:         dir,
		KubectlPath: bins.Kubectl,
		AdminToken:  randomToken(),
		UserToken:   randomToken(),
		bins:        bins,
		opts:        o,
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	if len(o.BindAddresses) > 0 && len(o.BindAddresses) != n {
		return nil, fmt.Errorf("cluster: %d BindAddresses for %d apiservers", len(o.BindAddresses), n)
	}
	if c.pki, err = writePKI(dir, o.BindAddresses); err != nil {
		return nil, err
	}
	c.CAFile, c.CAData, c.CA = c.pki.caPath, c.pki.caData, c.pki.ca
	c.AdminCertFile, c.AdminKeyFile = c.pki.adminCert, c.pki.adminKey
	c.ServingCertFile, c.ServingKeyFile = c.pki.servingCert, c.pki.servingKey
	if err := c.writeFrontProxy(dir); err != nil {
		return nil, fmt.Errorf("front-proxy PKI: %w", err)
	}
	c.client = newProbeClient(c.CAData)
	// --token-auth-file: token,user,uid,"group1,group2"
	tokens := fmt.Sprintf("%s,%s,%s-uid,\"system:masters\"\n%s,%s,%s-uid\n",
		c.AdminToken, AdminUser, AdminUser, c.UserToken, LimitedUser, LimitedUser)
	c.Tokens = map[string]string{}
	for _, u := range o.Users {
		if _, dup := c.Tokens[u.Name]; dup || u.Name == AdminUser || u.Name == LimitedUser || strings.ContainsAny(u.Name, ",\"\n") {
			return nil, fmt.Errorf("cluster: user %q given twice, reserved or not a plain name", u.Name)
		}
		c.Tokens[u.Name] = randomToken()
		tokens += fmt.Sprintf("%s,%s,%s-uid,\"%s\"\n", c.Tokens[u.Name], u.Name, u.Name, strings.Join(u.Groups, ","))
	}
	if err := os.WriteFile(c.tokenFile(), []byte(tokens), 0o600); err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}

	t0 := time.Now()
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	c.phase("etcd", &t0)

	ports, err := c.apiserverPorts(n)
	if err != nil {
		return nil, err
	}
	if o.Audit {
		if c.auditPolicy, err = writeAuditPolicy(dir); err != nil {
			return nil, err
		}
	}
	for i := range n {
		a := &APIServer{Index: i, c: c, LogFile: filepath.Join(dir, fmt.Sprintf("apiserver-%d.log", i)), Address: "127.0.0.1"}
		if o.Audit {
			a.AuditLog = filepath.Join(dir, fmt.Sprintf("audit-%d.log", i))
		}
		if len(o.BindAddresses) > 0 {
			a.Address = o.BindAddresses[i]
		}
		a.setPort(ports[i])
		if o.EtcdProxy {
			if a.etcd, err = newPauseProxy(strings.TrimPrefix(c.EtcdURL, "http://")); err != nil {
				return nil, fmt.Errorf("etcd proxy: %w", err)
			}
		}
		c.APIServers = append(c.APIServers, a)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, a := range c.APIServers {
		wg.Go(func() { errs[i] = a.start(ctx, true) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	c.phase("apiservers", &t0)
	if err := c.bootstrap(ctx); err != nil {
		return nil, err
	}
	c.phase("rbac", &t0)
	return c, nil
}

// Stop kills the components (StartComponent), the apiservers, then etcd, waits for them to exit
// and removes Dir. It is
// idempotent and safe to call from any goroutine; later Restarts fail.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		c.stopped = true
		var procs, components []*proc
		for _, m := range c.components {
			if m.proc != nil {
				components = append(components, m.proc)
			}
		}
		for _, a := range c.APIServers {
			if a.proc != nil {
				procs = append(procs, a.proc)
			}
		}
		etcd := c.etcd
		c.mu.Unlock()

		var wg sync.WaitGroup
		for _, p := range components { // first: they would log every apiserver's end
			wg.Go(p.kill)
		}
		wg.Wait()
		for _, p := range procs {
			wg.Go(p.kill)
		}
		wg.Wait()
		for _, a := range c.APIServers {
			if a.etcd != nil {
				a.etcd.Close()
			}
		}
		if etcd != nil {
			etcd.kill()
		}
		if c.client != nil {
			c.client.CloseIdleConnections()
		}
		_ = os.RemoveAll(c.Dir)
	})
}

// RESTConfig returns a client config for apiserver i authenticating with token (no credentials
// if ""), verifying the serving certificate against the cluster's CA. QPS and Burst are raised
// so tests are not throttled by client-go.
func (c *Cluster) RESTConfig(i int, token string) *rest.Config {
	return &rest.Config{
		Host:            c.APIServers[i].URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), c.CAData...)},
		QPS:             200,
		Burst:           400,
	}
}

// WriteKubeconfig writes a kubeconfig for kubectl or client-go with one context, current, for
// server with token (none if "") and caFile to verify it ("" for an http:// server, or to use
// the system roots). The context's namespace is "default".
func (c *Cluster) WriteKubeconfig(path, server, token, caFile string) error {
	cfg := clientcmdapi.NewConfig()
	cl := clientcmdapi.NewCluster()
	cl.Server = server
	cl.CertificateAuthority = caFile
	user := clientcmdapi.NewAuthInfo()
	user.Token = token
	kctx := clientcmdapi.NewContext()
	kctx.Cluster, kctx.AuthInfo, kctx.Namespace = "watchsan-test", "watchsan-test", "default"
	cfg.Clusters["watchsan-test"] = cl
	cfg.AuthInfos["watchsan-test"] = user
	cfg.Contexts["watchsan-test"] = kctx
	cfg.CurrentContext = "watchsan-test"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// KubectlCmd returns the real kubectl, not yet started, with --kubeconfig=kubeconfig and a
// discovery cache in Dir (pass --cache-dir to change it) before args, and an environment
// without KUBECONFIG and with HOME in Dir. For stdin or streaming output (get --watch).
func (c *Cluster) KubectlCmd(ctx context.Context, kubeconfig string, args ...string) *exec.Cmd {
	home := filepath.Join(c.Dir, "home")
	all := append([]string{"--kubeconfig=" + kubeconfig, "--cache-dir=" + filepath.Join(home, "kube-cache")}, args...)
	cmd := exec.CommandContext(ctx, c.KubectlPath, all...)
	cmd.Env = append(processEnv(), "HOME="+home)
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Kubectl runs the real kubectl (see KubectlCmd) and returns its stdout and stderr. A non-zero
// exit is an error that includes stderr.
func (c *Cluster) Kubectl(ctx context.Context, kubeconfig string, args ...string) ([]byte, []byte, error) {
	cmd := c.KubectlCmd(ctx, kubeconfig, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), stderr.Bytes(), fmt.Errorf("kubectl %s: %w: %s",
			strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), stderr.Bytes(), nil
}

// LogTails returns the last lines of every process's log, for a failure report. Empty after
// Stop.
func (c *Cluster) LogTails(lines int) string {
	var b strings.Builder
	logs := []string{c.etcdLog()}
	for _, a := range c.APIServers {
		logs = append(logs, a.LogFile)
	}
	c.mu.Lock()
	for _, m := range c.components {
		logs = append(logs, m.LogFile)
	}
	c.mu.Unlock()
	for _, l := range logs {
		if t := fileTail(l, lines); t != "" {
			fmt.Fprintf(&b, "--- %s\n%s\n", filepath.Base(l), t)
		}
	}
	return b.String()
}

type phase struct {
	name string
	d    time.Duration
}

// phase records the time since *since under name and resets *since.
func (c *Cluster) phase(name string, since *time.Time) {
	now := time.Now()
	c.phases = append(c.phases, phase{name, now.Sub(*since)})
	*since = now
}

// startReport says how long each part of Start took, e.g. "etcd 0.6s, apiservers 2.1s, rbac 0.3s".
func (c *Cluster) startReport() string {
	var parts []string
	for _, p := range c.phases {
		parts = append(parts, fmt.Sprintf("%s %.1fs", p.name, p.d.Seconds()))
	}
	return strings.Join(parts, ", ")
}

func (c *Cluster) tokenFile() string { return filepath.Join(c.Dir, "tokens.csv") }
func (c *Cluster) etcdLog() string   { return filepath.Join(c.Dir, "etcd.log") }

// logSink returns the extra writer for a process's output, nil without Options.Log.
func (c *Cluster) logSink(name string) io.Writer {
	if c.opts.Log == nil {
		return nil
	}
	return &prefixWriter{mu: &c.logMu, w: c.opts.Log, prefix: []byte(name + " | ")}
}

// startProc starts a process unless the cluster was stopped, and records it with set while
// holding c.mu, so that Stop sees every process that was started.
func (c *Cluster) startProc(name, bin string, args []string, logPath string, set func(*proc)) (*proc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, errors.New("cluster stopped")
	}
	p, err := startProc(name, bin, args, nil, logPath, c.logSink(name))
	if err != nil {
		return nil, err
	}
	set(p)
	return p, nil
}

// startEtcd starts etcd on fresh ports (again on others if a port was taken meanwhile) and
// waits for /health.
func (c *Cluster) startEtcd(ctx context.Context) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var ports []int
		if ports, err = c.freePorts(2); err != nil {
			return err
		}
		clientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
		peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
		data := filepath.Join(c.Dir, "etcd")
		if err := os.RemoveAll(data); err != nil {
			return fmt.Errorf("etcd data dir: %w", err)
		}
		args := []string{
			"--name=watchsan-test",
			"--data-dir=" + data,
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=watchsan-test=" + peerURL,
			"--initial-cluster-state=new",
			"--quota-backend-bytes=" + strconv.Itoa(512<<20),
			"--unsafe-no-fsync", // test data: speed over durability
			"--log-level=warn",
		}
		var p *proc
		if p, err = c.startProc("etcd", c.bins.Etcd, args, c.etcdLog(), func(p *proc) { c.etcd = p }); err != nil {
			return err
		}
		c.EtcdURL = clientURL
		err = waitReady(ctx, p, func(ctx context.Context) error { return c.etcdHealthy(ctx) })
		if err == nil {
			return nil
		}
		if !p.exited() || !addrInUse(p) {
			return err
		}
	}
	return err
}

func (c *Cluster) etcdHealthy(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.EtcdURL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"health":"true"`)) {
		return fmt.Errorf("etcd /health: %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// bootstrap waits for the default namespace, creates the limited user's namespace, Role and
// RoleBinding, and waits until every apiserver lets the limited user list configmaps there
// (each authorizes from its own informer cache).
func (c *Cluster) bootstrap(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	steps := []struct {
		what string
		do   func(context.Context) error
	}{
		{"namespace default", func(ctx context.Context) error {
			_, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
			return err
		}},
		{"namespace " + LimitedNamespace, func(ctx context.Context) error {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
				ObjectMeta: metav1.ObjectMeta{Name: LimitedNamespace}}, metav1.CreateOptions{})
			return ignoreExists(err)
		}},
		{"role " + LimitedRole, func(ctx context.Context) error {
			_, err := cs.RbacV1().Roles(LimitedNamespace).Create(ctx, &rbacv1.Role{
				ObjectMeta: metav1.ObjectMeta{Name: LimitedRole},
				Rules: []rbacv1.PolicyRule{{
					APIGroups: []string{""},
					Resources: []string{"configmaps"},
					Verbs:     []string{"get", "list", "watch"},
				}},
			}, metav1.CreateOptions{})
			return ignoreExists(err)
		}},
		{"rolebinding " + LimitedRole, func(ctx context.Context) error {
			_, err := cs.RbacV1().RoleBindings(LimitedNamespace).Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: LimitedRole},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: LimitedRole},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: LimitedUser}},
			}, metav1.CreateOptions{})
			return ignoreExists(err)
		}},
	}
	for _, s := range steps {
		if err := poll(ctx, s.do); err != nil {
			return fmt.Errorf("bootstrap %s: %w", s.what, err)
		}
	}
	for i, a := range c.APIServers {
		ucs, err := kubernetes.NewForConfig(c.RESTConfig(i, c.UserToken))
		if err != nil {
			return fmt.Errorf("limited client: %w", err)
		}
		if err := poll(ctx, func(ctx context.Context) error {
			_, err := ucs.CoreV1().ConfigMaps(LimitedNamespace).List(ctx, metav1.ListOptions{Limit: 1})
			return err
		}); err != nil {
			return fmt.Errorf("apiserver %d (%s) never granted %s its RBAC: %w", i, a.URL, LimitedUser, err)
		}
	}
	return nil
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// poll runs f every 100 ms until it succeeds or ctx ends; then it returns f's last error.
func poll(ctx context.Context, f func(context.Context) error) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := f(actx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// waitReady polls check every 100 ms until it succeeds, p exits, or ctx ends; the error then
// carries the tail of p's log.
func waitReady(ctx context.Context, p *proc, check func(context.Context) error) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		go func() { // a check must not outlive the process it checks
			select {
			case <-p.done:
				cancel()
			case <-cctx.Done():
			}
		}()
		err := check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%w); log tail:\n%s", p.name, p.exitError(), p.tail(40))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last check: %w); log tail:\n%s", p.name, ctx.Err(), err, p.tail(40))
		case <-t.C:
		}
	}
}

// newProbeClient returns the client for readiness probes, trusting the CA in caPEM.
func newProbeClient(caPEM []byte) *http.Client {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: roots},
			DisableKeepAlives: true, // every probe on a fresh connection: processes come and go
		},
	}
}

// addrInUse reports whether p logged that its port was taken.
func addrInUse(p *proc) bool {
	return strings.Contains(p.output(), "address already in use")
}

func (c *Cluster) freePorts(n int) ([]int, error) {
	if c.pickPorts != nil {
		return c.pickPorts(n)
	}
	return freePorts(n)
}

// apiserverPorts returns a port for each of n apiservers: n distinct free ones, or, with
// BindAddresses, one port free on every address, n times.
func (c *Cluster) apiserverPorts(n int) ([]int, error) {
	if len(c.opts.BindAddresses) == 0 {
		return c.freePorts(n)
	}
	for attempt := 0; attempt < 20; attempt++ {
		ports, err := c.freePorts(1)
		if err != nil {
			return nil, err
		}
		free := true
		for _, addr := range c.opts.BindAddresses {
			l, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(ports[0])))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			out := make([]int, n)
			for i := range out {
				out[i] = ports[0]
			}
			return out, nil
		}
	}
	return nil, errors.New("cluster: no port free on every bind address")
}

// FreePorts returns n distinct loopback ports that were free a moment ago (all held open at once
// so none repeats). A port can be taken again before it is used; starts retry on that.
func FreePorts(n int) ([]int, error) { return freePorts(n) }

func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
