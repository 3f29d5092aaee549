//! The Prometheus text exposition format as kube-proxy serves it: the reader ([`parse`]) and
//! the histogram maths ([`histogram`]). Pure, no I/O.

pub mod histogram;
pub mod parse;

pub use histogram::{Bucket, Delta, Histogram, HistogramError, Quantile};
pub use parse::{HistogramFamily, KubeProxyScrape, ParseError, parse_kube_proxy_metrics};
