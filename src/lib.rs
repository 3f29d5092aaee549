//! safe-termination: measures how long kube-proxy takes to remove a terminating pod's endpoint
//! from every node's rules (the propagation window) and sizes each new pod's preStop sleep and
//! terminationGracePeriodSeconds from it.
//!
//! Layout: a pure core with no I/O ([`metrics`], [`model`], [`sizing`], [`advisor`],
//! [`analysis`], [`crd`]), adapters around it ([`sources`]), and the composition root in
//! `src/main.rs` with its command modules in [`cli`].

pub mod advisor;
pub mod analysis;
pub mod cli;
pub mod crd;
pub mod metrics;
pub mod model;
pub mod operator;
pub mod shutdown;
pub mod sizing;
pub mod sources;
pub mod telemetry;
pub mod webhook;
