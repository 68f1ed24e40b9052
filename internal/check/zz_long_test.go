package check

import (
	"os"
	"testing"
	"time"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
)

func TestZZLong(t *testing.T) {
	if os.Getenv("ZZLONG") == "" {
		t.Skip()
	}
	c := clustertest.Start(t, cluster.Options{})
	runCheck(t, c.RESTConfig(0, c.AdminToken), Options{BookmarkWait: 70 * time.Second, IdleWait: 70 * time.Second})
	layer, u := faultFront(t, c, nil)
	_ = u
	_ = layer
}
