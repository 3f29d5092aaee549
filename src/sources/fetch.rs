//! The one size-limited HTTP fetcher every source uses: a GET whose body is read chunk by chunk
//! and refused as soon as it passes a limit (an endless or huge body never grows memory beyond
//! it), plus kube-proxy's `/proxyMode`, read from the same server on the same terms. The command
//! line's URL source ([`super::fetch_url`]) and the operator's scraper
//! ([`super::scrape::scrape_once`]) differ only in how they word a failure.
//!
//! A `/metrics` GET ([`get_scrape`]) sends an `Accept` header (protobuf first, text as the
//! fallback: [`crate::core::exposition::ACCEPT_PROTOBUF_FIRST`]) and returns the body with the
//! answer's `Content-Type`, which says how to read it ([`crate::core::exposition::parse_scrape`]).

use crate::core::model::ProxyMode;
use std::time::Duration;

/// Default cap on a `/metrics` body, bytes (the scraper's and `analyze --max-body-bytes`'s): a
/// large cluster's scrape is a few hundred KB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Cap on a `/proxyMode` body, bytes (the answer is one word such as `iptables`).
pub const MAX_PROXY_MODE_BYTES: usize = 64 * 1024;

/// Why a GET gave no body.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The request or the body failed on the wire (refused, timed out, reset); the message is
    /// [`connect_hint`]'s.
    #[error("{}", connect_hint(.0))]
    Transport(#[from] reqwest::Error),
    /// The server answered with a status other than 2xx.
    #[error("HTTP {0}")]
    Status(reqwest::StatusCode),
    /// The body passed the limit; reading stopped there.
    #[error("body larger than {limit} bytes")]
    TooLarge {
        /// The limit, bytes.
        limit: usize,
    },
}

/// A `/metrics` body, at most the limit, and the `Content-Type` it came with (`None`: absent or
/// not visible ASCII).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeBody {
    /// The body.
    pub bytes: Vec<u8>,
    /// The answer's `Content-Type`.
    pub content_type: Option<String>,
}

/// GET `url` with `Accept: accept`: a 2xx answer's body (at most `limit` bytes) and content type.
pub async fn get_scrape(client: &reqwest::Client, url: &str, limit: usize, accept: &str) -> Result<ScrapeBody, FetchError> {
    let resp = client.get(url).header(reqwest::header::ACCEPT, accept).send().await?;
    let status = resp.status();
    if !status.is_success() {
        return Err(FetchError::Status(status));
    }
    let content_type = content_type(resp.headers());
    Ok(ScrapeBody { bytes: read_limited(resp, limit).await?, content_type })
}

/// The `Content-Type` of an answer with `headers`, when present and visible ASCII.
pub fn content_type(headers: &reqwest::header::HeaderMap) -> Option<String> {
    headers.get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// GET `url`: a 2xx answer's body, at most `limit` bytes.
pub async fn get_limited(client: &reqwest::Client, url: &str, limit: usize) -> Result<Vec<u8>, FetchError> {
    let resp = client.get(url).send().await?;
    let status = resp.status();
    if !status.is_success() {
        return Err(FetchError::Status(status));
    }
    read_limited(resp, limit).await
}

/// Reads `resp`'s body, whatever its status, at most `limit` bytes.
pub async fn read_limited(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, FetchError> {
    let mut buf: Vec<u8> = Vec::with_capacity(resp.content_length().map_or(64 * 1024, |n| n as usize).min(limit));
    while let Some(chunk) = resp.chunk().await? {
        if buf.len() + chunk.len() > limit {
            return Err(FetchError::TooLarge { limit });
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

/// The mode kube-proxy's `/proxyMode` at `url` reports. Best effort: older or non-Linux
/// kube-proxies may not serve it, so an error, an error status, a body over
/// [`MAX_PROXY_MODE_BYTES`] or an unknown mode are all `None` (the mode is then inferred).
pub async fn proxy_mode(client: &reqwest::Client, url: &str) -> Option<ProxyMode> {
    let body = get_limited(client, url, MAX_PROXY_MODE_BYTES).await.ok()?;
    ProxyMode::parse(std::str::from_utf8(&body).ok()?)
}

/// A kube-proxy scrape: the `/metrics` body at `metrics_url` (at most `limit` bytes, asked for
/// with `Accept: accept`) and, when `mode_url` is given, `/proxyMode` fetched at the same time
/// ([`proxy_mode`]).
pub async fn fetch_scrape(
    client: &reqwest::Client,
    metrics_url: &str,
    mode_url: Option<&str>,
    limit: usize,
    accept: &str,
) -> (Result<ScrapeBody, FetchError>, Option<ProxyMode>) {
    let metrics = get_scrape(client, metrics_url, limit, accept);
    match mode_url {
        Some(mode_url) => tokio::join!(metrics, proxy_mode(client, mode_url)),
        None => (metrics.await, None),
    }
}

/// Explains a failed connection the way an operator needs it explained: the error and its
/// causes, plus a hint for a refused connection to kube-proxy's metrics port
/// [`super::targets::DEFAULT_PORT`] (its default 127.0.0.1 bind), a connect timeout (a firewall on
/// the URL's port) or a timeout after connecting (no answer in time).
pub fn connect_hint(err: &reqwest::Error) -> String {
    let mut msg = error_chain(err);
    let port = err.url().and_then(reqwest::Url::port_or_known_default);
    if err.is_connect() && msg.to_ascii_lowercase().contains("refused") && port == Some(super::targets::DEFAULT_PORT) {
        msg.push_str(
            " (kube-proxy binds its metrics server to 127.0.0.1:10249 by default: set metricsBindAddress: 0.0.0.0:10249 in its KubeProxyConfiguration; the operator, `safe-termination run`, can also read it through its node agent or a Prometheus server: --source auto or prometheus)",
        );
    } else if err.is_timeout() && err.is_connect() {
        // the connection never completed: dropped packets look like this
        let port = err.url().and_then(|u| u.port_or_known_default()).map_or_else(|| "the port".to_string(), |p| format!("port {p}"));
        msg.push_str(&format!(" (timed out connecting: is a NetworkPolicy or host firewall blocking {port}?)"));
    } else if err.is_timeout() {
        msg.push_str(" (timed out after connecting: no complete answer in time; is kube-proxy overloaded?)");
    }
    msg
}

/// The error and its causes, `: `-separated (`error sending request for url (...): client
/// error (Connect): tcp connect error: Connection refused (os error 111)`), without a hint.
pub fn error_chain(err: &reqwest::Error) -> String {
    let mut msg = err.to_string();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(err);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// An HTTP client for scraping many hosts (kube-proxies, `/configz`, the command line's URLs):
/// rustls (ring), the given per-request timeout, no proxy, and no idle connection kept between
/// requests. The connect timeout is 100 ms shorter (at least half the timeout), so that a
/// connection that never completes ends as a connect timeout (see [`connect_hint`]) rather than
/// racing the overall one.
///
/// Why no keep-alive: the operator scrapes every node every 30 s by default: too seldom for
/// thousands of open sockets to be worth their memory, and reqwest's defaults (up to
/// `usize::MAX` idle connections per host, closed after 90 s idle, more than the interval) kept
/// one connection per kube-proxy forever, each holding hyper's read buffer grown to the last
/// body (a scrape is ~80 KB): 5,000 nodes' idle connections could hold several hundred MB.
/// With `pool_max_idle_per_host(0)` hyper-util disables its pool altogether (no per-host map of idle
/// connections, waiters or connecting keys), so a connection and its buffers are freed as soon as
/// its response is read; the price is one TCP handshake per request (and a socket in TIME_WAIT,
/// kernel memory, for a minute). Nothing else in the client
/// is kept per host: DNS goes through getaddrinfo without a cache, and rustls' TLS session cache
/// (https targets only) is bounded at 256 servers' tickets.
/// [`keep_alive_http_client`] is the client for a single host queried repeatedly (Prometheus).
pub fn http_client(timeout: Duration) -> reqwest::Client {
    build_client(client_builder(timeout).pool_max_idle_per_host(0))
}

/// An HTTP client for one server queried again and again (the Prometheus source: five
/// concurrent queries per analysis): as [`http_client`], but idle connections are kept for
/// reuse (reqwest's defaults: closed after 90 s idle), saving a TCP and TLS handshake per query;
/// with one host, that is a handful of connections, not one per node.
pub fn keep_alive_http_client(timeout: Duration) -> reqwest::Client {
    build_client(client_builder(timeout))
}

/// The settings every client shares: timeouts (see [`http_client`]) and no proxy; the node
/// agents' client ([`super::agent`]) adds its TLS configuration to it.
pub fn client_builder(timeout: Duration) -> reqwest::ClientBuilder {
    let connect_timeout = timeout.saturating_sub(Duration::from_millis(100)).max(timeout / 2);
    // reqwest's rustls (and `Client::new`, which panics without one) needs a process-wide
    // crypto provider: the binary installs ring first; this covers library callers and tests
    // (a no-op when one is installed)
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    reqwest::Client::builder().timeout(timeout).connect_timeout(connect_timeout).no_proxy()
}

/// Builds `builder`, or falls back to a default client when that fails.
fn build_client(builder: reqwest::ClientBuilder) -> reqwest::Client {
    builder.build().unwrap_or_else(|_| reqwest::Client::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A keep-alive HTTP/1.1 server on 127.0.0.1 answering `ok` to every request: its URL and
    /// the number of connections it accepted.
    async fn counting_server() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while let Ok(n) = conn.read(&mut chunk).await {
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if conn.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    /// Connections `client` opens for three GETs in a row, 100 ms apart.
    async fn connections_for_three_gets(client: &reqwest::Client) -> usize {
        let (url, accepted) = counting_server().await;
        for _ in 0..3 {
            assert_eq!(get_limited(client, &url, 1024).await.unwrap(), b"ok");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        accepted.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn the_scrape_client_keeps_no_idle_connection_and_the_prometheus_one_does() {
        let timeout = Duration::from_secs(5);
        assert_eq!(connections_for_three_gets(&http_client(timeout)).await, 3);
        assert_eq!(connections_for_three_gets(&keep_alive_http_client(timeout)).await, 1);
    }
}
