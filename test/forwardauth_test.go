package test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// nginxConf puts nginx in front of upstream, asking the Sluice node at
// sluiceHTTP through auth_request before each request.
const nginxConf = `daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    server {
        listen %[2]s;
        location / {
            auth_request /_sluice;
            proxy_pass http://%[3]s;
        }
        location = /_sluice {
            internal;
            proxy_pass http://%[4]s/v1/forward-auth?name=api&key_header=X-Api-Key;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
        }
    }
}
`

// startNginx runs nginx on a free loopback port in front of upstream, with
// its forward-auth calls going to the Sluice HTTP address sluiceHTTP. It
// skips the test when nginx is not installed (.ci/run installs Debian's).
func startNginx(t *testing.T, upstream, sluiceHTTP string) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			t.Skip("nginx is not installed (apt-get install -y nginx)")
		}
		bin = "/usr/sbin/nginx"
	}
	dir := t.TempDir()
	addr := freePort(t, "127.0.0.1", false)
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, dir, addr, upstream, sluiceHTTP), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"))
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill() // master_process off: one process, nothing left behind
		<-exited
		if t.Failed() {
			errLog, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx output:\n%s\nerror.log:\n%s", log.String(), errLog)
		}
	})
	waitFor(t, 10*time.Second, "nginx listens on "+addr, func() bool {
		select {
		case <-exited:
			t.Fatalf("nginx exited: %s", log.String())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	return addr
}

// TestForwardAuthBehindNginx puts two real nginx instances, each asking a
// different Sluice node through auth_request, in front of one upstream:
// they share the cluster's limit, and the request over it is refused with
// the configured status.
func TestForwardAuthBehindNginx(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("nginx"); err != nil {
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			t.Skip("nginx is not installed (apt-get install -y nginx)")
		}
	}
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeAtomic(t, rules, "rules:\n  - name: api\n    limits: [{limit: 3, window: 1h}]\n")
	ps := make([]*proc, 3)
	for i := range ps {
		ps[i] = newProc(t, i, fmt.Sprintf("127.0.0.%d", 50+i))
		// nginx's auth_request passes only 401 and 403 on.
		ps[i].extra = []string{"--rules", rules, "--forward-auth-deny-status", "403"}
		if i > 0 {
			ps[i].join = []string{ps[0].gossip}
		}
		ps[i].start(t)
	}
	waitMembers(t, ps)

	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "upstream\n")
	}))
	t.Cleanup(upstream.Close)
	upstreamAddr := upstream.Listener.Addr().String()
	front := []string{
		startNginx(t, upstreamAddr, ps[0].http),
		startNginx(t, upstreamAddr, ps[1].http),
	}

	get := func(addr, apiKey string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/hello", nil)
		req.Header.Set("X-Api-Key", apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// Alternate between the two nginx: the limit of 3 is the cluster's.
	for i := range 5 {
		want := http.StatusOK
		if i >= 3 {
			want = http.StatusForbidden
		}
		code, body := get(front[i%2], "key-1")
		if code != want {
			t.Fatalf("request %d through nginx %d: %d %q, want %d", i, i%2, code, body, want)
		}
		if code == http.StatusOK && body != "upstream\n" {
			t.Fatalf("request %d: body %q", i, body)
		}
	}
	// Another key has its own count.
	if code, _ := get(front[1], "key-2"); code != http.StatusOK {
		t.Fatalf("key-2: %d", code)
	}
}
