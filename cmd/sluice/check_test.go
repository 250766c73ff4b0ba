package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

func TestParseLimitSpec(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		spec string
		want bucket.Limit
	}{
		{"limit=10,window=1m", bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: 10, WindowMS: 60_000}},
		{" limit = 5 , window = 500ms , algorithm = gcra , burst = 2 ", bucket.Limit{Algorithm: bucket.GCRA, Limit: 5, WindowMS: 500, Burst: 2}},
		{"limit=3,window=1h,sub-windows=60", bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: 3, WindowMS: 3_600_000, SubWindows: 60}},
		{"limit=3,calendar=day", bucket.Limit{Algorithm: bucket.FixedWindow, Limit: 3, WindowMS: 86_400_000, Calendar: bucket.CalendarDay}},
		{"limit=3,calendar=week,calendar-tz=Asia/Tokyo", bucket.Limit{Algorithm: bucket.FixedWindow, Limit: 3, WindowMS: 7 * 86_400_000, Calendar: bucket.CalendarWeek, CalendarTZ: "Asia/Tokyo"}},
		{"limit=3,window=1s,algorithm=leaky_bucket,shaping", bucket.Limit{Algorithm: bucket.LeakyBucket, Limit: 3, WindowMS: 1000, Shaping: true}},
		{"limit=3,window=1s,count_refused=false", bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: 3, WindowMS: 1000}},
	} {
		got, err := parseLimitSpec(tc.spec)
		if err != nil || got != tc.want {
			t.Errorf("parseLimitSpec(%q) = %+v, %v; want %+v", tc.spec, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ spec, wantErr string }{
		{"window=1m", "limit is missing"},
		{"limit=3", "window is missing"},
		{"limit=x,window=1m", "whole number"},
		{"limit=3,window=1m,limit=4", "given twice"},
		{"limit=3,window=0s", "positive whole number of milliseconds"},
		{"limit=3,window=1.5ms", "positive whole number of milliseconds"},
		{"limit=3,window=1m,colour=red", "unknown key"},
		{"limit=3,window=1m,burst", "needs a value"},
		{"limit=3,,window=1m", "empty item"},
		{"limit=3,window=1m,algorithm=nope", "unknown algorithm"},
		{"limit=99999999999999999999,window=1m", "out of range"},
		{"limit=3,window=1m,shaping=maybe", "true or false"},
		{"limit=-1,window=1m", "limit is -1"},
		{"limit=3,calendar=day,calendar_tz=Mars/Olympus", "not a time zone"},
		{"limit=3,window=1m,calendar_tz=Asia/Tokyo", "applies only to calendar windows"},
	} {
		if _, err := parseLimitSpec(tc.spec); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("parseLimitSpec(%q) error %v, want one containing %q", tc.spec, err, tc.wantErr)
		}
	}
}

func TestParseWithEnvPrefersTheCommandLine(t *testing.T) {
	t.Setenv("SLUICE_GRPC_ADDR", "127.0.0.1:9999")
	t.Setenv("SLUICE_NODE_NAME", "from-env")
	var f serveFlags
	fs := newServeFlagSet(&f)
	if err := parseWithEnv(fs, []string{"--node-name", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if f.nodeName != "from-flag" || f.grpcAddr != "127.0.0.1:9999" {
		t.Fatalf("node name %q, grpc addr %q: want the flag to win and the environment to fill the rest", f.nodeName, f.grpcAddr)
	}
	t.Setenv("SLUICE_CACHE_SIZE", "lots")
	if err := parseWithEnv(newServeFlagSet(&serveFlags{}), nil); err == nil || !strings.Contains(err.Error(), "SLUICE_CACHE_SIZE") {
		t.Fatalf("a bad environment value gave %v, want an error naming the variable", err)
	}
}

func TestClusterNameFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "sluice"},
		{[]string{"--cluster-name", "payments-eu"}, "payments-eu"},
	} {
		var f serveFlags
		if err := parseWithEnv(newServeFlagSet(&f), tc.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := f.clusterConfig(slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ClusterName != tc.want {
			t.Errorf("%v: cluster name %q, want %q", tc.args, cfg.ClusterName, tc.want)
		}
	}
	var f serveFlags
	if err := parseWithEnv(newServeFlagSet(&f), []string{"--cluster-name", strings.Repeat("x", 256), "--node-name", "n"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.clusterConfig(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "cluster name") {
		t.Fatalf("a 256-byte cluster name: %v, want an error naming it", err)
	}
}
