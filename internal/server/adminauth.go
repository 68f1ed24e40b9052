package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/apistatus"
	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/upstream"
)

// The admin listener's authentication off loopback (docs/design.md section 13): a request for
// any path but the probes' (and /metrics, unless config.AdminAuth.Metrics) must carry a bearer
// token that the apiserver authenticates, to a TokenReview, and authorizes for the path, to a
// SubjectAccessReview with the reviewed user, groups, uid and extra and the non-resource path
// and verb: what kube-rbac-proxy and controller-runtime's
// filters.WithAuthenticationAndAuthorization do. Both reviews go through the Attempter like
// every request of watchsan's own, with watchsan's identity: the token in --admin-auth-token-file,
// else upstream.Self (config.Completed.completeAdminAuth refuses to start with neither).
//
// Nothing is cached: a decision is never older than the request it is for, where the apiserver
// trusts a token it authenticated for up to 10 s (its token cache) and a webhook authorizer's
// answer for minutes; instead at most adminReviewSlots requests are being reviewed at once, so
// that whoever reaches the port cannot make watchsan flood the apiserver with reviews.

const (
	tokenReviewPath  = "/apis/authentication.k8s.io/v1/tokenreviews"
	accessReviewPath = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
	// adminReviewSlots bounds the admin requests being reviewed at once; one more is answered
	// 429 with Retry-After at once. The admin listener itself holds at most
	// config.AdminMaxConnections connections.
	adminReviewSlots = 8
	// adminReviewTimeout bounds both reviews of one request, their retries included:
	// controller-runtime's TokenAccessReviewTimeout, and the request budget.
	adminReviewTimeout = upstream.DefaultRetryBudget
)

// adminOpen reports whether path is answered without a token: the kubelet's probes carry none,
// and neither does a Prometheus scrape unless metrics is checked. Every other path (what
// /debug/* serves, and any path added later) is checked: the rule names what is open.
func adminOpen(path string, metricsChecked bool) bool {
	switch path {
	case "/healthz", "/livez", "/readyz":
		return true
	case "/metrics":
		return !metricsChecked
	}
	return false
}

// adminAuth checks the admin listener's requests (adminAuth.wrap).
type adminAuth struct {
	cfg      config.AdminAuth
	attempts *upstream.Attempter
	log      *zap.Logger
	// slots holds a token per request being reviewed (adminReviewSlots).
	slots chan struct{}
}

func newAdminAuth(cfg config.AdminAuth, attempts *upstream.Attempter, log *zap.Logger) *adminAuth {
	return &adminAuth{cfg: cfg, attempts: attempts, log: log, slots: make(chan struct{}, adminReviewSlots)}
}

// wrap serves next only what is open (adminOpen) or what the apiserver allowed; everything
// else is answered with a Status naming why: 401 without a token or when the apiserver did not
// authenticate it (or could not be asked), 403 when it did not authorize it (or could not be
// asked), 429 when too many are being reviewed.
func (a *adminAuth) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if adminOpen(r.URL.Path, a.cfg.Metrics) {
			next.ServeHTTP(w, r)
			return
		}
		if st := a.check(r); st != nil {
			apistatus.Write(w, st)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// check returns nil when r may be served, else the Status to answer with.
func (a *adminAuth) check(r *http.Request) *metav1.Status {
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		return unauthorized(fmt.Sprintf("watchsan: the admin listener serves %s only to a request with a bearer token (Authorization: Bearer ...) that the apiserver authenticates and authorizes for it", clip(r.URL.Path)))
	}
	select {
	case a.slots <- struct{}{}:
		defer func() { <-a.slots }()
	default:
		st := apistatus.New(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
			fmt.Sprintf("watchsan: %d admin requests are being authorized already; retry", adminReviewSlots))
		st.Details = &metav1.StatusDetails{RetryAfterSeconds: 1}
		return st
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminReviewTimeout)
	defer cancel()
	path, verb := r.URL.Path, a.cfg.Verb // the whole path is reviewed; messages clip it
	if a.cfg.Path != "" {
		path = a.cfg.Path
	}

	user, why, err := a.authenticate(ctx, token)
	switch {
	case err != nil:
		a.log.Warn("admin request refused: its token could not be reviewed", zap.String("path", clip(r.URL.Path)),
			zap.String("remote", r.RemoteAddr), zap.Error(err))
		return unauthorized(fmt.Sprintf("watchsan: the admin listener's %s needs a bearer token the apiserver authenticates, and its TokenReview failed: %v", clip(r.URL.Path), err))
	case why != "":
		a.log.Debug("admin request refused: not authenticated", zap.String("path", clip(r.URL.Path)),
			zap.String("remote", r.RemoteAddr), zap.String("reason", why))
		return unauthorized(fmt.Sprintf("watchsan: the admin listener's %s needs a bearer token the apiserver authenticates: %s", clip(r.URL.Path), why))
	}
	allowed, reason, err := a.authorize(ctx, user, path, verb)
	switch {
	case err != nil:
		a.log.Warn("admin request refused: its authorization could not be reviewed", zap.String("path", clip(r.URL.Path)),
			zap.String("user", user.Username), zap.String("remote", r.RemoteAddr), zap.Error(err))
		return forbidden(fmt.Sprintf("watchsan: user %q may not %s path %q on the admin listener: its SubjectAccessReview failed: %v", user.Username, verb, clip(path), err))
	case !allowed:
		a.log.Debug("admin request refused: not authorized", zap.String("path", clip(r.URL.Path)),
			zap.String("user", user.Username), zap.String("remote", r.RemoteAddr), zap.String("reason", reason))
		msg := fmt.Sprintf("watchsan: user %q cannot %s path %q on the admin listener (grant %s on nonResourceURLs %q in a ClusterRole)", user.Username, verb, clip(path), verb, clip(path))
		if reason != "" {
			msg += ": " + reason
		}
		return forbidden(msg)
	}
	a.log.Debug("admin request authorized", zap.String("path", clip(r.URL.Path)), zap.String("user", user.Username))
	return nil
}

func unauthorized(msg string) *metav1.Status {
	return apistatus.New(http.StatusUnauthorized, metav1.StatusReasonUnauthorized, msg)
}

func forbidden(msg string) *metav1.Status {
	return apistatus.New(http.StatusForbidden, metav1.StatusReasonForbidden, msg)
}

// bearerToken returns the token of an Authorization header "Bearer TOKEN" (the scheme in any
// case, as the apiserver's bearer token authenticator reads it).
func bearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "bearer") || tok == "" {
		return "", false
	}
	return tok, true
}

// tokenReview is an authentication.k8s.io/v1 TokenReview, the fields watchsan sends and reads
// (k8s.io/api/authentication/v1 would register its types and grow the binary for these few;
// internal/cli's TestBinaryLinksNoDemoOrTestCode keeps API groups out of it).
type tokenReview struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Spec       tokenReviewSpec   `json:"spec"`
	Status     tokenReviewStatus `json:"status"`
}

type tokenReviewSpec struct {
	// Token is the client's bearer token; Audiences are left out: the apiserver's own.
	Token string `json:"token"`
}

type tokenReviewStatus struct {
	Authenticated bool         `json:"authenticated,omitempty"`
	User          reviewedUser `json:"user,omitempty"`
	Error         string       `json:"error,omitempty"`
}

// reviewedUser is a TokenReview's status.user: who the token is.
type reviewedUser struct {
	Username string              `json:"username,omitempty"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`
}

// authenticate asks the apiserver who token is (a TokenReview, with the apiserver's own
// audiences): its user, or why it is no one (the apiserver did not authenticate it), or the
// error that kept watchsan from asking.
func (a *adminAuth) authenticate(ctx context.Context, token string) (user reviewedUser, why string, err error) {
	var tr tokenReview
	err = a.review(ctx, tokenReviewPath, &tokenReview{APIVersion: "authentication.k8s.io/v1", Kind: "TokenReview",
		Spec: tokenReviewSpec{Token: token}}, &tr)
	switch {
	case err != nil:
		return user, "", err
	case !tr.Status.Authenticated && tr.Status.Error != "":
		return user, "the apiserver did not authenticate it: " + clip(tr.Status.Error), nil
	case !tr.Status.Authenticated:
		return user, "the apiserver did not authenticate it", nil
	case tr.Status.User.Username == "":
		return user, "the apiserver authenticated it as no user", nil
	}
	return tr.Status.User, "", nil
}

// authorize asks the apiserver whether user may verb the non-resource path (a
// SubjectAccessReview); reason is the authorizer's, when it gives one.
func (a *adminAuth) authorize(ctx context.Context, user reviewedUser, path, verb string) (allowed bool, reason string, err error) {
	spec := authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, Groups: user.Groups, UID: user.UID,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
	}
	if len(user.Extra) > 0 {
		spec.Extra = make(map[string]authorizationv1.ExtraValue, len(user.Extra))
		for k, v := range user.Extra {
			spec.Extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	var sar authorizationv1.SubjectAccessReview
	if err := a.review(ctx, accessReviewPath, &authorizationv1.SubjectAccessReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SubjectAccessReview"},
		Spec:     spec,
	}, &sar); err != nil {
		return false, "", err
	}
	return sar.Status.Allowed && !sar.Status.Denied, clip(sar.Status.Reason), nil
}

// review creates the review in at path with watchsan's identity and decodes the apiserver's
// answer into out. The reviews store nothing, so they are retried as a GET is. An error names
// the answer and what it means for watchsan's identity; it never holds a token.
func (a *adminAuth) review(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req := (&http.Request{Method: http.MethodPost, URL: &url.URL{Path: path}, Header: http.Header{},
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}).WithContext(ctx)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Content-Type", "application/json")
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	cred, who, err := a.identity(req.Header)
	if err != nil {
		return err
	}
	at, err := a.attempts.Do(ctx, req, upstream.Plan{Credentials: cred, Idempotent: true, Deadline: time.Now().Add(adminReviewTimeout)})
	if err != nil {
		return fmt.Errorf("no apiserver answered it: %w", err)
	}
	defer at.Cancel(nil)
	resp := at.Resp
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}()
	switch resp.StatusCode {
	case http.StatusOK, http.StatusCreated:
	case http.StatusUnauthorized:
		return fmt.Errorf("%s answered it 401: it does not accept watchsan's identity for it (%s)", at.Backend, who)
	case http.StatusForbidden:
		return fmt.Errorf("%s answered it 403: watchsan's identity (%s) may not create %s; grant it create on tokenreviews.authentication.k8s.io and subjectaccessreviews.authorization.k8s.io, as system:auth-delegator does", at.Backend, who, path[strings.LastIndex(path, "/")+1:])
	default:
		return fmt.Errorf("%s answered it %s", at.Backend, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out); err != nil {
		return fmt.Errorf("reading %s's answer: %w", at.Backend, err)
	}
	return nil
}

// identity is what the reviews go with, and who that is for errors: the token of
// --admin-auth-token-file (the client's own credentials, as far as the Attempter's transports
// are concerned: sent as they are, never with the lent identity), read now so that a rotated
// token is used at once; else watchsan's own, the lent identity.
func (a *adminAuth) identity(h http.Header) (upstream.Credentials, string, error) {
	return ownIdentity(a.cfg.TokenFile, h)
}

// ownIdentity is what watchsan's own reads and reviews go with (the admin listener's reviews,
// the APIService reads of package localapi), and who that is for errors: the token in
// tokenFile (--admin-auth-token-file; sent as a client's own credentials are, never with the
// lent identity), read now so that a rotated token is used at once, set on h; with no file,
// watchsan's own, the lent identity (none with --no-credentials).
func ownIdentity(tokenFile string, h http.Header) (upstream.Credentials, string, error) {
	if tokenFile == "" {
		return upstream.Self, "the lent identity", nil
	}
	tok, err := config.ReadTokenFile(tokenFile)
	if err != nil {
		return upstream.Credentials{}, "", fmt.Errorf("watchsan's own token (--admin-auth-token-file): %w", err)
	}
	h.Set("Authorization", "Bearer "+tok)
	return upstream.Decide(h, nil, false, upstream.IdentityOff), "the token in --admin-auth-token-file " + tokenFile, nil
}
