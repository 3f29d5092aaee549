//! The wire protocol between the node agent and the operator, the one place both sides read it
//! from: the agent's port and the two response headers beyond HTTP's own. The agent serves it
//! ([`crate::agent::server`]); the operator's client reads it ([`crate::sources::agent_client`]).
//!
//! The paths are kube-proxy's own (`/metrics`, `/proxyMode`, `/configz`); a failure's reason in
//! [`REASON_HEADER`] is one of [`crate::core::measure::reason`]'s labels.

/// Default mutual-TLS port of the agent (on the node's addresses: the agent runs with
/// `hostNetwork`; kube-proxy has 10249 and 10256, the kubelet 10248 and 10250).
pub const DEFAULT_PORT: u16 = 10349;

/// Response header carrying the failure reason label of a 502/504 answer.
pub const REASON_HEADER: &str = "x-safe-termination-reason";
/// Response header of `/metrics` carrying kube-proxy's `/proxyMode` (read on the node at the same
/// time; absent when it could not be read): the operator then needs one mutual-TLS request per
/// node and cycle instead of two (docs/benchmarks/scrape.md "Through the node agent").
pub const PROXY_MODE_HEADER: &str = "x-safe-termination-proxy-mode";
