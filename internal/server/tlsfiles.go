package server

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// tlsCheckInterval is the least time between two reads of the serving certificate, key and
// client CA files: every handshake after it looks at them again.
const tlsCheckInterval = time.Second

// tlsFiles is the main listener's TLS material, read again from its files when they change,
// without a restart: a rotated serving certificate (cert-manager renews it, a
// Secret volume swaps its files) is presented, and a rotated client CA verifies, from the next
// handshake on. Nothing runs in the background: a handshake at least tlsCheckInterval after
// the last look reads the (small) files and compares their bytes, so a change is seen
// whatever the file system's timestamps say. Files caught in the middle of a rotation (a
// certificate that does not match its key yet) are logged and the previous material kept.
type tlsFiles struct {
	certFile, keyFile, caFile string
	log                       *zap.Logger
	// reloaded is told "ok" or "error" for every change of the files seen.
	reloaded func(result string)
	// interval is tlsCheckInterval; tests shorten it.
	interval time.Duration

	mu      sync.Mutex
	checked time.Time
	// the files' bytes as last loaded (or last found broken: logged once per content)
	certPEM, keyPEM, caPEM []byte
	cfg                    *tls.Config // the config handshakes get; replaced, never changed
}

// newTLSFiles loads the serving certificate and key and, when caFile is set, the client CA;
// reloaded is told the result of every later change of the files.
func newTLSFiles(certFile, keyFile, caFile string, log *zap.Logger, reloaded func(result string)) (*tlsFiles, error) {
	f := &tlsFiles{certFile: certFile, keyFile: keyFile, caFile: caFile, log: log, reloaded: reloaded, interval: tlsCheckInterval}
	certPEM, keyPEM, caPEM, err := f.read()
	if err != nil {
		return nil, err
	}
	if f.cfg, err = f.build(certPEM, keyPEM, caPEM); err != nil {
		return nil, err
	}
	f.certPEM, f.keyPEM, f.caPEM, f.checked = certPEM, keyPEM, caPEM, time.Now()
	return f, nil
}

// serverConfig is the listener's tls.Config: every handshake gets the current material.
func (f *tlsFiles) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"h2", "http/1.1"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return f.current(), nil },
	}
}

// current returns the config for a handshake, looking at the files first when it is time.
func (f *tlsFiles) current() *tls.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.checked) >= f.interval {
		f.checked = time.Now()
		f.reload()
	}
	return f.cfg
}

// reload reads the files and, when their bytes changed and they load, replaces cfg.
func (f *tlsFiles) reload() {
	certPEM, keyPEM, caPEM, err := f.read()
	if err != nil {
		f.log.Warn("cannot read the TLS files; the ones loaded before stay in use", zap.Error(err))
		return
	}
	if bytes.Equal(certPEM, f.certPEM) && bytes.Equal(keyPEM, f.keyPEM) && bytes.Equal(caPEM, f.caPEM) {
		return
	}
	f.certPEM, f.keyPEM, f.caPEM = certPEM, keyPEM, caPEM
	cfg, err := f.build(certPEM, keyPEM, caPEM)
	if err != nil {
		f.log.Warn("the TLS files changed but do not load (in the middle of a rotation?); the ones loaded before stay in use", zap.Error(err))
		f.reloaded("error")
		return
	}
	f.cfg = cfg
	f.reloaded("ok")
	fields := []zap.Field{zap.String("certFile", f.certFile)}
	if leaf := cfg.Certificates[0].Leaf; leaf != nil {
		fields = append(fields, zap.Time("notAfter", leaf.NotAfter), zap.String("serial", leaf.SerialNumber.String()))
	}
	if f.caFile != "" {
		fields = append(fields, zap.String("clientCAFile", f.caFile))
	}
	f.log.Info("TLS files reloaded", fields...)
}

func (f *tlsFiles) read() (certPEM, keyPEM, caPEM []byte, err error) {
	if certPEM, err = os.ReadFile(f.certFile); err != nil {
		return nil, nil, nil, fmt.Errorf("--tls-cert-file: %w", err)
	}
	if keyPEM, err = os.ReadFile(f.keyFile); err != nil {
		return nil, nil, nil, fmt.Errorf("--tls-private-key-file: %w", err)
	}
	if f.caFile != "" {
		if caPEM, err = os.ReadFile(f.caFile); err != nil {
			return nil, nil, nil, fmt.Errorf("--client-ca-file: %w", err)
		}
	}
	return certPEM, keyPEM, caPEM, nil
}

// build is the config one handshake gets: the serving certificate and, with a client CA, a
// client certificate verified against it when one is sent. A client may send none (it
// authenticates with a token, or goes anonymous); one from another CA fails the handshake.
func (f *tlsFiles) build(certPEM, keyPEM, caPEM []byte) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-file/--tls-private-key-file: %w", err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
		Certificates: []tls.Certificate{cert},
	}
	if f.caFile != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("--client-ca-file %s: no PEM certificate found", f.caFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}
