//! Which exposition a kube-proxy body is in, and reading it in either: the text format
//! ([`super::parse`]) or the protobuf one ([`super::protobuf`], the only one with native
//! histograms). Pure, no I/O.
//!
//! * Over HTTP every reader asks for both in one `Accept` header, protobuf first
//!   ([`ACCEPT_PROTOBUF_FIRST`]), and reads the answer as its `Content-Type` says
//!   ([`Format::from_content_type`], [`parse_scrape`]).
//! * A saved file has no content type: [`Format::detect`] tells the two apart by their first
//!   bytes.

use super::filter::filter_kube_proxy_metrics;
use super::parse::{KubeProxyScrape, ParseError, parse_kube_proxy_metrics};
use super::protobuf::{ProtobufError, decode_kube_proxy_protobuf, filter_kube_proxy_protobuf, parse_kube_proxy_protobuf};

/// The two expositions kube-proxy serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// The Prometheus text format 0.0.4 (`text/plain`); also what is read for any content type
    /// other than the protobuf one.
    Text,
    /// Length-delimited `io.prometheus.client.MetricFamily` messages.
    Protobuf,
}

/// The protobuf exposition's media type.
pub const PROTOBUF_MEDIA_TYPE: &str = "application/vnd.google.protobuf";
/// The content type of a protobuf body (client_golang's `expfmt` spelling, as kube-proxy
/// answers, without its `escaping` parameter).
pub const PROTOBUF_CONTENT_TYPE: &str = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";
/// The content type of a text body (as kube-proxy answers).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The `Accept` header of every kube-proxy scrape: protobuf first, the text format 0.0.4 as the
/// fallback, anything else last. It is the header Prometheus sends for `scrape_protocols:
/// [PrometheusProto, PrometheusText0.0.4]`: `acceptHeader` in prometheus/prometheus
/// `scrape/scrape.go` joins the media types of `config.ScrapeProtocolsHeaders` (six entries) with
/// weights `q=0.7`, `q=0.6`, ... in order, then `*/*` with the next weight.
pub const ACCEPT_PROTOBUF_FIRST: &str =
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.6,*/*;q=0.5";
/// The same for a text-only scrape (`scrape_protocols: [PrometheusText0.0.4]`).
pub const ACCEPT_TEXT: &str = "text/plain;version=0.0.4;q=0.7,*/*;q=0.6";
/// The same for a protobuf-only scrape (`scrape_protocols: [PrometheusProto]`).
pub const ACCEPT_PROTOBUF: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,*/*;q=0.6";

/// The `Accept` header for a scrape in `only` that format, or in either (protobuf first) for
/// `None`.
pub fn accept_header(only: Option<Format>) -> &'static str {
    match only {
        None => ACCEPT_PROTOBUF_FIRST,
        Some(Format::Text) => ACCEPT_TEXT,
        Some(Format::Protobuf) => ACCEPT_PROTOBUF,
    }
}

/// A media type as `(type/subtype lowercased, [(parameter name lowercased, value unquoted)])`.
fn media_type(s: &str) -> (String, Vec<(String, String)>) {
    let mut parts = s.split(';');
    let ty = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let params = parts.filter_map(|p| p.split_once('=')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"').to_string())).collect();
    (ty, params)
}

/// For a protobuf media type: whether its parameters say delimited `MetricFamily` messages
/// (both parameters required, as client_golang's `expfmt` requires them).
fn delimited_metric_family(params: &[(String, String)]) -> bool {
    let get = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    get("proto") == Some("io.prometheus.client.MetricFamily") && get("encoding") == Some("delimited")
}

impl Format {
    /// The format of a body with this `Content-Type` (none: text, as before protobuf was read).
    /// `application/vnd.google.protobuf` with `proto=io.prometheus.client.MetricFamily` and
    /// `encoding=delimited` is protobuf; anything else is text.
    ///
    /// Errors: a protobuf content type with other parameters (client_golang's `encoding=text`
    /// or `compact-text`, another message): not an exposition this project reads.
    pub fn from_content_type(content_type: Option<&str>) -> Result<Self, ScrapeError> {
        let Some(ct) = content_type else { return Ok(Self::Text) };
        let (ty, params) = media_type(ct);
        if ty != PROTOBUF_MEDIA_TYPE {
            return Ok(Self::Text);
        }
        if delimited_metric_family(&params) {
            Ok(Self::Protobuf)
        } else {
            Err(ScrapeError::ContentType(format!(
                "Content-Type {ct:?} is a protobuf exposition other than delimited io.prometheus.client.MetricFamily messages, the only one read"
            )))
        }
    }

    /// The format of a saved body, from its first bytes. Protobuf when it starts with a
    /// length-delimited `MetricFamily` whose first field is its name: a varint length, the key
    /// of field 1 as a length-delimited field (`0x0a`), a name length that fits the declared
    /// message, and that many bytes of a metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`); the rest of
    /// the message may be missing (a cut file is protobuf, and its reader says it was cut). A
    /// text body cannot start so: it would need a one-character first line (which is not a
    /// valid exposition line) followed by a control byte. Everything else, the empty body
    /// included, is text (and a binary that is neither gets the text reader's error).
    pub fn detect(body: &[u8]) -> Self {
        let varint = |b: &[u8]| -> Option<(usize, usize)> {
            let mut v: u64 = 0;
            for (i, &x) in b.iter().enumerate().take(5) {
                v |= u64::from(x & 0x7f) << (7 * i);
                if x < 0x80 {
                    return Some((usize::try_from(v).ok()?, i + 1));
                }
            }
            None
        };
        let looks_protobuf = || -> Option<()> {
            let (len, n) = varint(body)?;
            // the message may be cut short (a cut file is still protobuf, and its reader says
            // it was cut); its name must fit in what it declares and in what is there
            let rest = body.get(n..)?.strip_prefix(&[0x0a])?;
            let (name_len, m) = varint(rest)?;
            let name_end = m.checked_add(name_len)?;
            if name_end.checked_add(1)? > len {
                return None;
            }
            let name = rest.get(m..name_end)?;
            let (first, tail) = name.split_first()?;
            let ok =
                (first.is_ascii_alphabetic() || matches!(first, b'_' | b':')) && tail.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b':'));
            ok.then_some(())
        };
        if looks_protobuf().is_some() { Self::Protobuf } else { Self::Text }
    }

    /// `text` or `protobuf`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Protobuf => "protobuf",
        }
    }

    /// The content type a body of this format is served with.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Text => TEXT_CONTENT_TYPE,
            Self::Protobuf => PROTOBUF_CONTENT_TYPE,
        }
    }
}

/// True when an `Accept` header (`None`: absent) admits the protobuf exposition: one of its
/// media ranges is delimited `MetricFamily` protobuf with a weight above 0. `*/*` alone does
/// not count: a client that names no protobuf gets text, as from kube-proxy before this reader.
pub fn accepts_protobuf(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|range| {
            let (ty, params) = media_type(range);
            let q = params.iter().find(|(k, _)| k == "q").map_or(1.0, |(_, v)| v.parse::<f64>().unwrap_or(0.0));
            ty == PROTOBUF_MEDIA_TYPE && delimited_metric_family(&params) && q > 0.0
        })
    })
}

/// Why a kube-proxy body cannot be read, in either format.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScrapeError {
    /// The text reader's error (line, family, message).
    #[error("{0}")]
    Text(ParseError),
    /// The protobuf reader's error (message, byte offset, family, message).
    #[error("{0}")]
    Protobuf(ProtobufError),
    /// A text body that is not UTF-8.
    #[error("not UTF-8 text: {0}")]
    NotUtf8(std::str::Utf8Error),
    /// A content type this project does not read.
    #[error("{0}")]
    ContentType(String),
}

impl ScrapeError {
    /// The error as the command line prints it for `source` (a file or URL):
    /// `SOURCE:LINE: family: message` for text ([`ParseError::at`]),
    /// `SOURCE: protobuf message N at byte B: family: message` for protobuf.
    pub fn at(&self, source: &str) -> String {
        match self {
            Self::Text(e) => e.at(source),
            Self::Protobuf(e) => e.at(source),
            other => format!("{source}: {other}"),
        }
    }
}

/// Reads a kube-proxy body in the format its `content_type` names ([`Format::from_content_type`]).
pub fn parse_scrape(body: &[u8], content_type: Option<&str>) -> Result<KubeProxyScrape, ScrapeError> {
    parse_scrape_as(body, Format::from_content_type(content_type)?)
}

/// Reads a kube-proxy body in `format`: text must be UTF-8 ([`ScrapeError::NotUtf8`]) and is
/// read by [`parse_kube_proxy_metrics`], protobuf by [`parse_kube_proxy_protobuf`].
pub fn parse_scrape_as(body: &[u8], format: Format) -> Result<KubeProxyScrape, ScrapeError> {
    match format {
        Format::Text => parse_kube_proxy_metrics(std::str::from_utf8(body).map_err(ScrapeError::NotUtf8)?).map_err(ScrapeError::Text),
        Format::Protobuf => parse_kube_proxy_protobuf(body).map_err(ScrapeError::Protobuf),
    }
}

/// Checks a kube-proxy body in `format` as [`parse_scrape_as`] reads it, without summing the
/// native series (what the node agent needs before it filters: the same errors, less work).
pub fn check_scrape(body: &[u8], format: Format) -> Result<(), ScrapeError> {
    match format {
        Format::Text => parse_kube_proxy_metrics(std::str::from_utf8(body).map_err(ScrapeError::NotUtf8)?).map(drop).map_err(ScrapeError::Text),
        Format::Protobuf => decode_kube_proxy_protobuf(body).map(drop).map_err(ScrapeError::Protobuf),
    }
}

/// The node agent's filter in either format: only the families the parser reads
/// ([`filter_kube_proxy_metrics`], [`filter_kube_proxy_protobuf`]). For a body that parsed (a
/// text body that is not UTF-8 gives an empty one).
pub fn filter_scrape(body: &[u8], format: Format) -> Vec<u8> {
    match format {
        Format::Text => std::str::from_utf8(body).map(|t| filter_kube_proxy_metrics(t).into_bytes()).unwrap_or_default(),
        Format::Protobuf => filter_kube_proxy_protobuf(body),
    }
}
