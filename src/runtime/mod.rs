//! The operator's runtime: what its long-running tasks share ([`shared`]), the leader election
//! that decides which replica measures and writes status ([`lease`]), and the task set they
//! run in ([`tasks`]). `cli::run` builds one [`Shared`] and hands it to `sources::spawn`,
//! `controller::spawn` and `certs::spawn`; each adds its tasks to the one [`Tasks`] set.
//!
//! This file only declares and re-exports.

pub mod lease;
pub mod shared;
pub mod tasks;

pub use lease::elect;
pub use shared::{Leadership, Shared};
pub use tasks::Tasks;
