//! The operator (`safe-termination run`): measurement over a rolling window ([`measure`]),
//! policy status and condition transitions ([`status`]), and the adapters that talk to the
//! cluster.

pub mod measure;
pub mod status;
pub mod cluster;
pub mod planner;
pub mod probe;
pub mod controller;
pub mod metrics;
pub mod proxyconfig;
pub mod scrape;
pub mod prometheus;
pub mod tasks;
pub mod certs;
