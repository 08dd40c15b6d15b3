//! Distributed traces (issue 31): OpenTelemetry export over OTLP, and the W3C trace context
//! (`traceparent`, `tracestate`) taken from a call's gRPC metadata or HTTP headers and passed on
//! to the calls this node makes for it: a call forwarded to the leader, a Raft append carrying
//! its group commit.
//!
//! Spans are `tracing` spans with the target [`TARGET`] (the engine's are made in
//! `boxoffice_engine::trace`): the gate's (one per call), the HTTP API's, forwarding, the Raft
//! append sent and the one received. [`Exporter::start`] sends them, and only them, to an OTLP
//! collector; without it no layer takes them and each is nothing after the macro's static level
//! check. With it, the gate keeps a call's span only if it is sampled, and nothing is made
//! under a call without one.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

pub use boxoffice_engine::trace::TARGET;

/// The W3C header that carries a call's trace and parent span.
pub const TRACEPARENT: &str = "traceparent";

/// What to export, and where (the binary's `--otlp-*` flags).
#[derive(Clone, Debug, Default)]
pub struct TraceConfig {
    /// The OTLP/gRPC collector, e.g. `http://127.0.0.1:4317`; `None`: the standard variables
    /// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT`) say, if set.
    pub endpoint: Option<String>,
    /// Parent-based ratio sampling: a call whose caller sent a sampled `traceparent` is traced,
    /// one sent unsampled is not, and of the calls without one this share is. `None`: the
    /// standard `OTEL_TRACES_SAMPLER` (and `_ARG`) say, by default every call.
    pub sample_ratio: Option<f64>,
    /// This process among the service's (`service.instance.id`): a cluster node's id.
    pub instance: Option<String>,
}

impl TraceConfig {
    /// Whether traces are to be exported: an endpoint is given (by flag or a standard variable)
    /// and `OTEL_SDK_DISABLED` is not `true` nor `OTEL_TRACES_EXPORTER` `none`.
    pub fn wanted(&self) -> bool {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return false;
        }
        self.endpoint.is_some()
            || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
            || var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
    }

    /// The sampler asked for, if a ratio was given (checked: 0 to 1).
    fn sampler(&self) -> anyhow::Result<Option<Sampler>> {
        match self.sample_ratio {
            None => Ok(None),
            Some(r) if (0.0..=1.0).contains(&r) => Ok(Some(Sampler::ParentBased(Box::new(
                Sampler::TraceIdRatioBased(r),
            )))),
            Some(r) => anyhow::bail!("--otlp-sample-ratio must be from 0 to 1, not {r}"),
        }
    }
}

/// The OpenTelemetry pipeline: spans batched and sent to the collector on a thread of the SDK.
/// [`Exporter::shutdown`] sends what is left.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Starts exporting as `config` says; `Ok(None)` if it does not ask for export. Must run
    /// inside a Tokio runtime (the gRPC client's), which must outlive the exporter.
    pub fn start(config: &TraceConfig) -> anyhow::Result<Option<Exporter>> {
        use opentelemetry_otlp::WithExportConfig;
        let sampler = config.sampler()?;
        if !config.wanted() {
            return Ok(None);
        }
        let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
        if let Some(endpoint) = &config.endpoint {
            exporter = exporter.with_endpoint(endpoint.clone());
        }
        let exporter = exporter
            .build()
            .map_err(|e| anyhow::anyhow!("cannot start the OTLP exporter: {e}"))?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        // OTEL_SERVICE_NAME, or a service.name in OTEL_RESOURCE_ATTRIBUTES (both read by the
        // builder), wins over ours.
        let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| {
                a.split(',')
                    .any(|kv| kv.trim().starts_with("service.name="))
            });
        if !named {
            resource = resource.with_service_name("boxoffice");
        }
        if let Some(instance) = &config.instance {
            resource = resource.with_attribute(opentelemetry::KeyValue::new(
                "service.instance.id",
                instance.clone(),
            ));
        }
        let mut provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build());
        if let Some(sampler) = sampler {
            provider = provider.with_sampler(sampler);
        }
        // The engine carries only sampled callers' spans on to its group commits.
        boxoffice_engine::trace::set_sampler(|span| {
            use opentelemetry::trace::TraceContextExt;
            span.context().span().span_context().is_sampled()
        });
        Ok(Some(Exporter {
            provider: provider.build(),
        }))
    }

    /// The layer that turns this process's spans of [`TARGET`] into OpenTelemetry spans (no
    /// other span or event: logs stay log lines).
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        let tracer = self.provider.tracer("boxoffice");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_target(false)
            // No OpenTelemetry context attached at each poll, no busy/idle timings: the spans'
            // own times are what the traces show, at a fraction of the cost.
            .with_context_activation(false)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.target() == TARGET
            }))
    }

    /// Sends the spans still buffered and stops.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "the OTLP exporter did not shut down cleanly");
        }
    }
}

/// Whether a span is of a request's way (the log's lines leave these out).
pub fn is_trace_span(meta: &tracing::Metadata<'_>) -> bool {
    meta.target() == TARGET
}

/// Headers read as a W3C carrier.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Headers written as a W3C carrier.
struct HeadersMut<'a>(&'a mut http::HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Makes `span` continue the trace its caller named in `headers` (a `traceparent`), if any.
/// Nothing happens when the span is not traced or the caller sent none (or a malformed one:
/// the span then starts a trace of its own, as the W3C rules say).
pub fn continue_from(span: &Span, headers: &http::HeaderMap) {
    if headers.contains_key(TRACEPARENT) {
        adopt(span, &Headers(headers));
    }
}

/// Makes a traced `span` a child of the context `carrier` holds.
fn adopt(span: &Span, carrier: &dyn Extractor) {
    if span.is_disabled() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(carrier);
    // Fails only when the span was entered already (never here) or no layer takes it.
    let _ = span.set_parent(parent);
}

/// Writes a traced `span`'s context into `carrier`.
fn inject(span: &Span, carrier: &mut dyn Injector) {
    TraceContextPropagator::new().inject_context(&span.context(), carrier);
}

/// Writes `span`'s context into `headers` for a call made on its behalf, replacing whatever
/// context they carried (a forwarded call carries its caller's headers). An untraced span
/// leaves the caller's context as it is.
pub fn pass_on(span: &Span, headers: &mut http::HeaderMap) {
    if span.is_disabled() {
        return;
    }
    headers.remove(TRACEPARENT);
    headers.remove("tracestate");
    inject(span, &mut HeadersMut(headers));
}

/// A gRPC call's span at the gate, continuing its caller's trace.
pub fn gate_span(method: &'static str, headers: &http::HeaderMap) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "gate",
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
    );
    continue_from(&span, headers);
    sampled_or_none(span)
}

/// `span` if it is sampled, else none: nothing under an unsampled call is made (its spans would
/// cost the call their bookkeeping and be dropped unexported).
fn sampled_or_none(span: Span) -> Span {
    if span.is_disabled() || boxoffice_engine::trace::sampled(&span) {
        span
    } else {
        Span::none()
    }
}

/// gRPC metadata read as a W3C carrier.
struct Metadata<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        // Only `get` is asked by the W3C propagator.
        Vec::new()
    }
}

/// gRPC metadata written as a W3C carrier.
struct MetadataMut<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::AsciiMetadataKey::from_bytes(key.as_bytes()),
            value.parse::<tonic::metadata::AsciiMetadataValue>(),
        ) {
            self.0.insert(key, value);
        }
    }
}

/// [`continue_from`] for a call's gRPC metadata as tonic gives it to a service.
pub fn continue_from_metadata(span: &Span, metadata: &tonic::metadata::MetadataMap) {
    if metadata.contains_key(TRACEPARENT) {
        adopt(span, &Metadata(metadata));
    }
}

/// [`pass_on`] for the gRPC metadata of a call this node makes.
pub fn pass_on_metadata(span: &Span, metadata: &mut tonic::metadata::MetadataMap) {
    if !span.is_disabled() {
        inject(span, &mut MetadataMut(metadata));
    }
}

/// An HTTP API call's span: the same role as the gate's span for gRPC. It continues the
/// caller's trace only for a caller with a key the server knows (`known`, asked only when the
/// span is traced and the caller sent a context): an anonymous caller
/// cannot make the server export spans by sending a sampled context. `route` is the path's
/// pattern (`/v1/holds/{hold_id}`), never the caller's own path.
pub fn http_span(
    method: &http::Method,
    route: Option<&str>,
    headers: &http::HeaderMap,
    known: impl FnOnce() -> bool,
) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "http",
        otel.kind = "server",
        http.request.method = %method,
        http.route = route.unwrap_or("unmatched"),
        http.response.status_code = tracing::field::Empty,
    );
    if !span.is_disabled() && headers.contains_key(TRACEPARENT) && known() {
        continue_from(&span, headers);
    }
    sampled_or_none(span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;
    use tracing_subscriber::layer::SubscriberExt;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// A process whose spans go to an in-memory OpenTelemetry pipeline (no export).
    fn traced<T>(f: impl FnOnce() -> T) -> T {
        let provider = SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("test"))
            .with_filter(tracing_subscriber::filter::filter_fn(is_trace_span));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, f)
    }

    /// A `gate` span continued from a request whose `traceparent` is `traceparent`: the span,
    /// the request's headers, and the span's own context.
    fn gate_with(
        traceparent: &str,
    ) -> (
        tracing::Span,
        http::HeaderMap,
        opentelemetry::trace::SpanContext,
    ) {
        let mut headers = http::HeaderMap::new();
        headers.insert(TRACEPARENT, traceparent.parse().unwrap());
        let span = tracing::info_span!(target: TARGET, "gate");
        continue_from(&span, &headers);
        let sc = span.context().span().span_context().clone();
        (span, headers, sc)
    }

    #[test]
    fn a_span_continues_its_callers_trace_and_passes_its_own_context_on() {
        traced(|| {
            let (span, headers, sc) = gate_with(PARENT);
            assert_eq!(
                sc.trace_id().to_string(),
                "4bf92f3577b34da6a3ce929d0e0e4736"
            );
            // Passed on: the same trace, this span (not the caller's) as the parent.
            let mut out = headers.clone();
            pass_on(&span, &mut out);
            let sent = out.get(TRACEPARENT).unwrap().to_str().unwrap().to_owned();
            assert!(
                sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
                "{sent}"
            );
            assert!(!sent.contains("00f067aa0ba902b7"), "{sent}");
            assert!(sent.contains(&sc.span_id().to_string()), "{sent}");
        });
    }

    #[test]
    fn a_malformed_context_is_ignored_and_the_span_starts_its_own_trace() {
        traced(|| {
            for bad in [
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "not a trace context",
            ] {
                let (_, _, sc) = gate_with(bad);
                assert!(sc.is_valid(), "{bad}");
                assert_ne!(
                    sc.trace_id().to_string(),
                    "4bf92f3577b34da6a3ce929d0e0e4736",
                    "{bad}"
                );
            }
        });
    }

    #[test]
    fn without_a_layer_nothing_is_read_or_written() {
        let mut headers = http::HeaderMap::new();
        headers.insert(TRACEPARENT, PARENT.parse().unwrap());
        let span = tracing::info_span!(target: TARGET, "gate");
        assert!(span.is_disabled());
        continue_from(&span, &headers);
        pass_on(&span, &mut headers);
        assert_eq!(headers.get(TRACEPARENT).unwrap(), PARENT);
    }

    #[test]
    fn a_ratio_outside_0_to_1_is_refused() {
        let config = TraceConfig {
            sample_ratio: Some(1.5),
            ..TraceConfig::default()
        };
        let e = config.sampler().err().unwrap().to_string();
        assert!(e.contains("--otlp-sample-ratio"), "{e}");
        assert!(
            TraceConfig {
                sample_ratio: Some(0.25),
                ..TraceConfig::default()
            }
            .sampler()
            .unwrap()
            .is_some()
        );
    }
}
