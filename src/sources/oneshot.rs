//! One-shot inputs, read once: a saved scrape file, standard input, or one kube-proxy's metrics
//! URL (`http(s)://host:10249/metrics`, with `/proxyMode` read from the same server) for the
//! command line, and the operator's `--source files`. A scrape is the text or the protobuf
//! exposition: a URL's answer says which in its `Content-Type`, a file's first bytes do
//! ([`Format::detect`]).

use super::error::SourceError;
use super::fetch;
use crate::core::exposition::{Format, KubeProxyScrape, ScrapeError, parse_scrape_as};
use crate::core::measure::{MeasurementStore, Sample};
use crate::core::model::ProxyMode;
use std::time::{SystemTime, UNIX_EPOCH};

/// The body of a scrape URL, its content type, and the mode `/proxyMode` reported.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The body, text or protobuf exposition as [`Self::content_type`] says.
    pub body: Vec<u8>,
    /// The answer's `Content-Type` (`None`: absent).
    pub content_type: Option<String>,
    /// Mode from `/proxyMode`, when it answered.
    pub proxy_mode: Option<ProxyMode>,
}

/// Reads a scrape `bytes` from `origin` (a path, `<stdin>` or a URL, for messages) in `format`.
///
/// Errors: [`SourceError::NotUtf8`] for a text body that is not UTF-8 (as [`decode_utf8`]
/// names it), [`SourceError::Scrape`] with the reader's error as the command line prints it
/// ([`ScrapeError::at`]: `ORIGIN:LINE: family: message` for text,
/// `ORIGIN: protobuf message N at byte B: family: message` for protobuf), and for an empty body
/// (no bytes, or blank lines only): a failed capture (`curl -o` of a refused port writes
/// nothing), never a scrape, since every kube-proxy serves its Go runtime metrics at least.
pub fn read_scrape_as(origin: &str, bytes: Vec<u8>, format: Format) -> Result<KubeProxyScrape, SourceError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(SourceError::Scrape(format!("{origin}: empty ({} bytes): no metrics to read; was the capture cut off?", bytes.len())));
    }
    match parse_scrape_as(&bytes, format) {
        Ok(scrape) => Ok(scrape),
        Err(ScrapeError::NotUtf8(e)) => Err(decode_utf8(origin, bytes).err().unwrap_or_else(|| SourceError::Scrape(format!("{origin}: not UTF-8 text: {e}")))),
        Err(e) => Err(SourceError::Scrape(e.at(origin))),
    }
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
/// file (`<stdin>`), the line and the byte offset; more than [`MAX_FILE_BYTES`] is
/// [`SourceError::FileTooLarge`].
pub fn read_file(path: &str) -> Result<String, SourceError> {
    let origin = if path == "-" { "<stdin>" } else { path };
    decode_utf8(origin, read_file_bytes(path)?)
}

/// Reads a file or `-` (standard input) as bytes (a saved scrape may be protobuf); more than
/// [`MAX_FILE_BYTES`] is [`SourceError::FileTooLarge`].
pub fn read_file_bytes(path: &str) -> Result<Vec<u8>, SourceError> {
    use std::io::Read;
    let origin = if path == "-" { "<stdin>" } else { path };
    let file_error = |source| SourceError::File { path: path.to_string(), source };
    let too_large = || SourceError::FileTooLarge { path: origin.to_string(), limit: MAX_FILE_BYTES };
    let reader: Box<dyn Read> = if path == "-" {
        Box::new(std::io::stdin())
    } else {
        let file = std::fs::File::open(path).map_err(file_error)?;
        // a regular file's size is known: a larger one is refused without reading it
        if file.metadata().is_ok_and(|m| m.is_file() && m.len() > MAX_FILE_BYTES) {
            return Err(too_large());
        }
        Box::new(file)
    };
    // one byte past the limit tells a file of exactly the limit from a larger one (/dev/zero,
    // a pipe): nothing unbounded is read into memory
    let bytes = read_bounded(reader, MAX_FILE_BYTES).map_err(file_error)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

/// At most `limit + 1` bytes of `reader`, in a buffer that never grows past that: it doubles
/// as `read_to_end`'s does, but is capped at the bound, so its last growth is to `limit + 1`
/// bytes, not to the next power of two above it. (The smaller buffers it grew through may stay
/// with the allocator: refusing `/dev/zero` peaks at about 158 MB for the 64 MiB limit.)
fn read_bounded(mut reader: impl std::io::Read, limit: u64) -> std::io::Result<Vec<u8>> {
    let cap = usize::try_from(limit.saturating_add(1)).unwrap_or(usize::MAX);
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    while bytes.len() < cap {
        let want = chunk.len().min(cap - bytes.len());
        let n = match reader.read(&mut chunk[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if bytes.len() + n > bytes.capacity() {
            let grown = (bytes.capacity() * 2).max(bytes.len() + n).min(cap);
            bytes.reserve_exact(grown - bytes.len());
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    Ok(bytes)
}

/// The most [`read_file`] reads from a file or standard input, bytes (64 MiB: manifests and
/// scrapes are far smaller; a kube-proxy scrape is about 80 KB).
pub const MAX_FILE_BYTES: u64 = 64 << 20;

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

/// Now as Unix seconds.
pub fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The files source of the operator (`--source files`): reads each `--metrics-file NODE=FILE`
/// scrape once (text or protobuf, as [`Format::detect`] tells) into a new store with a
/// `window_seconds` window.
pub fn store_from_files(specs: &[String], window_seconds: f64) -> Result<MeasurementStore, SourceError> {
    let mut store = MeasurementStore::new(window_seconds);
    for spec in specs {
        let (node, path) = spec.split_once('=').ok_or_else(|| SourceError::MetricsFileSpec(spec.clone()))?;
        let bytes = read_file_bytes(path)?;
        let format = Format::detect(&bytes);
        let scrape = read_scrape_as(path, bytes, format)?;
        store.record_via(node, Sample { at_unix_seconds: unix_now(), scrape, proxy_mode: None }, crate::core::measure::NodeSource::File);
    }
    Ok(store)
}

/// Fetches `url` with `Accept: accept` ([`crate::core::exposition::accept_header`]), reading at most
/// `max_body_bytes` of its body (more is an error naming the URL and the limit), and, from the
/// same server, `/proxyMode` ([`fetch::proxy_mode`]: best effort, a failing `/proxyMode` leaves
/// the mode to inference).
pub async fn fetch_url(client: &reqwest::Client, url: &str, max_body_bytes: usize, accept: &str) -> Result<Fetched, SourceError> {
    let shown = redact(url);
    let mode_url = reqwest::Url::parse(url).ok().map(|mut u| {
        u.set_path("/proxyMode");
        u.set_query(None);
        u.to_string()
    });
    let (body, proxy_mode) = fetch::fetch_scrape(client, url, mode_url.as_deref(), max_body_bytes, accept).await;
    let body = body.map_err(|e| SourceError::Http {
        message: match e {
            fetch::FetchError::TooLarge { .. } => format!("{e} (--max-body-bytes): stopped reading"),
            _ => e.to_string(),
        },
        url: shown.clone(),
    })?;
    Ok(Fetched { body: body.bytes, content_type: body.content_type, proxy_mode })
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_bounded_read_stops_one_byte_past_the_limit_and_never_grows_past_it() {
        let limit = 300_000u64;
        let endless = std::io::repeat(b'x');
        let bytes = super::read_bounded(endless, limit).unwrap();
        assert_eq!(bytes.len() as u64, limit + 1);
        assert_eq!(bytes.capacity() as u64, limit + 1, "read_to_end would have doubled to 524,288");
        let short = super::read_bounded(&b"abc"[..], limit).unwrap();
        assert_eq!(short, b"abc");
        let exact = super::read_bounded(std::io::Read::take(std::io::repeat(b'y'), limit), limit).unwrap();
        assert_eq!(exact.len() as u64, limit, "exactly the limit is read whole and allowed");
    }

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
