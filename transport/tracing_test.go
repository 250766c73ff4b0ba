package transport

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/cluster/check"
)

func memTracing(t *testing.T) (*Tracing, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return &Tracing{Provider: tp}, exp
}

// serverSpans returns the trace ids of the exported server spans named name.
func serverSpans(exp *tracetest.InMemoryExporter, name string) []trace.TraceID {
	var ids []trace.TraceID
	for _, s := range exp.GetSpans() {
		if s.Name == name && s.SpanKind == trace.SpanKindServer {
			ids = append(ids, s.SpanContext.TraceID())
		}
	}
	return ids
}

// The public API is traced without trace context; HTTP keeps the caller's.
func TestTracingPublicAPI(t *testing.T) {
	t.Parallel()
	tr, exp := memTracing(t)
	s := startServer(t, &fakeHandler{}, func(c *ServerConfig) { c.Tracing = tr })
	c := dial(t, s.GRPCAddr())
	if _, err := c.Check(testCtx(t), protoReqs([]check.Request{req("k", 1)})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the Check span", func() bool { return len(serverSpans(exp, "sluice.v1.RateLimiter/Check")) == 1 })

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	hreq, _ := http.NewRequest("POST", "http://"+s.HTTPAddr()+"/v1/check", strings.NewReader(`{"requests":[{"name":"n","key":"k","limit":5,"window_ms":1000}]}`))
	hreq.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitFor(t, 10*time.Second, "the HTTP span", func() bool { return len(serverSpans(exp, "POST /v1/check")) == 1 })
	if id := serverSpans(exp, "POST /v1/check")[0]; id.String() != traceID {
		t.Errorf("HTTP span in trace %s, want the caller's %s", id, traceID)
	}
	for _, sp := range exp.GetSpans() {
		if sp.Name == "POST /v1/check" {
			var code int64
			for _, kv := range sp.Attributes {
				if kv.Key == "http.response.status_code" {
					code = kv.Value.AsInt64()
				}
			}
			if code != int64(resp.StatusCode) {
				t.Errorf("span's status code %d, the answer's %d", code, resp.StatusCode)
			}
		}
	}
}
