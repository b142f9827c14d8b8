//! Observability: JSON logs with a request id on every line, OpenTelemetry traces over OTLP
//! when configured (honouring an incoming `traceparent`), and Prometheus metrics per route.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::problem::{PROBLEM_JSON, Problem};

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Pretty,
}

/// Keeps the trace exporter alive; flushes it on drop.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the global tracing subscriber. Traces are exported over OTLP/HTTP when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set.
///
/// # Errors
/// When the OTLP exporter cannot be built.
pub fn init(format: LogFormat) -> anyhow::Result<TelemetryGuard> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx::postgres::notice=warn"));
    let otlp = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    let provider = if otlp {
        let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build()?;
        let resource = opentelemetry_sdk::Resource::builder().with_service_name("berthd").build();
        Some(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
    } else {
        None
    };
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    let otel_layer = provider.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("berthd")));
    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    match format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false),
            )
            .try_init()?,
        LogFormat::Pretty => registry.with(tracing_subscriber::fmt::layer()).try_init()?,
    }
    Ok(TelemetryGuard { provider })
}

/// The span of one request: carries the request id (so every log line has it) and joins
/// the caller's trace when a `traceparent` header is present.
pub fn request_span(req: &Request) -> Span {
    let request_id = req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("");
    let span = tracing::info_span!(
        "request",
        request_id,
        method = %req.method(),
        path = %req.uri().path(),
    );
    let parent = opentelemetry::global::get_text_map_propagator(|p| {
        p.extract(&opentelemetry_http::HeaderExtractor(req.headers()))
    });
    let _ = span.set_parent(parent);
    span
}

/// The Prometheus recorder. Installed once per process; later calls share it.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];
            let waits = [1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0];
            let passes = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
            PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full("http_request_duration_seconds".into()), &buckets)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full("berth_admission_wait_seconds".into()), &waits))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full("berth_controller_pass_seconds".into()), &passes))
                .expect("static buckets are valid")
                .install_recorder()
                .expect("the metrics recorder is installed once")
        })
        .clone()
}

/// Counts requests and records their latency by method, matched route and status.
pub async fn track_metrics(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    // Labels come from a closed set: a client may send any method name, and each new one
    // would otherwise be a new series kept for ever (an unauthenticated memory leak).
    let method = match *req.method() {
        Method::GET | Method::HEAD | Method::PUT | Method::POST | Method::DELETE | Method::PATCH | Method::OPTIONS => {
            req.method().as_str().to_owned()
        }
        _ => "other".to_owned(),
    };
    let response = next.run(req).await;
    let labels = [("method", method), ("route", route), ("status", response.status().as_u16().to_string())];
    metrics::counter!("http_requests_total", &labels).increment(1);
    metrics::histogram!("http_request_duration_seconds", &labels).record(start.elapsed().as_secs_f64());
    response
}

/// Makes every 4xx/5xx response a problem+json carrying the request id and path, whoever
/// produced it (a handler, an extractor, the router's 404/405, a panic).
pub async fn problem_responses(req: Request, next: Next) -> Response {
    let request_id = req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let instance = req.uri().path().to_owned();
    let response = next.run(req).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_problem =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes() == PROBLEM_JSON.as_bytes());
    let (parts, body) = response.into_parts();
    let mut problem = if is_problem {
        match body.collect().await.map(|b| serde_json::from_slice::<Problem>(&b.to_bytes())) {
            Ok(Ok(p)) => p,
            _ => Problem::for_status(status),
        }
    } else {
        Problem::for_status(status)
    };
    problem.status = status.as_u16();
    problem.request_id = request_id;
    problem.instance = Some(instance);
    let mut out = problem.into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// Turns a panic into a 500 problem (the panic message is logged, not returned).
pub fn panic_response(err: Box<dyn std::any::Any + Send + 'static>) -> Response<Body> {
    let detail = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    tracing::error!(panic = %detail, "handler panicked");
    let mut response = Problem::for_status(StatusCode::INTERNAL_SERVER_ERROR).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
