//! Measurement sources: everything that reads kube-proxy's numbers from outside the process.
//!
//! - Read once ([`oneshot`]): a saved scrape file, standard input, or one kube-proxy's metrics
//!   URL for the command line, and `--source files` for the operator.
//! - For the operator: every kube-proxy scraped directly ([`scrape`], which also reads
//!   kube-proxy's configuration from `/configz` or its ConfigMap for [`crate::core::proxyconfig`]),
//!   the node agents ([`agent_client`]) and a Prometheus server ([`prometheus`]); `--source auto`
//!   chooses among them per node ([`auto`], pure); the loop that runs a cycle of them and
//!   records it ([`scrape_loop`]: the direct scrape, then the fallbacks) is the one file that
//!   uses all of them.
//! - The one size-limited HTTP fetcher all of them use ([`fetch`]), the measurement task of
//!   the operator ([`spawn`]) and the layer's error ([`SourceError`]).
//!
//! This file only declares and re-exports: the submodules import each other, never this file.

pub mod agent_client;
pub mod auto;
pub mod error;
pub mod fetch;
pub mod oneshot;
pub mod prometheus;
pub mod proxy_config;
pub mod scrape;
pub mod scrape_loop;
pub mod spawn;
pub mod targets;

pub use error::SourceError;
pub use fetch::{DEFAULT_MAX_BODY_BYTES, MAX_PROXY_MODE_BYTES, connect_hint, http_client};
pub use oneshot::{Fetched, decode_utf8, fetch_url, is_url, read_file, read_file_bytes, read_scrape_as, redact, store_from_files, unix_now, url_scheme};
pub use spawn::{Measurement, spawn};
