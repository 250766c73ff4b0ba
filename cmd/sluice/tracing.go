package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluicehq/sluice/transport"
)

// Tracing is configured with the standard OpenTelemetry variables, read
// as the specification says, with one difference: it is off unless asked
// for, so a node that sets none of them exports nothing and installs no
// instrumentation. It is on when OTEL_TRACES_EXPORTER says otlp, or, with
// OTEL_TRACES_EXPORTER unset, when an OTLP endpoint is given
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).
// OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none turn it off. The
// protocol is OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf (the specification's default)
// or grpc. The exporters and the SDK read the rest themselves (endpoint,
// headers, certificates, timeout, OTEL_TRACES_SAMPLER, OTEL_BSP_*,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES).

// tracingSetup makes the tracing of node name from the environment: nil
// when tracing is off, else the Tracing for transport and a function that
// flushes and stops the exporter.
type tracingSetup func(ctx context.Context, name string, lg *slog.Logger) (*transport.Tracing, func(context.Context) error, error)

// tracingFromEnv is the tracingSetup of `sluice serve`, reading the
// variables with lookupEnv.
func tracingFromEnv(lookupEnv func(string) (string, bool)) tracingSetup {
	return func(ctx context.Context, name string, lg *slog.Logger) (*transport.Tracing, func(context.Context) error, error) {
		proto, on, err := tracingWanted(lookupEnv)
		if err != nil || !on {
			return nil, nil, err
		}
		var exp sdktrace.SpanExporter
		switch proto {
		case "grpc":
			exp, err = otlptracegrpc.New(ctx)
		default:
			exp, err = otlptracehttp.New(ctx)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("OpenTelemetry OTLP exporter (%s): %w", proto, err)
		}
		res, err := resource.New(ctx,
			resource.WithAttributes(attribute.String("service.name", "sluice"), attribute.String("service.instance.id", name)),
			resource.WithTelemetrySDK(),
			resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		)
		if err != nil {
			return nil, nil, fmt.Errorf("OpenTelemetry resource: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		// Export failures are logged once each through the node's logger
		// instead of the standard library's log package.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { lg.Warn("tracing", "err", err) }))
		lg.Info("tracing on", "exporter", "otlp", "protocol", proto)
		return &transport.Tracing{Provider: tp, Propagator: propagation.TraceContext{}}, tp.Shutdown, nil
	}
}

// tracingWanted reads the OTEL_* variables that decide whether tracing is
// on, and the OTLP protocol.
func tracingWanted(lookupEnv func(string) (string, bool)) (proto string, on bool, err error) {
	get := func(k string) string { v, _ := lookupEnv(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return "", false, nil
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "":
		on = get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	case "none":
		return "", false, nil
	case "otlp":
		on = true
	default:
		return "", false, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: sluice exports traces with otlp (or none)", exp)
	}
	if !on {
		return "", false, nil
	}
	proto = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	from := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if proto == "" {
		proto, from = get("OTEL_EXPORTER_OTLP_PROTOCOL"), "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	switch proto {
	case "":
		proto = "http/protobuf"
	case "grpc", "http/protobuf":
	default:
		return "", false, fmt.Errorf("%s=%q: want grpc or http/protobuf", from, proto)
	}
	return proto, true, nil
}
