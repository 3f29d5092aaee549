//! The webhook-free admission backend: a MutatingAdmissionPolicy (in-tree CEL mutation,
//! `admissionregistration.k8s.io/v1`, GA in Kubernetes 1.36) that injects the same preStop sleep
//! and terminationGracePeriodSeconds as the webhook ([`crate::core::mutate`]), from
//! parameters the leader keeps at the measured values. Pure: the choice of backend
//! ([`backend`]), the parameters built from the plan ([`params`]) and the policy objects with
//! their CEL ([`policy`]); the controller's `admission` task writes them.

pub mod backend;
pub mod params;
pub mod policy;

pub use backend::{ActiveBackend, BackendSetting};
