package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
)

func TestKlogGoesThroughZapWithDurationsInUnits(t *testing.T) {
	var buf bytes.Buffer
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(EncoderConfig()), zapcore.AddSync(&buf), zapcore.DebugLevel)).Named("watchsan")
	RouteKlog(log)
	defer klog.ClearLogger()

	klog.InfoS("reflector watch ended", "resource", "configmaps", "after", 1500*time.Millisecond)
	klog.ErrorS(nil, "watch failed")
	klog.Flush()
	log.Info("resumed", zap.Duration("gap", 250*time.Millisecond))

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 JSON lines (two from klog, one direct), got %d:\n%s", len(lines), buf.String())
	}
	var first, second, third map[string]any
	for i, dst := range []*map[string]any{&first, &second, &third} {
		if err := json.Unmarshal([]byte(lines[i]), dst); err != nil {
			t.Fatalf("line %d is not JSON (klog's own format?): %v: %s", i, err, lines[i])
		}
	}
	if first["logger"] != "watchsan.client-go" || first["msg"] != "reflector watch ended" || first["resource"] != "configmaps" || first["after"] != "1.5s" {
		t.Errorf("klog InfoS line: %v", first)
	}
	if second["level"] != "error" || second["msg"] != "watch failed" {
		t.Errorf("klog ErrorS line: %v", second)
	}
	if third["gap"] != "250ms" {
		t.Errorf("duration printed as %v, want \"250ms\"", third["gap"])
	}
}
