//! Process-wide telemetry: one Prometheus (OpenMetrics) registry for every component, the typed
//! metrics of each component, readiness checks, the plain-HTTP admin server (`/livez`,
//! `/readyz`, `/metrics`) and log set-up.
//!
//! Shape: [`Telemetry`] owns the one [`Registry`] (prefix `safe_termination`) behind a mutex.
//! Each component registers its metrics once, under its own sub-prefix, through
//! [`Telemetry::register`], and keeps the typed handles (cheap `Arc` clones) it updates on the hot
//! path without touching the lock. The webhook's metrics are [`WebhookMetrics`], reached through
//! [`Telemetry::webhook`]; the controller adds its own struct the same way, e.g.
//!
//! ```
//! # use safe_termination::telemetry::Telemetry;
//! # use prometheus_client::metrics::counter::Counter;
//! let telemetry = Telemetry::new();
//! let reconciles = Counter::<u64>::default();
//! telemetry.register("controller", |r| r.register("reconciles", "Reconciliations", reconciles.clone())).unwrap();
//! assert!(telemetry.encode().contains("safe_termination_controller_reconciles_total"));
//! ```

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Prefix of every metric this process exposes.
pub const METRIC_PREFIX: &str = "safe_termination";

/// Content type of `/metrics` (OpenMetrics text).
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Request-duration buckets, seconds: 50 us .. 5 s (admission answers take tens of
/// microseconds; the API server gives up at the webhook's timeoutSeconds, at most 5 s).
pub const DURATION_BUCKETS: [f64; 16] = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

/// The process's telemetry: the one registry and the typed metrics of each component.
/// Clone it freely (an `Arc` inside).
#[derive(Clone, Default)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    registry: Mutex<Registries>,
    webhook: OnceLock<WebhookMetrics>,
}

struct Registries {
    registry: Registry,
    components: BTreeSet<String>,
}

impl Default for Registries {
    fn default() -> Self {
        Self { registry: Registry::with_prefix(METRIC_PREFIX), components: BTreeSet::new() }
    }
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let components = self.inner.registry.lock().map(|r| r.components.clone()).unwrap_or_default();
        f.debug_struct("Telemetry").field("components", &components).finish()
    }
}

/// A component tried to register its metrics twice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metrics of component {0:?} are already registered")]
pub struct AlreadyRegistered(pub String);

impl Telemetry {
    /// A fresh registry with no metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a component's metrics under `safe_termination_<component>_...`. Each component
    /// registers once (a second call is an error, so no family is exposed twice).
    pub fn register(&self, component: &str, f: impl FnOnce(&mut Registry)) -> Result<(), AlreadyRegistered> {
        let mut r = self.inner.registry.lock().unwrap_or_else(PoisonError::into_inner);
        if !r.components.insert(component.to_string()) {
            return Err(AlreadyRegistered(component.to_string()));
        }
        f(r.registry.sub_registry_with_prefix(component));
        Ok(())
    }

    /// The webhook's metrics, registered on first use.
    pub fn webhook(&self) -> &WebhookMetrics {
        self.inner.webhook.get_or_init(|| {
            let m = WebhookMetrics::default();
            // The OnceLock makes this the only registration of "webhook".
            let _ = self.register("webhook", |r| m.register(r));
            m
        })
    }

    /// The whole registry in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let r = self.inner.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::with_capacity(4096);
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &r.registry) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

/// Label of `safe_termination_webhook_requests_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    /// The decision: `mutated`, `no_change`, `skipped_*`, `ignored`, `fail_open`, `bad_request`,
    /// `payload_too_large`, `unsupported_media_type`, `body_read_error` (the client went away
    /// mid-body), `timeout`.
    pub decision: &'static str,
}

/// Label of `safe_termination_webhook_certificate_reloads_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadResultLabel {
    /// `success` or `error`.
    pub result: &'static str,
}

/// The admission webhook's metrics (names below are the exposed ones).
#[derive(Debug, Clone)]
pub struct WebhookMetrics {
    /// `safe_termination_webhook_requests_total{decision}`: admission requests answered.
    pub requests: Family<DecisionLabel, Counter>,
    /// `safe_termination_webhook_request_duration_seconds`: time from the request's headers to
    /// the answer (body read, review, encode).
    pub duration: Histogram,
    /// `safe_termination_webhook_fail_open_total`: requests answered `allowed: true` because of
    /// an internal error.
    pub fail_open: Counter,
    /// `safe_termination_webhook_certificate_reloads_total{result}`: certificate (re)loads.
    pub certificate_reloads: Family<ReloadResultLabel, Counter>,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self { requests: Family::default(), duration: Histogram::new(DURATION_BUCKETS), fail_open: Counter::default(), certificate_reloads: Family::default() }
    }
}

impl WebhookMetrics {
    fn register(&self, r: &mut Registry) {
        r.register("requests", "Admission requests answered, by decision", self.requests.clone());
        r.register_with_unit("request_duration", "Time to answer an admission request", Unit::Seconds, self.duration.clone());
        r.register("fail_open", "Admission requests admitted unchanged because of an internal error", self.fail_open.clone());
        r.register("certificate_reloads", "Serving certificate loads from the certificate files, by result", self.certificate_reloads.clone());
    }

    /// Records one answered request.
    pub fn observe(&self, decision: &'static str, elapsed: Duration, fail_open: bool) {
        self.requests.get_or_create(&DecisionLabel { decision }).inc();
        self.duration.observe(elapsed.as_secs_f64());
        if fail_open {
            self.fail_open.inc();
        }
    }

    /// Records one certificate load attempt.
    pub fn certificate_reload(&self, ok: bool) {
        self.certificate_reloads.get_or_create(&ReloadResultLabel { result: if ok { "success" } else { "error" } }).inc();
    }
}

type Check = Arc<dyn Fn() -> bool + Send + Sync>;

/// Readiness: a set of checks, each named by what `/readyz` says while it fails; ready when every
/// check holds. Components add their own (the webhook: "no certificate loaded", "no plan
/// published yet"; the process: "shutting down").
#[derive(Clone, Default)]
pub struct Readiness {
    checks: Arc<Mutex<Vec<(String, Check)>>>,
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readiness").field("not_ready", &self.not_ready()).finish()
    }
}

impl Readiness {
    /// No checks: ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a check; `failing` is what `/readyz` reports while it is false (`"no certificate
    /// loaded"`, not the condition it tests).
    pub fn add(&self, failing: &str, check: impl Fn() -> bool + Send + Sync + 'static) {
        self.checks.lock().unwrap_or_else(PoisonError::into_inner).push((failing.to_string(), Arc::new(check)));
    }

    /// Adds a check that fails, as "shutting down", once `token` is cancelled, so load balancers
    /// and the API server's endpoints stop sending new work during the drain.
    pub fn add_shutdown(&self, token: CancellationToken) {
        self.add("shutting down", move || !token.is_cancelled());
    }

    /// What each failing check reports, in the order they were added (empty = ready).
    pub fn not_ready(&self) -> Vec<String> {
        let checks: Vec<(String, Check)> = self.checks.lock().unwrap_or_else(PoisonError::into_inner).clone();
        checks.into_iter().filter(|(_, c)| !c()).map(|(n, _)| n).collect()
    }

    /// True when every check holds.
    pub fn is_ready(&self) -> bool {
        self.not_ready().is_empty()
    }
}

#[derive(Clone)]
struct AdminState {
    telemetry: Telemetry,
    readiness: Readiness,
}

/// The admin router: `GET /livez` (200 while the process serves), `GET /readyz` (200 `ready`
/// when every readiness check holds, else 503 `not ready: ` and what each failing check reports,
/// e.g. `not ready: shutting down`), `GET /metrics` (OpenMetrics).
pub fn admin_router(telemetry: Telemetry, readiness: Readiness) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AdminState { telemetry, readiness })
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    let not_ready = s.readiness.not_ready();
    if not_ready.is_empty() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", not_ready.join(", ")))
    }
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], s.telemetry.encode())
}

/// How long the admin port lets its open requests finish once `stop` fires: probes and scrapes
/// take milliseconds, and a stalled client must not hold the process's exit.
pub const ADMIN_DRAIN: Duration = Duration::from_secs(1);

/// Serves the admin router on `listener` (plain HTTP/1.1) until `stop` is cancelled, then lets
/// open requests finish for at most [`ADMIN_DRAIN`] and returns. `idle_timeout` closes a
/// connection that sends no request, stays idle between requests or dribbles a request's
/// headers for that long (as on the webhook port).
pub async fn serve_admin(listener: tokio::net::TcpListener, router: Router, stop: CancellationToken, idle_timeout: Duration) -> std::io::Result<()> {
    let handle = axum_server::Handle::new();
    let trigger = crate::shutdown::drain_when_cancelled(&handle, stop, ADMIN_DRAIN);
    let mut server = axum_server::from_tcp(listener.into_std()?)?.first_request_timeout(idle_timeout).handle(handle);
    server.http_builder().http1().keep_alive(true).header_read_timeout(idle_timeout);
    let result = server.serve(router.into_make_service()).await;
    trigger.abort();
    result
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (fields flattened), for log pipelines.
    Json,
}

/// Keeps the log writer of [`init_logging`] running: dropping it writes out every queued line
/// (waiting at most about a second) and stops the writer thread. Hold it until the process ends.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard(Option<tracing_appender::non_blocking::WorkerGuard>);

impl std::fmt::Debug for LogGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LogGuard").field(&self.0.is_some()).finish()
    }
}

/// Installs the global tracing subscriber on standard error. `RUST_LOG` overrides
/// `default_filter` (e.g. `"info"`). A second call is a no-op.
///
/// `background` (the servers, which log every admission review): lines are formatted by the
/// caller and written by a writer thread ([`tracing_appender::non_blocking`]) through a buffer
/// that is flushed whenever the queue is empty, so a request never waits for a `write(2)` and
/// a burst of lines is one write. Nothing is dropped: when the queue (128k lines) is full the
/// logging request waits. Without `background` (the one-shot commands), lines are written
/// directly, in order with the command's own error output.
pub fn init_logging(format: LogFormat, default_filter: &str, background: bool) -> LogGuard {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (writer, guard) = if background {
        let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .lossy(false)
            .thread_name("safe-termination-log")
            .finish(std::io::BufWriter::new(std::io::stderr()));
        (BoxMakeWriter::new(writer), Some(guard))
    } else {
        (BoxMakeWriter::new(std::io::stderr), None)
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(ansi);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
    // a second call installed nothing: its writer thread is not needed
    LogGuard(if installed.is_ok() { guard } else { None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_metric_names() {
        let t = Telemetry::new();
        let m = t.webhook().clone();
        m.observe("mutated", Duration::from_micros(80), false);
        m.observe("fail_open", Duration::from_micros(80), true);
        m.certificate_reload(true);
        m.certificate_reload(false);
        let text = t.encode();
        for needle in [
            "safe_termination_webhook_requests_total{decision=\"mutated\"} 1",
            "safe_termination_webhook_requests_total{decision=\"fail_open\"} 1",
            "safe_termination_webhook_request_duration_seconds_bucket{le=\"0.0001\"} 2",
            "safe_termination_webhook_request_duration_seconds_count 2",
            "safe_termination_webhook_fail_open_total 1",
            "safe_termination_webhook_certificate_reloads_total{result=\"success\"} 1",
            "safe_termination_webhook_certificate_reloads_total{result=\"error\"} 1",
            "# EOF",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        // webhook() twice is the same set of metrics, registered once
        t.webhook().observe("mutated", Duration::ZERO, false);
        let text = t.encode();
        assert!(text.contains("safe_termination_webhook_requests_total{decision=\"mutated\"} 2"), "{text}");
        assert_eq!(text.matches("# TYPE safe_termination_webhook_requests counter").count(), 1, "{text}");
    }

    #[test]
    fn components_share_the_registry_once_each() {
        let t = Telemetry::new();
        let c = Counter::<u64>::default();
        t.register("controller", |r| r.register("reconciles", "Reconciliations", c.clone())).unwrap();
        assert_eq!(t.register("controller", |_| {}), Err(AlreadyRegistered("controller".into())));
        c.inc();
        t.webhook();
        let text = t.encode();
        assert!(text.contains("safe_termination_controller_reconciles_total 1"), "{text}");
        assert!(text.contains("safe_termination_webhook_fail_open_total 0"), "{text}");
    }

    #[test]
    fn readiness_names_failing_checks() {
        let r = Readiness::new();
        assert!(r.is_ready());
        let token = CancellationToken::new();
        r.add("no certificate loaded", || true);
        r.add_shutdown(token.clone());
        assert!(r.is_ready());
        token.cancel();
        assert_eq!(r.not_ready(), vec!["shutting down".to_string()]);
        r.add("no plan published yet", || false);
        assert_eq!(r.not_ready(), vec!["shutting down".to_string(), "no plan published yet".to_string()]);
    }

    /// `/readyz` says what is wrong, not the name of the condition that holds when all is well
    /// (never "not ready: not shutting down" during the drain).
    #[tokio::test]
    async fn readyz_bodies() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tower::ServiceExt as _;
        let get = |r: Readiness| async move {
            let resp = admin_router(Telemetry::new(), r).oneshot(axum::http::Request::get("/readyz").body(axum::body::Body::empty()).unwrap()).await.unwrap();
            let status = resp.status().as_u16();
            let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        };
        let r = Readiness::new();
        let (cert, token) = (Arc::new(AtomicBool::new(false)), CancellationToken::new());
        let c = cert.clone();
        r.add("no certificate loaded", move || c.load(Ordering::Relaxed));
        r.add_shutdown(token.clone());
        assert_eq!(get(r.clone()).await, (503, "not ready: no certificate loaded\n".to_string()));
        cert.store(true, Ordering::Relaxed);
        assert_eq!(get(r.clone()).await, (200, "ready\n".to_string()));
        token.cancel();
        assert_eq!(get(r.clone()).await, (503, "not ready: shutting down\n".to_string()));
        cert.store(false, Ordering::Relaxed);
        assert_eq!(get(r).await, (503, "not ready: no certificate loaded, shutting down\n".to_string()));
    }
}
