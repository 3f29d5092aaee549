//! The Prometheus text exposition format as kube-proxy serves it: the reader ([`parse`]), the
//! classic histogram maths ([`histogram`]), native histograms ([`native`]) and the node agent's
//! filter ([`filter`]). Pure, no I/O.

pub mod filter;
pub mod histogram;
pub mod native;
pub mod parse;

pub use filter::filter_kube_proxy_metrics;
pub use histogram::{Bucket, Delta, Histogram, HistogramError, HistogramKind, Quantile};
pub use native::{NativeDelta, NativeHistogram, NativeHistogramError, NativeParts, Span, spans_of};
pub use parse::{HistogramFamily, KubeProxyScrape, ParseError, parse_kube_proxy_metrics, read_families, reads_sample};
