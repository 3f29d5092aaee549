//! The mutating admission webhook: the plan it serves ([`plan`]), the pure mutation engine
//! ([`mutate`]), AdmissionReview handling ([`review`]), the HTTPS server ([`server`]) and its
//! certificate handling ([`tls`]).

pub mod mutate;
pub mod plan;
pub mod review;
pub mod server;
pub mod tls;

pub use mutate::{ContainerReason, Decision, PodReason, mutate_pod, short_warning};
pub use plan::{Capabilities, Plan, PlanPolicy};
pub use review::{ReviewOutcome, review};
pub use server::PlanHandle;
