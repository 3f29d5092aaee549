//! The mutating admission webhook: AdmissionReview handling ([`review`]), the HTTPS server
//! ([`server`]) and its certificate files ([`tls`]). The plan it serves and the mutation it
//! applies are pure and live in the core ([`crate::core::plan`], [`crate::core::mutate`]).

pub mod review;
pub mod server;
pub mod tls;

pub use review::{ReviewOutcome, review};
pub use server::PlanHandle;
