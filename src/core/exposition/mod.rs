//! kube-proxy's Prometheus expositions: the text format's reader ([`parse`]), the protobuf
//! format's ([`protobuf`], the one with native histograms), which of the two a body is in and
//! reading either ([`format`]), the classic histogram maths ([`histogram`]), native histograms
//! ([`native`]), the node agent's filter ([`filter`] for text; [`protobuf`] has its own), and
//! the writer of the project's own families ([`write`]).
//! Pure, no I/O.

mod fast_path;
pub mod filter;
pub mod format;
pub mod histogram;
pub mod native;
pub mod parse;
pub mod protobuf;
pub mod scrape;
pub mod write;

pub use filter::filter_kube_proxy_metrics;
pub use format::{ACCEPT_PROTOBUF_FIRST, Format, ScrapeError, accept_header, accepts_protobuf, filter_scrape, parse_scrape, parse_scrape_as};
pub use histogram::{Bucket, Delta, Histogram, HistogramError, HistogramKind, Quantile};
pub use native::{NativeDelta, NativeHistogram, NativeHistogramError, NativeParts, Span, spans_of};
pub use parse::{HistogramFamily, KubeProxyScrape, ParseError, parse_kube_proxy_metrics, read_families, reads_sample};
pub use protobuf::{ProtobufError, filter_kube_proxy_protobuf, parse_kube_proxy_protobuf};
