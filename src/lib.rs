//! safe-termination: measures how long kube-proxy takes to remove a terminating pod's endpoint
//! from every node's rules (the propagation window) and sizes each new pod's preStop sleep and
//! terminationGracePeriodSeconds from it.
//!
//! Layout (docs/architecture.md): the pure [`core`] (no I/O: the exposition parsers, the
//! propagation model, sizing, advice, the mutation and the admission policy); adapters around
//! it: the measurement [`sources`], the TerminationPolicy [`controller`], the admission
//! [`webhook`], the node [`agent`] and its contract with the operator ([`agent_contract`]), the [`certs`] task and the operator's [`runtime`]; the
//! composition root in `src/main.rs` with its command modules in [`cli`].

pub mod agent;
pub mod agent_contract;
pub mod certs;
pub mod cli;
pub mod controller;
pub mod core;
pub mod runtime;
pub mod shutdown;
pub mod sources;
pub mod telemetry;
pub mod webhook;
