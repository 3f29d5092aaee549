//! The node agent (`safe-termination agent`, adapter): a small per-node process of the same
//! binary, run as a DaemonSet with `hostNetwork` so that it reaches kube-proxy's metrics server
//! on the node's loopback (kube-proxy's default `metricsBindAddress` is `127.0.0.1:10249`, which
//! the operator cannot scrape from its pod).
//!
//! - [`upstream`]: reads kube-proxy's `/metrics`, `/proxyMode` and `/configz` on each request
//!   (one fetch in flight per path, shared), checks them with the operator's readers, and reduces
//!   them to what the operator reads ([`crate::core::exposition::filter`],
//!   [`crate::core::proxyconfig::reduce_configz`]);
//! - [`server`]: serves exactly those three paths over mutual TLS, and `/healthz` (no data) on a
//!   separate plain-HTTP port for the kubelet's probes;
//! - what both sides read (the port, the response headers, the mutual TLS) is in
//!   [`crate::agent_contract`], below this module and the operator's client.
//!
//! The operator's side (finding the agents, scraping through them, choosing the source per
//! node) is in [`crate::sources::agent_client`], [`crate::sources::scrape_loop`] and
//! [`crate::sources::auto`]; the command and its flags in [`crate::cli::agent`].

pub mod observer;
pub mod server;
pub mod upstream;
