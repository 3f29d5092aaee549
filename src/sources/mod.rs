//! Measurement sources: everything that reads kube-proxy's numbers from outside the process.
//!
//! - For the command line (this module): a saved scrape file, standard input, or one
//!   kube-proxy's metrics URL (`http(s)://host:10249/metrics`, with `/proxyMode` read from the
//!   same server).
//! - For the operator: every kube-proxy scraped ([`scrape`]), a Prometheus server
//!   ([`prometheus`]), and kube-proxy's configuration ([`proxyconfig`]).
//! - The one size-limited HTTP fetcher all of them use ([`fetch`]).

pub mod fetch;
pub mod prometheus;
pub mod proxyconfig;
pub mod scrape;
pub mod spawn;

use crate::exposition::parse_kube_proxy_metrics;
use crate::measure::{MeasurementStore, Sample};
use crate::model::ProxyMode;

pub use fetch::{DEFAULT_MAX_BODY_BYTES, MAX_PROXY_MODE_BYTES, connect_hint, http_client};
pub use spawn::{Measurement, spawn};

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
    /// A static kube-proxy target (`--kube-proxy-target`) is malformed.
    #[error("target {spec:?}: {message}")]
    Target {
        /// The target as given.
        spec: String,
        /// What is wrong with it.
        message: String,
    },
    /// A Kubernetes API call of a source failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being read (`listing pods "k8s-app=kube-proxy" in namespace kube-system`).
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// A `--metrics-file` argument is not `NODE=FILE`.
    #[error("--metrics-file {0:?}: expected NODE=FILE")]
    MetricsFileSpec(String),
    /// A saved scrape is not valid exposition text (the message names the file and line).
    #[error("{0}")]
    Scrape(String),
    /// kube-proxy's configuration could not be read or is not valid (`/configz`, ConfigMap).
    #[error("{0}")]
    Config(String),
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

/// The files source of the operator (`--source files`): reads each `--metrics-file NODE=FILE`
/// scrape once into a new store with a `window_seconds` window.
pub fn store_from_files(specs: &[String], window_seconds: f64) -> Result<MeasurementStore, SourceError> {
    let mut store = MeasurementStore::new(window_seconds);
    for spec in specs {
        let (node, path) = spec.split_once('=').ok_or_else(|| SourceError::MetricsFileSpec(spec.clone()))?;
        let bytes = std::fs::read(path).map_err(|source| SourceError::File { path: path.to_string(), source })?;
        let text = decode_utf8(path, bytes)?;
        let scrape = parse_kube_proxy_metrics(&text).map_err(|e| SourceError::Scrape(e.at(path)))?;
        store.record(node, Sample { at_unix_seconds: scrape::unix_now(), scrape, proxy_mode: None });
    }
    Ok(store)
}

/// Fetches `url`, reading at most `max_body_bytes` of its body (more is an error naming the URL
/// and the limit), and, from the same server, `/proxyMode` ([`fetch::proxy_mode`]: best effort,
/// a failing `/proxyMode` leaves the mode to inference).
pub async fn fetch_url(client: &reqwest::Client, url: &str, max_body_bytes: usize) -> Result<Fetched, SourceError> {
    let shown = redact(url);
    let mode_url = reqwest::Url::parse(url).ok().map(|mut u| {
        u.set_path("/proxyMode");
        u.set_query(None);
        u.to_string()
    });
    let (body, proxy_mode) = fetch::fetch_scrape(client, url, mode_url.as_deref(), max_body_bytes).await;
    let body = body.map_err(|e| SourceError::Http {
        message: match e {
            fetch::FetchError::TooLarge { .. } => format!("{e} (--max-body-bytes): stopped reading"),
            _ => e.to_string(),
        },
        url: shown.clone(),
    })?;
    let text = decode_utf8(&shown, body)?;
    Ok(Fetched { text, proxy_mode })
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
