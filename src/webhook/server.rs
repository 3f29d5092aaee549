//! The admission webhook's HTTPS server: axum over rustls (see [`super::tls`]), HTTP/1.1 and
//! HTTP/2, `POST /mutate` with AdmissionReview v1 in and out through [`super::review`].
//!
//! Every request is bounded: the body by [`RequestLimits::max_body_bytes`] (413 beyond, with a
//! message, on HTTP/1.1 and HTTP/2 alike: see [`H2_DRAIN_FACTOR`]), the whole answer by
//! [`RequestLimits::request_timeout`] (503 with a message, below the webhook configuration's
//! `timeoutSeconds`, so the API server applies its `failurePolicy` rather than wait). A wrong
//! `Content-Type` is 415. Every answer is logged once with the uid, namespace, pod name,
//! decision, patch size and duration, and counted in [`WebhookMetrics`]. The handler reads the
//! plan from memory only ([`PlanHandle`]).
//!
//! Graceful shutdown ([`serve`]): when the shutdown token is cancelled the listener is closed
//! (new connections are refused), in-flight requests finish (bounded by the drain time), and
//! `serve` returns.
//!
//! Slow and idle connections ([`serve`]): no connection can hold a socket for long without
//! working. The TLS handshake is bounded by the acceptor (10 s); the first request on a
//! connection must arrive within the idle timeout; on HTTP/1.1 the same timeout bounds, for
//! *every* request on a keep-alive connection, both the idle time before it and the time its
//! head takes to arrive (hyper's `header_read_timeout`, which axum-server turns off by default
//! and which hyper restarts whenever the connection goes idle), so a client that dribbles a
//! header after a first good request is cut off too. Once the head is in, the request timeout
//! above bounds the body and the answer. On HTTP/2, keep-alive pings
//! ([`H2_KEEP_ALIVE_INTERVAL`], answered within [`H2_KEEP_ALIVE_TIMEOUT`]) close connections whose
//! peer is gone or stalled, and at most [`H2_MAX_CONCURRENT_STREAMS`] requests run at once per
//! connection. An idle HTTP/2 connection whose peer answers pings is kept: the API server reuses
//! its connection for every review, and closing it without a GOAWAY would race with its next
//! request and fail that review open.

use super::review::{ReviewOutcome, review};
use crate::core::plan::Plan;
use crate::core::selector::ServiceIndex;
use crate::telemetry::WebhookMetrics;
use arc_swap::ArcSwap;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Default request body limit: 3 MiB (the API server's own request limit; a Pod is far smaller).
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// Default bound on the request body bytes held at once by all requests together: 64 MiB.
pub const DEFAULT_MAX_BUFFERED_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Default per-request timeout: 4 s, below the webhook's `timeoutSeconds` of 5.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(4);
/// Default [`RequestLimits::body_timeout`]: an API server sends its whole AdmissionReview at once (a
/// few KB, at most a few MB inside the cluster), so a second is ample.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2: a body over the limit is read on and discarded, at most this many times the limit
/// more (and within [`RequestLimits::body_timeout`]), before the 413 is sent. The stream then ends
/// with both sides' END_STREAM and the client reads a plain 413. Answering without reading the
/// rest makes hyper close the stream with RST_STREAM(NO_ERROR) after the answer (RFC 9113
/// section 8.1), which some clients (the h2 crate's) report as a stream reset instead of the
/// answer. A larger or slower body still gets its 413 first and the reset after it. (HTTP/1.1
/// needs no drain: hyper answers and closes the connection.) The bytes are not held: the body
/// budget is given back before the drain.
pub const H2_DRAIN_FACTOR: usize = 4;
/// Default drain time on shutdown.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);
/// Default idle timeout of a connection (see [`serve`]): hyper's own default header timeout.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// HTTP/2: a keep-alive ping is sent after this long without a frame from the peer.
pub const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// HTTP/2: a peer that does not answer a keep-alive ping within this is disconnected.
pub const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2: concurrent requests (streams) per connection; the API server opens another connection
/// beyond it.
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 100;
/// Connections open at once, at most: one more is closed as soon as it is accepted, before its
/// TLS handshake. Each idle TLS connection holds about 22 KB (4,000 held 98 MB in a fresh user's
/// trial), so this bounds them to about 23 MB beside the bodies' budget; the API server opens a
/// few connections per replica (HTTP/2, [`H2_MAX_CONCURRENT_STREAMS`] requests on each).
pub const MAX_CONNECTIONS: usize = 1024;
/// How [`serve`] treats connections: the slow/idle bounds, their number and the HTTP/2 settings
/// (see the module docs). The defaults are the constants above; tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connections {
    /// Bounds the first request on every connection and, on HTTP/1.1, the idle time before each
    /// later request and the time its head takes.
    pub idle_timeout: Duration,
    /// HTTP/2: a keep-alive ping is sent after this long without a frame from the peer.
    pub h2_keep_alive_interval: Duration,
    /// HTTP/2: a peer that does not answer a keep-alive ping within this is disconnected.
    pub h2_keep_alive_timeout: Duration,
    /// HTTP/2: concurrent streams per connection (the `SETTINGS_MAX_CONCURRENT_STREAMS` sent).
    pub h2_max_concurrent_streams: u32,
    /// Connections open at once, at most ([`MAX_CONNECTIONS`]).
    pub max_connections: usize,
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            h2_keep_alive_interval: H2_KEEP_ALIVE_INTERVAL,
            h2_keep_alive_timeout: H2_KEEP_ALIVE_TIMEOUT,
            h2_max_concurrent_streams: H2_MAX_CONCURRENT_STREAMS,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// The acceptor under TLS that caps the connections open at once: each accepted TCP stream
/// takes a permit, held by the stream until the connection closes; with none left, the stream
/// is closed at once (`accept` fails, and axum-server drops it) rather than queued.
#[derive(Debug, Clone)]
struct ConnectionLimit {
    permits: Arc<tokio::sync::Semaphore>,
}

/// A stream that holds its connection's permit.
struct Limited<S> {
    inner: S,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl<S> axum_server::accept::Accept<tokio::net::TcpStream, S> for ConnectionLimit {
    type Stream = Limited<tokio::net::TcpStream>;
    type Service = S;
    type Future = std::future::Ready<std::io::Result<(Self::Stream, S)>>;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        std::future::ready(match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Ok((Limited { inner: stream, _permit: permit }, service)),
            Err(_) => Err(std::io::Error::other("the connection limit is reached")),
        })
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Limited<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Limited<S> {
    fn poll_write(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Bodies above this size are reviewed on the blocking pool, so that a large parse neither
/// stalls the async workers nor escapes the request timeout.
const INLINE_REVIEW_MAX_BYTES: usize = 256 * 1024;

/// The plan the webhook serves, shared between the publisher (the controller, or the static
/// plan of the stand-alone webhook) and every request. Reads are lock-free.
#[derive(Debug, Clone)]
pub struct PlanHandle {
    plan: Arc<ArcSwap<Plan>>,
    published: Arc<AtomicBool>,
}

impl Default for PlanHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl PlanHandle {
    /// Nothing published yet: [`current`](Self::current) is the empty plan (no policy, so no pod
    /// is mutated) and [`is_published`](Self::is_published) is false (not ready).
    pub fn new() -> Self {
        Self { plan: Arc::new(ArcSwap::from_pointee(Plan::default())), published: Arc::new(AtomicBool::new(false)) }
    }

    /// A handle with `plan` already published.
    pub fn with_plan(plan: Plan) -> Self {
        let h = Self::new();
        h.publish(plan);
        h
    }

    /// Replaces the plan; requests that start after this see the new one.
    pub fn publish(&self, plan: Plan) {
        self.plan.store(Arc::new(plan));
        self.published.store(true, Ordering::Release);
    }

    /// The plan now.
    pub fn current(&self) -> Arc<Plan> {
        self.plan.load_full()
    }

    /// True once a plan has been published.
    pub fn is_published(&self) -> bool {
        self.published.load(Ordering::Acquire)
    }
}

/// Request limits.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// Largest accepted body, bytes.
    pub max_body_bytes: usize,
    /// Time allowed to read the body and answer.
    pub request_timeout: Duration,
    /// Time allowed for the body to arrive once its bytes are reserved in `body_budget`; then
    /// 408 and the reservation is given back. Without it, clients that declare large bodies and
    /// send them slowly hold the budget for the whole request timeout, and every other review
    /// waits that long (seen with 25 connections of 3 MB that sent one byte: a review took 3.4 s).
    pub body_timeout: Duration,
    /// The bound on body bytes held by all requests at once.
    pub body_budget: BodyBudget,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            body_budget: BodyBudget::new(DEFAULT_MAX_BUFFERED_BODY_BYTES),
        }
    }
}

/// A process-wide bound on the request body bytes held at once, so that many large bodies
/// arriving together (every stream of every connection at the per-request limit) cannot take
/// the process's memory. Before reading its body, a request reserves its whole size at once:
/// its `Content-Length`, or the per-request limit when no length is declared. Reserving all at
/// once (never a part, then waiting for more) keeps requests from holding budget while they
/// wait for each other: reservations are granted first come, first served, and a request that
/// waits past its timeout gets the usual 503. The reservation is given back when the request
/// has been answered. Bytes, shared by clones.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    bytes: usize,
    permits: Arc<tokio::sync::Semaphore>,
}

impl BodyBudget {
    /// A budget of `bytes` (at least 1, at most tokio's semaphore maximum).
    pub fn new(bytes: usize) -> Self {
        let bytes = bytes.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Self { bytes, permits: Arc::new(tokio::sync::Semaphore::new(bytes)) }
    }

    /// The budget, bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes not reserved by any request now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// Reserves `n` bytes (at most the whole budget), waiting while others hold them.
    async fn reserve(&self, n: usize) -> Result<tokio::sync::OwnedSemaphorePermit, String> {
        let n = u32::try_from(n.min(self.bytes)).map_err(|_| format!("a reservation of {n} bytes is larger than any budget"))?;
        self.permits.clone().acquire_many_owned(n).await.map_err(|e| e.to_string())
    }
}

/// What every request needs.
#[derive(Clone)]
pub struct WebhookState {
    /// The plan.
    pub plan: PlanHandle,
    /// Services, for scope ServiceBacked.
    pub services: Arc<dyn ServiceIndex>,
    /// Metrics.
    pub metrics: WebhookMetrics,
    /// Limits.
    pub settings: RequestLimits,
}

impl std::fmt::Debug for WebhookState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookState").field("plan", &self.plan).field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// The webhook router: `POST /mutate`; any other method on it is 405 (`Allow: POST`), any other
/// path 404, each after the rest of an HTTP/2 body is drained ([`H2_DRAIN_FACTOR`]).
pub fn router(state: WebhookState) -> Router {
    Router::new().route("/mutate", post(mutate).fallback(method_not_allowed)).fallback(not_found).with_state(state)
}

/// On HTTP/2, reads and discards the rest of the body, at most [`H2_DRAIN_FACTOR`] times the
/// body `limit`, before an answer that does not read it (see [`H2_DRAIN_FACTOR`]); on HTTP/1.1
/// nothing.
async fn drain_h2(version: Version, body: &mut Body, limit: usize, timeout: Duration) {
    if version == Version::HTTP_2 {
        drain(body, limit.saturating_mul(H2_DRAIN_FACTOR), timeout).await;
    }
}

async fn not_found(State(state): State<WebhookState>, request: Request) -> Response {
    let (parts, mut body) = request.into_parts();
    drain_h2(parts.version, &mut body, state.settings.max_body_bytes, state.settings.body_timeout).await;
    text(StatusCode::NOT_FOUND, format!("no route for {}: the webhook serves POST /mutate", parts.uri.path()))
}

async fn method_not_allowed(State(state): State<WebhookState>, request: Request) -> Response {
    let (parts, mut body) = request.into_parts();
    drain_h2(parts.version, &mut body, state.settings.max_body_bytes, state.settings.body_timeout).await;
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, format!("method {} not allowed: the webhook serves POST /mutate", parts.method));
    r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
    r
}

fn text(status: StatusCode, message: String) -> Response {
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"))], message + "\n").into_response()
}

/// True for `application/json` with optional parameters (`; charset=utf-8`).
fn is_json(headers: &HeaderMap) -> Result<(), String> {
    let Some(v) = headers.get(header::CONTENT_TYPE) else {
        return Err("missing Content-Type; expected application/json".into());
    };
    let s = v.to_str().unwrap_or("");
    let essence = s.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") { Ok(()) } else { Err(format!("unsupported Content-Type {s:?}; expected application/json")) }
}

/// A request that was answered before `review` ran.
struct Rejected {
    status: StatusCode,
    decision: &'static str,
    message: String,
}

/// Reads and discards what is left of `body`, at most `max` bytes, for at most `timeout` (see
/// [`H2_DRAIN_FACTOR`]). Stops early, leaving the rest unread, on a larger body, a read error or
/// the timeout.
async fn drain(body: &mut Body, max: usize, timeout: Duration) {
    let mut left = max;
    let run = async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                let Some(rest) = left.checked_sub(data.len()) else { return };
                left = rest;
            }
        }
    };
    let _ = tokio::time::timeout(timeout, run).await;
}

/// Reads the body within `limit` and `timeout`, after reserving its size in `budget` (see
/// [`BodyBudget`]); the returned permit holds the reservation until it is dropped (after the
/// answer). A body that has not arrived within `timeout` is 408. A body over `limit` is 413; on
/// HTTP/2 (`version`) its rest is drained first ([`H2_DRAIN_FACTOR`]).
async fn read_body(
    headers: &HeaderMap,
    version: Version,
    mut body: Body,
    limit: usize,
    timeout: Duration,
    budget: &BodyBudget,
) -> Result<(Bytes, tokio::sync::OwnedSemaphorePermit), Rejected> {
    let too_large = || Rejected {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        decision: "payload_too_large",
        message: format!("request body exceeds the limit of {limit} bytes"),
    };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = declared.filter(|&len| len > limit as u64) {
        if len <= limit.saturating_mul(H2_DRAIN_FACTOR) as u64 {
            drain_h2(version, &mut body, limit, timeout).await;
        }
        return Err(too_large());
    }
    // hyper ends a body at its declared length (more is a protocol error), so the declared
    // length is enough; without one, the limit
    let reserve = declared.map_or(limit, |len| usize::try_from(len).unwrap_or(limit));
    let reserved = budget.reserve(reserve).await.map_err(|e| Rejected {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        decision: "fail_open",
        message: format!("internal error: body budget: {e}"),
    })?;
    // the frames are copied into one buffer of the declared length as they arrive: the body is
    // held once (collecting the frames, then joining them, held it twice at the end)
    let collect = async {
        let mut buf: Vec<u8> = Vec::with_capacity(declared.map_or(UNDECLARED_BODY_CAPACITY, |len| usize::try_from(len).unwrap_or(limit)).min(limit));
        while let Some(frame) = body.frame().await {
            // usually the client went away mid-body (a reset stream or connection)
            let frame = frame.map_err(|e| Some(e.to_string()))?;
            if let Some(data) = frame.data_ref() {
                if buf.len() + data.len() > limit {
                    return Err(None);
                }
                buf.extend_from_slice(data);
            }
        }
        Ok::<_, Option<String>>(Bytes::from(buf))
    };
    let Ok(collected) = tokio::time::timeout(timeout, collect).await else {
        return Err(Rejected {
            status: StatusCode::REQUEST_TIMEOUT,
            decision: "body_timeout",
            message: format!("the request body did not arrive within {} ms (--body-timeout-ms)", timeout.as_millis()),
        });
    };
    match collected {
        Ok(bytes) => Ok((bytes, reserved)),
        Err(None) => {
            drop(reserved);
            drain_h2(version, &mut body, limit, timeout).await;
            Err(too_large())
        }
        Err(Some(e)) => Err(Rejected { status: StatusCode::BAD_REQUEST, decision: "body_read_error", message: format!("cannot read the request body: {e}") }),
    }
}

/// The first capacity of the buffer of a body sent without a `Content-Length`, bytes (it grows
/// as the body comes, up to the limit).
const UNDECLARED_BODY_CAPACITY: usize = 64 * 1024;

async fn answer(state: &WebhookState, headers: &HeaderMap, version: Version, mut body: Body) -> Result<ReviewOutcome, Rejected> {
    if let Err(message) = is_json(headers) {
        drain_h2(version, &mut body, state.settings.max_body_bytes, state.settings.body_timeout).await;
        return Err(Rejected { status: StatusCode::UNSUPPORTED_MEDIA_TYPE, decision: "unsupported_media_type", message });
    }
    // the budget is held until the answer is built (the parse's own memory is smaller)
    let (bytes, _reserved) = read_body(headers, version, body, state.settings.max_body_bytes, state.settings.body_timeout, &state.settings.body_budget).await?;
    let plan = state.plan.current();
    if bytes.len() <= INLINE_REVIEW_MAX_BYTES {
        Ok(review(&bytes, &plan, state.services.as_ref()))
    } else {
        let services = state.services.clone();
        tokio::task::spawn_blocking(move || review(&bytes, &plan, services.as_ref())).await.map_err(|e| Rejected {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            decision: "fail_open",
            message: format!("internal error: {e}"),
        })
    }
}

/// Longest value of a request-supplied log field, bytes (a Kubernetes name is at most 253).
const LOG_FIELD_MAX_BYTES: usize = 256;

/// `s` as a log field. Request-supplied text (uid, namespace, name, messages quoting them) may
/// hold line breaks, NULs or bidirectional overrides that would forge or hide log lines, or
/// spaces, `=` and quotes that would forge `key=value` fields of the text format. Such a value
/// is written quoted, with `"` and `\` backslash-escaped and every control, line/paragraph
/// separator and bidirectional character as a `\u{..}` escape, and any value is cut after
/// [`LOG_FIELD_MAX_BYTES`] with `…`. Clean, short values (all real uids and names) are borrowed
/// unchanged.
fn loggable(s: &str) -> std::borrow::Cow<'_, str> {
    let escaped =
        |c: char| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let quoted = |c: char| escaped(c) || matches!(c, ' ' | '=' | '"' | '\\');
    if s.len() <= LOG_FIELD_MAX_BYTES && !s.chars().any(quoted) {
        return std::borrow::Cow::Borrowed(s);
    }
    let needs_quotes = s.chars().any(quoted);
    let mut out = String::with_capacity(LOG_FIELD_MAX_BYTES + 16);
    if needs_quotes {
        out.push('"');
    }
    let mut kept = 0;
    for c in s.chars() {
        if kept + c.len_utf8() > LOG_FIELD_MAX_BYTES {
            out.push('…');
            break;
        }
        kept += c.len_utf8();
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if escaped(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    if needs_quotes {
        out.push('"');
    }
    std::borrow::Cow::Owned(out)
}

async fn mutate(State(state): State<WebhookState>, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let timeout = state.settings.request_timeout;
    let result = match tokio::time::timeout(timeout, answer(&state, &parts.headers, parts.version, body)).await {
        Ok(r) => r,
        Err(_) => Err(Rejected {
            status: StatusCode::SERVICE_UNAVAILABLE,
            decision: "timeout",
            message: format!("admission request not answered within {} ms", timeout.as_millis()),
        }),
    };
    let elapsed = started.elapsed();
    let duration_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    match result {
        Ok(out) => {
            state.metrics.observe(out.decision, elapsed, out.fail_open);
            let status = StatusCode::from_u16(out.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            if status == StatusCode::OK {
                if out.fail_open {
                    tracing::error!(uid = %loggable(&out.uid), namespace = %loggable(&out.namespace), pod = %loggable(&out.name), decision = out.decision, duration_us, "admission review failed open: pod admitted unchanged");
                } else {
                    tracing::info!(uid = %loggable(&out.uid), namespace = %loggable(&out.namespace), pod = %loggable(&out.name), decision = out.decision, patch_ops = out.patch_ops, duration_us, "admission review");
                }
                (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], out.body).into_response()
            } else {
                let message = String::from_utf8_lossy(&out.body).trim_end().to_string();
                tracing::warn!(status = status.as_u16(), decision = out.decision, duration_us, error = %loggable(&message), "admission request rejected");
                text(status, message)
            }
        }
        Err(r) => {
            state.metrics.observe(r.decision, elapsed, false);
            tracing::warn!(status = r.status.as_u16(), decision = r.decision, duration_us, error = %loggable(&r.message), "admission request rejected");
            text(r.status, r.message)
        }
    }
}

/// Serves `app` over TLS on `listener` until `shutdown` is cancelled, then stops accepting
/// (the listening socket is closed), lets in-flight requests finish for at most `drain`, and
/// returns. `tls` must offer ALPN (see [`super::tls::server_config`]). `connections` bounds slow
/// and idle connections and their number, and sets HTTP/2's keep-alive and stream limit
/// ([`Connections`]).
pub async fn serve(
    listener: std::net::TcpListener,
    app: Router,
    tls: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
    drain: Duration,
    connections: Connections,
) -> std::io::Result<()> {
    let Connections { idle_timeout, h2_keep_alive_interval, h2_keep_alive_timeout, h2_max_concurrent_streams, max_connections } = connections;
    let handle = axum_server::Handle::new();
    let trigger = crate::shutdown::drain_when_cancelled(&handle, shutdown, drain);
    let config = axum_server::tls_rustls::RustlsConfig::from_config(tls);
    let limit = ConnectionLimit { permits: Arc::new(tokio::sync::Semaphore::new(max_connections.max(1))) };
    let mut server = axum_server::from_tcp_rustls(listener, config)?
        // the cap is taken before the TLS handshake: a refused connection costs no TLS state
        .map(|tls| tls.acceptor(limit))
        // a connection that sends no request is closed (slow or idle clients cannot pin sockets)
        .first_request_timeout(idle_timeout)
        .handle(handle);
    let builder = server.http_builder();
    // axum-server installs a timer but turns the header timeout off; with it, hyper also closes
    // a keep-alive connection that stays idle, or dribbles its next head, for this long
    builder.http1().keep_alive(true).header_read_timeout(idle_timeout);
    builder.http2().keep_alive_interval(h2_keep_alive_interval).keep_alive_timeout(h2_keep_alive_timeout).max_concurrent_streams(h2_max_concurrent_streams);
    let result = server.serve(app.into_make_service()).await;
    trigger.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loggable_quotes_and_escapes_what_could_forge_or_hide_log_lines_and_cuts_long_values() {
        assert!(matches!(loggable("0c9a8d74-9cb7"), std::borrow::Cow::Borrowed("0c9a8d74-9cb7")));
        assert_eq!(loggable("a\nlevel=INFO b"), r#""a\u{a}level=INFO b""#);
        assert_eq!(loggable("x\0y\u{202e}z\r"), r#""x\u{0}y\u{202e}z\u{d}""#);
        assert_eq!(loggable("x decision=\"denied\""), r#""x decision=\"denied\"""#);
        assert_eq!(loggable("lit\\u{a}\u{2028}"), r#""lit\\u{a}\u{2028}""#);
        let long = "é".repeat(1000);
        let cut = loggable(&long);
        assert_eq!(cut.chars().count(), 129, "128 two-byte characters (256 bytes), then the ellipsis");
        assert!(cut.ends_with('…'));
    }

    #[tokio::test]
    async fn body_budget_reservations_wait_and_are_given_back() {
        let budget = BodyBudget::new(1000);
        let a = budget.reserve(600).await.unwrap();
        assert_eq!(budget.available(), 400);
        // a reservation that does not fit waits
        assert!(tokio::time::timeout(Duration::from_millis(50), budget.reserve(500)).await.is_err());
        drop(a);
        let b = budget.reserve(500).await.unwrap();
        assert_eq!(budget.available(), 500);
        drop(b);
        assert_eq!(budget.available(), 1000);
        // a reservation larger than the whole budget takes all of it rather than waiting forever
        let all = budget.reserve(5000).await.unwrap();
        assert_eq!(budget.available(), 0);
        drop(all);
    }
}
