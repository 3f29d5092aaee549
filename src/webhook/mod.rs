//! The mutating admission webhook: AdmissionReview handling ([`review`]), the HTTPS server
//! ([`server`]) and its certificate files ([`tls`]), and on the same server the preStop waiter's
//! endpoint ([`wait`]). The plan it serves and the mutation it
//! applies are pure and live in the core ([`crate::core::plan`], [`crate::core::mutate`]).

pub mod review;
pub mod server;
pub mod tls;
pub mod wait;

pub use review::{ReviewOutcome, review};
pub use server::PlanHandle;

/// Now as unix seconds (the clock of the Service index's watches, which the waiter's answers
/// are compared with).
pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
