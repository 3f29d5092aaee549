//! safe-termination: measures how long kube-proxy takes to remove a terminating pod's endpoint
//! from every node's rules (the propagation window) and sizes each new pod's preStop sleep and
//! terminationGracePeriodSeconds from it.
//!
//! Layout (docs/architecture.md): a pure core with no I/O ([`exposition`], [`model`],
//! [`measure`], [`proxyconfig`], [`sizing`], [`advisor`], [`analysis`], [`crd`],
//! [`selector`], [`annotations`]); adapters around it: the
//! measurement [`sources`], the TerminationPolicy [`controller`], the admission [`webhook`] and
//! the node [`agent`];
//! the composition root in `src/main.rs` with its command modules in [`cli`].

pub mod admission;
pub mod advisor;
pub mod agent;
pub mod analysis;
pub mod annotations;
pub mod certs;
pub mod cli;
pub mod controller;
pub mod crd;
pub mod exposition;
pub mod measure;
pub mod model;
pub mod operator;
pub mod proxyconfig;
pub mod selector;
pub mod shutdown;
pub mod sizing;
pub mod sources;
pub mod telemetry;
pub mod webhook;
pub mod window_distribution;
