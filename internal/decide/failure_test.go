package decide

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Past maxThrottles policies, every further one shares one throttle: made-up names do not grow
// the log's memory without bound. (Moved here from httplimit with the log.)
func TestErrorLogThrottlesAreBounded(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	l := &ErrorLog{Every: time.Hour, Prefix: "test: "}
	for i := range 2 * maxThrottles {
		l.Log(context.Background(), Misconfigured, fmt.Sprintf("p%d", i), errors.New("down"), "path", "/x")
	}
	if n := strings.Count(buf.String(), "\n"); n != maxThrottles+1 || l.n.Load() != maxThrottles+1 {
		t.Errorf("%d lines, %d throttles; want %d of each", n, l.n.Load(), maxThrottles+1)
	}
	if !strings.Contains(buf.String(), `msg="test: rate limit misconfigured, answered 500"`) {
		t.Errorf("the lines lack their prefix: %.200s", buf.String())
	}
}
