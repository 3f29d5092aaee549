//! Measurement sources: for the command line: a saved scrape file, standard input, or one kube-proxy's
//! metrics URL (`http(s)://host:10249/metrics`, with `/proxyMode` read from the same server).

pub mod prometheus;
pub mod proxyconfig;
pub mod scrape;

use crate::model::ProxyMode;
use std::time::Duration;

/// Default cap on a `/metrics` body, bytes: the operator's scraper's
/// ([`crate::sources::scrape::DEFAULT_MAX_BODY_BYTES`]); a large cluster's scrape is a few
/// hundred KB.
pub const DEFAULT_MAX_BODY_BYTES: usize = crate::sources::scrape::DEFAULT_MAX_BODY_BYTES;
/// Cap on a `/proxyMode` body, bytes (the answer is one word such as `iptables`).
pub const MAX_PROXY_MODE_BYTES: usize = 64 * 1024;

/// Why a source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    File {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file or body is not UTF-8 text.
    #[error("{origin}:{line}: invalid UTF-8 at byte offset {offset} (byte {column} of line {line}): the input must be UTF-8 text")]
    NotUtf8 {
        /// The path, `<stdin>` or URL.
        origin: String,
        /// 1-based line of the first invalid byte.
        line: usize,
        /// 1-based byte column of the first invalid byte within its line.
        column: usize,
        /// 0-based byte offset of the first invalid byte in the input.
        offset: usize,
    },
    /// A URL could not be fetched.
    #[error("{url}: {message}")]
    Http {
        /// The URL, userinfo redacted ([`redact`]).
        url: String,
        /// What went wrong, with a hint for the common causes.
        message: String,
    },
}

/// The text of a scrape and, for URLs, the mode `/proxyMode` reported.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Exposition-format body.
    pub text: String,
    /// Mode from `/proxyMode` (URL sources only, when it answered).
    pub proxy_mode: Option<ProxyMode>,
}

/// The scheme of `source` when it has the form `SCHEME://...` (a letter, then letters, digits,
/// `+`, `-` or `.`), as written; `None` for anything else (a file path, `-`).
pub fn url_scheme(source: &str) -> Option<&str> {
    let (scheme, _) = source.split_once("://")?;
    let mut chars = scheme.chars();
    (chars.next()?.is_ascii_alphabetic() && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))).then_some(scheme)
}

/// True when `source` is an http(s) URL (the scheme in any case, as URLs allow: `HTTP://`).
pub fn is_url(source: &str) -> bool {
    url_scheme(source).is_some_and(|s| s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https"))
}

/// `source` as it may be printed: a URL's userinfo (`user:password@`) replaced by `***@`, so
/// that no message echoes a password; anything else unchanged.
pub fn redact(source: &str) -> String {
    let Some(start) = source.find("://").map(|i| i + 3) else { return source.to_string() };
    let rest = &source[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    match authority.rfind('@') {
        Some(at) => format!("{}***@{}", &source[..start], &rest[at + 1..]),
        None => source.to_string(),
    }
}

/// Reads a file or `-` (standard input) as UTF-8 text; invalid UTF-8 is an error naming the
/// file (`<stdin>`), the line and the byte offset.
pub fn read_file(path: &str) -> Result<String, SourceError> {
    let res = if path == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf).map(|_| buf)
    } else {
        std::fs::read(path)
    };
    let bytes = res.map_err(|source| SourceError::File { path: path.to_string(), source })?;
    decode_utf8(if path == "-" { "<stdin>" } else { path }, bytes)
}

/// `bytes` as UTF-8 text, or [`SourceError::NotUtf8`] naming `origin`, the line, the column and
/// the byte offset of the first invalid byte.
pub fn decode_utf8(origin: &str, bytes: Vec<u8>) -> Result<String, SourceError> {
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let before = &e.as_bytes()[..offset];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = offset - before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
        SourceError::NotUtf8 { origin: origin.to_string(), line, column, offset }
    })
}

/// Explains a failed connection the way an operator needs it explained: the error and its
/// causes, plus a hint for a refused connection (kube-proxy's 127.0.0.1 bind), a connect
/// timeout (a firewall on the URL's port) or a timeout after connecting (no answer in time).
pub fn connect_hint(err: &reqwest::Error) -> String {
    let mut msg = err.to_string();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(err);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    if err.is_connect() && msg.to_ascii_lowercase().contains("refused") {
        msg.push_str(
            " (kube-proxy binds its metrics server to 127.0.0.1:10249 by default: set metricsBindAddress: 0.0.0.0:10249 in its KubeProxyConfiguration, or use the Prometheus source)",
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

/// Reads `resp`'s body chunk by chunk, stopping with an error as soon as it passes `limit`
/// bytes (an endless or huge body never grows memory beyond the limit).
async fn read_limited(mut resp: reqwest::Response, url: &str, limit: usize, flag: &str) -> Result<Vec<u8>, SourceError> {
    let http = |message: String| SourceError::Http { url: redact(url), message };
    let mut buf: Vec<u8> = Vec::with_capacity(resp.content_length().map_or(64 * 1024, |n| n as usize).min(limit));
    while let Some(chunk) = resp.chunk().await.map_err(|e| http(connect_hint(&e)))? {
        if buf.len() + chunk.len() > limit {
            return Err(http(format!("body larger than {limit} bytes{flag}: stopped reading")));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

/// Fetches `url`, reading at most `max_body_bytes` of its body (more is an error naming the URL
/// and the limit), and, from the same server, `/proxyMode` (at most [`MAX_PROXY_MODE_BYTES`]). A
/// failing `/proxyMode` is not an error (older or non-Linux kube-proxies may not serve it): an
/// error status, a body over its limit or an unknown mode all leave the mode to inference.
pub async fn fetch_url(client: &reqwest::Client, url: &str, max_body_bytes: usize) -> Result<Fetched, SourceError> {
    let shown = redact(url);
    let http = |message: String| SourceError::Http { url: shown.clone(), message };
    let resp = client.get(url).send().await.map_err(|e| http(connect_hint(&e)))?;
    if !resp.status().is_success() {
        return Err(http(format!("HTTP {}", resp.status())));
    }
    let body = read_limited(resp, url, max_body_bytes, " (--max-body-bytes)").await?;
    let text = decode_utf8(&shown, body)?;
    let proxy_mode = match reqwest::Url::parse(url) {
        Ok(mut u) => {
            u.set_path("/proxyMode");
            u.set_query(None);
            match client.get(u.clone()).send().await {
                Ok(r) if r.status().is_success() => read_limited(r, u.as_str(), MAX_PROXY_MODE_BYTES, "")
                    .await
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .and_then(|t| ProxyMode::parse(&t)),
                _ => None,
            }
        }
        Err(_) => None,
    };
    Ok(Fetched { text, proxy_mode })
}

/// An HTTP client for scraping: rustls (ring), the given per-request timeout, no proxy. The
/// connect timeout is 100 ms shorter (at least half the timeout), so that a connection that never
/// completes ends as a connect timeout (see [`connect_hint`]) rather than racing the overall one.
pub fn http_client(timeout: Duration) -> reqwest::Client {
    let connect_timeout = timeout.saturating_sub(Duration::from_millis(100)).max(timeout / 2);
    // reqwest's rustls (and `Client::new`, which panics without one) needs a process-wide
    // crypto provider: the binary installs ring first; this covers library callers and tests
    // (a no-op when one is installed)
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(connect_timeout)
        .no_proxy()
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn schemes_are_case_insensitive_and_only_http_is_a_url() {
        use super::{is_url, url_scheme};
        for u in ["http://h/metrics", "HTTP://h/metrics", "Https://h:10249/metrics"] {
            assert!(is_url(u), "{u}");
        }
        for s in ["ftp://h/metrics", "file:///tmp/x", "scrapes/a.txt", "-", "a=http://h/m", "1http://h"] {
            assert!(!is_url(s), "{s}");
        }
        assert_eq!(url_scheme("ftp://h/metrics"), Some("ftp"));
        assert_eq!(url_scheme("svn+ssh://h"), Some("svn+ssh"));
        assert_eq!(url_scheme("dir/x://y"), None);
        assert_eq!(url_scheme("scrape.txt"), None);
    }

    #[test]
    fn redact_hides_userinfo_only() {
        assert_eq!(redact("http://user:secret@10.0.0.1:10249/metrics"), "http://***@10.0.0.1:10249/metrics");
        assert_eq!(redact("https://token@host"), "https://***@host");
        assert_eq!(redact("http://a:b@c@host/x"), "http://***@host/x");
        // an '@' after the authority is not userinfo
        assert_eq!(redact("http://host:10249/metrics?who=a@b"), "http://host:10249/metrics?who=a@b");
        assert_eq!(redact("http://host/a@b"), "http://host/a@b");
        assert_eq!(redact("scrapes/n@1.txt"), "scrapes/n@1.txt");
    }
}
