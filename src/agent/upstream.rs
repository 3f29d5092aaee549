//! The agent's side towards kube-proxy: each request reads kube-proxy's `/metrics`,
//! `/proxyMode` or `/configz` on the node (default `http://127.0.0.1:10249`), checks it with the
//! operator's own readers and reduces it to what the operator reads. Nothing is cached: one
//! fetch per path may be in flight, and requests that arrive while it runs share its answer
//! ([`Flight`]), so a burst of requests costs one kube-proxy read.
//!
//! `/metrics` is asked for as the operator's own scrape asks (protobuf first, text as the
//! fallback: [`ACCEPT_PROTOBUF_FIRST`]), checked and filtered in whichever format kube-proxy
//! answered, and served in that format, so native histograms reach the operator. A client
//! whose `Accept` names no protobuf (an operator from before protobuf was read) gets text: the
//! agent then asks kube-proxy for text only, in a flight of its own.
//!
//! Bounds: each fetch has a timeout and a body cap (`/metrics`: the operator's 32 MiB default,
//! `/proxyMode`: 64 KiB, `/configz`: 1 MiB), as the operator's own sources have.

use crate::core::exposition::format::{ACCEPT_PROTOBUF_FIRST, ACCEPT_TEXT, Format, check_scrape, filter_scrape};
use crate::core::measure::reason;
use crate::core::model::ProxyMode;
use crate::core::proxyconfig::reduce_configz;
use crate::sources::fetch::{FetchError, MAX_PROXY_MODE_BYTES, ScrapeBody, error_chain, get_scrape};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Default kube-proxy address on the node: its default `metricsBindAddress`.
pub const DEFAULT_KUBE_PROXY_URL: &str = "http://127.0.0.1:10249";
/// Cap on a `/configz` body, bytes.
pub const MAX_CONFIGZ_BYTES: usize = 1024 * 1024;

/// Why kube-proxy's answer cannot be served: a [`reason`] label (the operator's, so the
/// operator reports an agent's failure with the reason a direct scrape would have given) and a
/// message naming the URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UpstreamError {
    /// One of [`reason`]'s labels.
    pub reason: &'static str,
    /// What went wrong, with the URL and a hint.
    pub message: String,
}

/// A body to serve and its content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The body (text, JSON, or the protobuf exposition).
    pub body: Arc<[u8]>,
    /// Its `Content-Type`.
    pub content_type: &'static str,
}

/// A served answer: the body, or why there is none. Cheap to clone (shared by every request of
/// one flight).
pub type Answer = Result<Served, UpstreamError>;

/// One fetch in flight at a time: [`Flight::run`] joins the fetch already running, or starts
/// one. Once it completes, the next call starts a new fetch (no result is kept).
pub struct Flight {
    running: Mutex<Option<Shared<BoxFuture<'static, Answer>>>>,
}

impl Default for Flight {
    fn default() -> Self {
        Self { running: Mutex::new(None) }
    }
}

impl Flight {
    /// The answer of the fetch in flight, or of `start()` when none is (a completed one that
    /// nobody cleared is not reused).
    pub async fn run(&self, start: impl FnOnce() -> BoxFuture<'static, Answer>) -> Answer {
        let flight = {
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            match running.as_ref() {
                Some(f) if f.peek().is_none() => f.clone(),
                _ => {
                    let f = start().shared();
                    *running = Some(f.clone());
                    f
                }
            }
        };
        let answer = flight.clone().await;
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if running.as_ref().is_some_and(|f| f.ptr_eq(&flight)) {
            *running = None;
        }
        answer
    }
}

/// kube-proxy on this node, as the agent reads it.
pub struct KubeProxy {
    base: String,
    http: reqwest::Client,
    timeout: Duration,
    max_body_bytes: usize,
    metrics: Flight,
    metrics_text: Flight,
    proxy_mode: Flight,
    configz: Flight,
}

impl KubeProxy {
    /// kube-proxy at `base_url` (scheme, host and port, e.g. [`DEFAULT_KUBE_PROXY_URL`]; a
    /// trailing `/` is removed), each fetch bounded by `timeout`, `/metrics` by
    /// `max_body_bytes`.
    pub fn new(base_url: &str, timeout: Duration, max_body_bytes: usize) -> Self {
        Self {
            base: base_url.trim_end_matches('/').to_string(),
            http: crate::sources::fetch::http_client(timeout),
            timeout,
            max_body_bytes,
            metrics: Flight::default(),
            metrics_text: Flight::default(),
            proxy_mode: Flight::default(),
            configz: Flight::default(),
        }
    }

    /// `/metrics`, asked for with protobuf first when `protobuf` (the client accepts it), else as
    /// text only; checked with the operator's reader in the format kube-proxy answered (a
    /// cut-off or garbled scrape is a [`reason::PARSE`] error naming the line or message, not a
    /// shorter body), filtered to the families it reads ([`filter_scrape`]) and served in that
    /// format.
    pub async fn metrics(&self, protobuf: bool) -> Answer {
        let (flight, accept) = if protobuf { (&self.metrics, ACCEPT_PROTOBUF_FIRST) } else { (&self.metrics_text, ACCEPT_TEXT) };
        let url = format!("{}/metrics", self.base);
        let (http, timeout, limit) = (self.http.clone(), self.timeout, self.max_body_bytes);
        flight
            .run(move || {
                async move {
                    let body = bounded(timeout, &url, get_scrape(&http, &url, limit, accept)).await?;
                    serve_scrape(&url, body)
                }
                .boxed()
            })
            .await
    }

    /// `/proxyMode`: the mode, as the operator spells it (`iptables`, `nftables`, ...); an
    /// answer that is not a known mode is a [`reason::PARSE`] error.
    pub async fn proxy_mode(&self) -> Answer {
        self.read(&self.proxy_mode, "/proxyMode", MAX_PROXY_MODE_BYTES, "text/plain; charset=utf-8", |url, text| {
            let mode = ProxyMode::parse(&text).ok_or_else(|| parse_error(url, format!("{:?} is not a proxy mode", text.trim())))?;
            Ok(mode.as_str().to_string())
        })
        .await
    }

    /// `/configz` reduced to the fields the operator reads ([`reduce_configz`]); a body the
    /// operator would refuse is a [`reason::PARSE`] error.
    pub async fn configz(&self) -> Answer {
        self.read(&self.configz, "/configz", MAX_CONFIGZ_BYTES, "application/json", |url, text| reduce_configz(&text).map_err(|e| parse_error(url, e))).await
    }

    /// `path` read within `flight` (at most `limit` bytes of UTF-8 text, within the timeout),
    /// then `check`ed and reduced to the answer, served as `content_type` (`check` gets the URL,
    /// for its errors, and the text).
    async fn read(
        &self,
        flight: &Flight,
        path: &str,
        limit: usize,
        content_type: &'static str,
        check: fn(&str, String) -> Result<String, UpstreamError>,
    ) -> Answer {
        let url = format!("{}{path}", self.base);
        let (http, timeout) = (self.http.clone(), self.timeout);
        flight
            .run(move || {
                async move {
                    let body = bounded(timeout, &url, crate::sources::fetch::get_limited(&http, &url, limit)).await?;
                    let text = String::from_utf8(body).map_err(|e| parse_error(&url, format!("not UTF-8 text: {e}")))?;
                    Ok(Served { body: Arc::from(check(&url, text)?.into_bytes()), content_type })
                }
                .boxed()
            })
            .await
    }
}

/// `fetch` (a GET of `url`) within `timeout`, its failure as the agent reports it.
async fn bounded<T>(timeout: Duration, url: &str, fetch: impl std::future::Future<Output = Result<T, FetchError>>) -> Result<T, UpstreamError> {
    match tokio::time::timeout(timeout, fetch).await {
        Err(_) => Err(UpstreamError { reason: reason::TIMEOUT, message: format!("{url}: no complete answer within {:.1} s", timeout.as_secs_f64()) }),
        Ok(r) => r.map_err(|e| failure(url, e)),
    }
}

/// kube-proxy's `/metrics` answer from `url`, checked in the format its content type names
/// ([`check_scrape`]) and filtered, with the content type of that format.
fn serve_scrape(url: &str, body: ScrapeBody) -> Answer {
    let format = Format::from_content_type(body.content_type.as_deref()).map_err(|e| parse_error(url, e))?;
    check_scrape(&body.bytes, format).map_err(|e| parse_error(url, e))?;
    Ok(Served { body: Arc::from(filter_scrape(&body.bytes, format)), content_type: format.content_type() })
}

/// A body of kube-proxy at `url` that the operator would refuse: `what` is why.
fn parse_error(url: &str, what: impl std::fmt::Display) -> UpstreamError {
    UpstreamError { reason: reason::PARSE, message: format!("{url}: {what}") }
}

/// A failed kube-proxy fetch as the agent reports it; a refused connection says what to check
/// on the node (the operator's kube-proxy hint, "set metricsBindAddress to 0.0.0.0", is the
/// opposite of what the agent needs).
fn failure(url: &str, e: FetchError) -> UpstreamError {
    match e {
        FetchError::Transport(e) => {
            let chain = error_chain(&e);
            let (reason, hint) = if e.is_timeout() {
                (reason::TIMEOUT, "")
            } else if e.is_connect() && chain.to_ascii_lowercase().contains("refused") {
                (
                    reason::CONNECTION_REFUSED,
                    " (nothing listens there on this node: is kube-proxy running, and does its metricsBindAddress include this address? Set the agent's --kube-proxy-url otherwise)",
                )
            } else {
                (reason::OTHER, "")
            };
            UpstreamError { reason, message: format!("kube-proxy at {url}: {chain}{hint}") }
        }
        FetchError::Status(status) => UpstreamError { reason: reason::HTTP_STATUS, message: format!("kube-proxy at {url}: HTTP {status}") },
        e @ FetchError::TooLarge { .. } => UpstreamError { reason: reason::OTHER, message: format!("kube-proxy at {url}: {e}") },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_requests_share_one_fetch_and_the_next_one_fetches_again() {
        let flight = Arc::new(Flight::default());
        let started = Arc::new(AtomicUsize::new(0));
        let (release, gate) = tokio::sync::watch::channel(false);
        let start = |started: Arc<AtomicUsize>, mut gate: tokio::sync::watch::Receiver<bool>| {
            move || {
                let n = started.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    let _ = gate.wait_for(|open| *open).await;
                    Ok::<_, UpstreamError>(Served { body: Arc::from(format!("fetch {n}").into_bytes()), content_type: "text/plain" })
                }
                .boxed()
            }
        };
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let (flight, s, g) = (flight.clone(), started.clone(), gate.clone());
                tokio::spawn(async move { flight.run(start(s, g)).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.send_replace(true);
        for w in waiters {
            assert_eq!(&*w.await.unwrap().unwrap().body, b"fetch 1");
        }
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert_eq!(&*flight.run(start(started.clone(), gate.clone())).await.unwrap().body, b"fetch 2", "nothing is cached");
    }
}
