//! The agent's HTTP side: the mutual-TLS router with kube-proxy's three paths, and the
//! plain-HTTP health router.
//!
//! | path | answer |
//! |---|---|
//! | `GET /metrics` | kube-proxy's scrape, only the families the operator reads, in the exposition kube-proxy answered: protobuf ([`PROTOBUF_CONTENT_TYPE`](crate::core::exposition::format::PROTOBUF_CONTENT_TYPE), native histograms) when the request's `Accept` admits it, else text (`text/plain; version=0.0.4`); with the proxy mode in the [`PROXY_MODE_HEADER`] header when `/proxyMode` answered |
//! | `GET /proxyMode` | the proxy mode (`text/plain`) |
//! | `GET /configz` | kube-proxy's configuration, only the fields the operator reads (`application/json`) |
//! | `POST /removals[?since=<mark>]` | the observer: replaces the watches with the request's (or keeps them, `sameSet`) and answers their records, or those changed since the mark ([`crate::agent_contract::observer`]; 400 for a body that is not a request or a bad `since`, 413 past its bounds) |
//! | anything else | 404 |
//! | `GET /healthz` (health port, no TLS) | `ok`, or 503 while no TLS material is loaded or after a shutdown signal; no data |
//! | `GET /metrics` (health port, no TLS) | the observer's own metrics ([`crate::agent::observer::metrics`]: counts and windows, no kube-proxy data), protobuf (native histograms) when the request's `Accept` admits it, else text |
//!
//! When kube-proxy cannot be read, the answer is 502 (504 for a timeout) with the reason in the
//! [`REASON_HEADER`] header (the operator's scrape failure labels) and the message as the body,
//! so the operator reports the node's failure as a direct scrape would.

use super::observer::watch::Observer;
use super::upstream::{Answer, KubeProxy};
use crate::agent_contract::observer::{AnswerMark, MAX_REQUEST_BYTES, ObserveRequest, REMOVALS_PATH, RequestError};
use crate::agent_contract::protocol::{PROXY_MODE_HEADER, REASON_HEADER};
use crate::agent_contract::tls::AgentTls;
use crate::core::exposition::accepts_protobuf;
use crate::core::measure::reason;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Default health port of the agent (plain HTTP: `/healthz` and the observer's `/metrics`).
pub const DEFAULT_HEALTH_PORT: u16 = 10350;

/// Content type of the filtered scrape in the text format (Prometheus text format 0.0.4, as
/// kube-proxy serves it); a protobuf scrape is served as
/// [`crate::core::exposition::format::PROTOBUF_CONTENT_TYPE`].
pub const METRICS_CONTENT_TYPE: &str = crate::core::exposition::format::TEXT_CONTENT_TYPE;

/// The mutual-TLS router: `/metrics`, `/proxyMode`, `/configz` from `kube_proxy`,
/// `/removals` from `observer`; 404 for the rest.
pub fn router(kube_proxy: Arc<KubeProxy>, observer: Arc<Observer>) -> Router {
    Router::new()
        .route(
            REMOVALS_PATH,
            post(move |query: RawQuery, body: axum::body::Bytes| std::future::ready(removals(&observer, query.0.as_deref(), &body)))
                .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES)),
        )
        .route("/metrics", get(|State(k): State<Arc<KubeProxy>>, headers: HeaderMap| async move { metrics(&k, &headers).await }))
        .route("/proxyMode", get(|State(k): State<Arc<KubeProxy>>| async move { answer(k.proxy_mode().await) }))
        .route("/configz", get(|State(k): State<Arc<KubeProxy>>| async move { answer(k.configz().await) }))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found: the agent serves /metrics, /proxyMode, /configz and POST /removals\n") })
        .with_state(kube_proxy)
}

/// `/metrics` (protobuf first when the request's `Accept` admits it) and, best effort, the
/// proxy mode in [`PROXY_MODE_HEADER`] (both read from kube-proxy at once).
async fn metrics(k: &KubeProxy, request: &HeaderMap) -> Response {
    let protobuf = accepts_protobuf(request.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let (metrics, mode) = tokio::join!(k.metrics(protobuf), k.proxy_mode());
    let mut response = answer(metrics);
    if response.status().is_success()
        && let Ok(mode) = mode
        && let Ok(value) = HeaderValue::from_bytes(&mode.body)
    {
        response.headers_mut().insert(header::HeaderName::from_static(PROXY_MODE_HEADER), value);
    }
    response
}

/// `POST /removals[?since=<epoch>.<generation>]`: the observer's answer as JSON, or 400/413
/// naming what was wrong.
fn removals(observer: &Observer, query: Option<&str>, body: &[u8]) -> Response {
    let mut since = None;
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("since", v)) => match AnswerMark::from_query(v) {
                Some(m) => since = Some(m),
                None => return (StatusCode::BAD_REQUEST, format!("since={v}: expected <epoch>.<generation>, two whole numbers\n")).into_response(),
            },
            _ => return (StatusCode::BAD_REQUEST, format!("query {pair:?}: only since=<epoch>.<generation> is read\n")).into_response(),
        }
    }
    let request: ObserveRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("not an observe request: {e}\n")).into_response(),
    };
    if let Err(e) = request.check() {
        let status = if matches!(e, RequestError::TooManyWatches { .. }) { StatusCode::PAYLOAD_TOO_LARGE } else { StatusCode::BAD_REQUEST };
        return (status, format!("observe request out of bounds: {e}\n")).into_response();
    }
    axum::Json(observer.observe(&request, since)).into_response()
}

/// An [`Answer`] as an HTTP response (see the module docs).
fn answer(answer: Answer) -> Response {
    match answer {
        Ok(served) => (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static(served.content_type))], served.body.to_vec()).into_response(),
        Err(e) => {
            tracing::warn!(reason = e.reason, error = %e.message, "kube-proxy could not be read");
            let status = if e.reason == reason::TIMEOUT { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY };
            (
                status,
                [
                    (header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8")),
                    (header::HeaderName::from_static(REASON_HEADER), HeaderValue::from_static(e.reason)),
                ],
                e.message + "\n",
            )
                .into_response()
        }
    }
}

/// The health router (plain HTTP, for the kubelet and a Prometheus): `GET /healthz` is 200 `ok`
/// while `tls` has usable material and `shutdown` has not fired, else 503 saying which; it reads
/// nothing from kube-proxy (a kube-proxy that is down must not restart the agent). `GET /metrics`
/// is `observer`'s own metrics, labelled with `node` when known.
pub fn health_router(tls: Arc<AgentTls>, shutdown: CancellationToken, observer: Arc<Observer>, node: Option<String>) -> Router {
    let node = Arc::new(node);
    Router::new()
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let protobuf = accepts_protobuf(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
                let body = observer.exposition(protobuf, node.as_deref());
                let content_type = if protobuf { crate::core::exposition::format::PROTOBUF_CONTENT_TYPE } else { METRICS_CONTENT_TYPE };
                std::future::ready(([(header::CONTENT_TYPE, HeaderValue::from_static(content_type))], body).into_response())
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let answer = if shutdown.is_cancelled() {
                    (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
                } else if !tls.is_loaded() {
                    (StatusCode::SERVICE_UNAVAILABLE, "no TLS certificate loaded\n")
                } else {
                    (StatusCode::OK, "ok\n")
                };
                std::future::ready(answer)
            }),
        )
}
