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
