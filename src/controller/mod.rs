//! The TerminationPolicy controller (`safe-termination run`): reconciliation ([`reconcile`]),
//! the desired status and its condition transitions ([`status`]), the webhook's plan built from
//! the policies' status ([`planner`]) and published to the server ([`tasks`]), the capability
//! probe ([`probe`]), the Service index ([`cluster`]) and the controller's own instruments
//! ([`metrics`]).

pub mod cluster;
pub mod metrics;
pub mod planner;
pub mod probe;
pub mod reconcile;
pub mod status;
pub mod tasks;

/// Why the controller could not do its work: a reconcile is retried with backoff; a bad
/// `--default-policy` stops the operator at start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The measurement store's lock was poisoned (a bug).
    #[error("measurement store unavailable")]
    Store,
    /// `--default-policy` is not `NAMESPACE/NAME`.
    #[error("default policy {0:?} must be NAMESPACE/NAME")]
    DefaultPolicyRef(String),
}
