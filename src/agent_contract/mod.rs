//! The contract between the node agent ([`crate::agent`]) and the operator's agent client
//! ([`crate::sources::agent_client`]), below both so that neither imports the other:
//!
//! - [`observer`]: the observer's records (the removals to watch, what each node saw);
//! - [`protocol`]: the agent's port and the two response headers beyond HTTP's own (the failure
//!   reason, the proxy mode);
//! - [`tls`]: the mutual TLS of both sides, from the operator's CA (the certificates themselves
//!   are issued by [`crate::certs`]).

pub mod observer;
pub mod protocol;
pub mod tls;
