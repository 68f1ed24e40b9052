package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestMakePush runs the Makefile's push target as a user would: without REGISTRY it fails at
// once, naming the variable, and builds nothing; with a registry (go-containerregistry's
// in-process one, on loopback) it builds the image and pushes it as REGISTRY/watchsan:TAG, and
// the test reads it back from the registry: watchsan's image, stamped with TAG.
func TestMakePush(t *testing.T) {
	if testing.Short() {
		t.Skip("builds watchsan and crane")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("make", "-C", root, "push")
	cmd.Env = withoutEnv(os.Environ(), "REGISTRY")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "make push needs the registry to push to: make push REGISTRY=") {
		t.Fatalf("make push without REGISTRY: %v; want it to fail naming REGISTRY:\n%s", err, out)
	}
	if strings.Contains(string(out), "go build") {
		t.Errorf("make push without REGISTRY built something before failing:\n%s", out)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://") + "/team"
	const tag = "v0.0.1-push-test"
	cmd = exec.Command("make", "-C", root, "push", "REGISTRY="+reg, "TAG="+tag, "IMAGE_PLATFORMS=linux/"+runtime.GOARCH)
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make push REGISTRY=%s: %v\n%s", reg, err, out)
	}
	want := reg + "/watchsan:" + tag
	if !strings.Contains(string(out), "pushed "+want) {
		t.Errorf("make push did not say what it pushed (%s):\n%s", want, out)
	}
	// Read back over the registry API, as a runtime pulls: the manifest by tag, then its config.
	var m v1.Manifest
	if err := getJSON(srv.URL+"/v2/team/watchsan/manifests/"+tag, &m); err != nil {
		t.Fatalf("reading back %s: %v", want, err)
	}
	var cf v1.ConfigFile
	if err := getJSON(srv.URL+"/v2/team/watchsan/blobs/"+m.Config.Digest.String(), &cf); err != nil {
		t.Fatalf("reading back %s's config: %v", want, err)
	}
	if got := cf.Config.Labels["org.opencontainers.image.version"]; got != tag {
		t.Errorf("pushed image's version label %q, want %q", got, tag)
	}
	if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != BinaryPath || cf.Config.User != User {
		t.Errorf("pushed image runs %v as %q, want %s as %s", cf.Config.Entrypoint, cf.Config.User, BinaryPath, User)
	}
	if cf.Architecture != runtime.GOARCH {
		t.Errorf("pushed image is for %s, want %s", cf.Architecture, runtime.GOARCH)
	}
}

func withoutEnv(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// getJSON GETs url from the test registry (an image manifest is asked for as OCI's or Docker's)
// and decodes its body.
func getJSON(url string, v any) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}
