//! Webhook certificates generated and rotated by the operator itself (the Helm chart's
//! `certificates.mode: operator`).
//!
//! The lease holder keeps one Secret (`--cert-secret`, in the operator's namespace) holding:
//!
//! | key | content |
//! |---|---|
//! | `ca.crt` | the CA bundle the API server trusts: the current CA first, then the previous CA while it is still valid (so a replica still serving a leaf of the old CA stays trusted during a CA rotation) |
//! | `ca.key` | the current CA's private key (never mounted into the pod: the chart mounts only `tls.crt`/`tls.key`) |
//! | `tls.crt`, `tls.key` | the serving certificate for `<service>.<namespace>.svc` (and `<service>`, `<service>.<namespace>`, `<service>.<namespace>.svc.cluster.local`, plus `--cert-extra-san`) and its key |
//! | `agent.crt`, `agent.key` | the node agents' serving certificate, for the one name [`AGENT_SERVER_NAME`] (server authentication only), and its key |
//! | `client.crt`, `client.key` | the operator's client certificate for the agents, for the one name [`OPERATOR_CLIENT_NAME`] (client authentication only), and its key |
//!
//! With `--agent-cert-secret` the leader also keeps a second Secret for the node agents
//! ([`agent_secret_data`]: `ca.crt`, and the agent pair as `tls.crt`/`tls.key`), so that the
//! agents, which run on every node, never mount a Secret holding the CA key or the operator's
//! client key.
//!
//! Why mutual TLS from this CA for the agents (and not the operator's ServiceAccount token
//! checked by a TokenReview): the operator keeps this CA anyway, so the agents need no API call
//! per request, keep answering while the API server is down, need no RBAC for `tokenreviews`,
//! and an unauthenticated client is refused during the handshake, before any HTTP is read.
//! The agent leaf names one fixed name rather than node IPs, so one certificate serves every
//! node and the operator checks that name whatever address it dials
//! ([`crate::agent_contract::tls`]).
//!
//! Each certificate is renewed at two thirds of its lifetime (a serving certificate of 1 year
//! is replaced after 8 months; the 10-year CA after ~6.7 years), or at once when it is missing,
//! unreadable, not signed by the CA, not matching its key, or not naming the current Service.
//! The leader also keeps `webhooks[*].clientConfig.caBundle` of the MutatingWebhookConfiguration
//! (`--webhook-configuration`) equal to `ca.crt`, with a JSON patch that tests each webhook's
//! name before setting its caBundle, and repairs it when something else (a reinstall) reset it.
//! On a CA rotation the caBundle (old and new CA) is patched before the Secret changes.
//!
//! A rotation on demand (to exercise it, or because a policy wants one now): set the annotation
//! `safetermination.io/rotate-ca` on the Secret to any new value (`kubectl annotate secret
//! NAME safetermination.io/rotate-ca="$(date +%s)" --overwrite`). The leader rotates the CA at
//! its next check, exactly as at two thirds of the lifetime, and records the value it acted on
//! in `safetermination.io/rotated-ca`, so each value rotates once. As in a scheduled rotation,
//! the previous CA stays in `ca.crt` and the caBundle until it expires.
//!
//! Every replica serves what the kubelet mounts from the Secret (the webhook's
//! [`crate::webhook::tls::CertReloader`] polls the files' content, so a renewal needs no
//! restart). Out of cluster there is no kubelet: with `--write-cert-files` every replica also
//! copies `tls.crt`/`tls.key` from the Secret to `--tls-cert-file`/`--tls-key-file`
//! (atomically, by rename).
//!
//! Two rooms: `issue.rs` is the pure part (observe a Secret's contents, [`decide`] what to renew,
//! generate and renew certificates, the caBundle patch), with no I/O; `leader.rs` is the leader's
//! task that reads and writes the Secrets, patches the caBundle and writes the files
//! ([`reconcile_once`], [`run`]). The webhook's server and the node agents' TLS read the
//! certificates through the constants and [`cert_info`] here.

mod issue;
mod leader;

pub use issue::*;
pub use leader::*;

use std::time::Duration;

/// Secret key of the CA bundle (current CA first).
pub const CA_CERT: &str = "ca.crt";
/// Secret key of the current CA's private key.
pub const CA_KEY: &str = "ca.key";
/// Secret key of the serving certificate.
pub const TLS_CERT: &str = "tls.crt";
/// Secret key of the serving certificate's private key.
pub const TLS_KEY: &str = "tls.key";
/// Secret key of the node agents' serving certificate.
pub const AGENT_CERT: &str = "agent.crt";
/// Secret key of the node agents' private key.
pub const AGENT_KEY: &str = "agent.key";
/// Secret key of the operator's client certificate for the agents.
pub const CLIENT_CERT: &str = "client.crt";
/// Secret key of the operator's client private key.
pub const CLIENT_KEY: &str = "client.key";
/// The one DNS name of the agents' serving certificate; the operator checks it whatever node
/// address it dials.
pub const AGENT_SERVER_NAME: &str = "safe-termination-agent";
/// The one DNS name of the operator's client certificate; the agents accept no other client.
pub const OPERATOR_CLIENT_NAME: &str = "safe-termination-operator";
/// Lifetime of a generated CA: 10 years.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Lifetime of a generated serving certificate: 1 year.
pub const SERVING_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Field manager of the Secret and caBundle writes.
pub const FIELD_MANAGER: &str = "safe-termination-certs";
/// `notBefore` is set this far in the past, for clocks slightly behind ours.
const BACKDATE_SECONDS: i64 = 300;
/// Secret annotation requesting a CA rotation (any value not yet in [`ANNOTATION_ROTATED_CA`]).
pub const ANNOTATION_ROTATE_CA: &str = "safetermination.io/rotate-ca";
/// Secret annotation: the [`ANNOTATION_ROTATE_CA`] value the last requested rotation acted on.
pub const ANNOTATION_ROTATED_CA: &str = "safetermination.io/rotated-ca";

/// Unix seconds now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}
