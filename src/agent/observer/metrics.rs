//! The observer's own metrics, served by the agent's health listener at `GET /metrics` (plain
//! HTTP, beside `/healthz`: they hold counts and windows, no kube-proxy data), so that a
//! Prometheus of the user's scrapes every node's removals:
//!
//! | family | type | what |
//! |---|---|---|
//! | `safe_termination_agent_deletion_to_removed_seconds` | histogram, native (schema 3) and classic | per removal this node read, seconds from the pod's deletion as the operator saw it to the end of the first successful read of the Service port's rules without the endpoint (the removal's late bound) |
//! | `safe_termination_agent_removals_censored_total` | counter | watches that reached their deadline not seen removed: every successful read still held the endpoint, or none succeeded, or the Service port's chain never appeared |
//! | `safe_termination_agent_data_plane_reads_total{result}` | counter | reads of a Service port's rules, `ok` or `failed` (a failed read is no sample) |
//!
//! The histogram counts only watches whose request carried the deletion's age (operator
//! protocol 2). Every series has the `node` label when the agent knows its node's name.

use crate::core::exposition::write::{ObservedHistogram, counter_protobuf, counter_text, histogram_protobuf, histogram_text};

/// The native schema: bucket bounds grow by a factor of 2^(1/8) (about 9%), client_golang's
/// schema for a bucket factor of 1.1.
pub const SCHEMA: i32 = 3;
/// Windows up to 1 ms fall into the zero bucket: no read is that precise. Bounds the native
/// buckets to about 180 for windows up to an hour.
pub const ZERO_THRESHOLD_SECONDS: f64 = 1e-3;
/// The classic buckets, seconds, for scrapers without native histograms.
pub const CLASSIC_BOUNDS_SECONDS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0];

/// The histogram's family name.
pub const DELETION_TO_REMOVED: &str = "safe_termination_agent_deletion_to_removed_seconds";
/// The censored counter's family name.
pub const CENSORED: &str = "safe_termination_agent_removals_censored_total";
/// The reads counter's family name.
pub const READS: &str = "safe_termination_agent_data_plane_reads_total";

const DELETION_TO_REMOVED_HELP: &str =
    "Seconds from a pod's deletion (as the operator saw it) to the end of this node's first successful read of its Service port's rules without the endpoint.";
const CENSORED_HELP: &str =
    "Removals this node's reads did not see within their deadline (the endpoint still held, no read succeeded, or the chain never appeared).";
const READS_HELP: &str = "Reads of a Service port's rules by the observer, by result (a failed read is no sample).";

/// The observer's counts.
#[derive(Debug, Clone)]
pub struct ObserverMetrics {
    deletion_to_removed: ObservedHistogram,
    censored: u64,
    reads_ok: u64,
    reads_failed: u64,
}

impl Default for ObserverMetrics {
    fn default() -> Self {
        Self { deletion_to_removed: ObservedHistogram::new(SCHEMA, ZERO_THRESHOLD_SECONDS, CLASSIC_BOUNDS_SECONDS), censored: 0, reads_ok: 0, reads_failed: 0 }
    }
}

impl ObserverMetrics {
    /// A removal read `seconds` after its deletion (below 0, from the age's latency, counts 0).
    pub fn removed(&mut self, seconds: f64) {
        self.deletion_to_removed.observe(seconds.max(0.0));
    }

    /// `n` watches censored.
    pub fn censored(&mut self, n: usize) {
        self.censored += n as u64;
    }

    /// One read, successful or not.
    pub fn read(&mut self, ok: bool) {
        if ok {
            self.reads_ok += 1;
        } else {
            self.reads_failed += 1;
        }
    }

    /// Removals counted in the histogram.
    pub fn removals(&self) -> u64 {
        self.deletion_to_removed.count()
    }

    /// Censored watches counted.
    pub fn censored_total(&self) -> u64 {
        self.censored
    }

    /// The families, in the protobuf exposition when `protobuf`, else text 0.0.4; `node` labels
    /// every series when known.
    pub fn exposition(&self, protobuf: bool, node: Option<&str>) -> Vec<u8> {
        let node: Vec<(&str, &str)> = node.map(|n| ("node", n)).into_iter().collect();
        let ok: Vec<(&str, &str)> = node.iter().copied().chain([("result", "ok")]).collect();
        let failed: Vec<(&str, &str)> = node.iter().copied().chain([("result", "failed")]).collect();
        let reads: [(&[(&str, &str)], f64); 2] = [(&ok, self.reads_ok as f64), (&failed, self.reads_failed as f64)];
        let censored: [(&[(&str, &str)], f64); 1] = [(&node, self.censored as f64)];
        if protobuf {
            let mut out = histogram_protobuf(DELETION_TO_REMOVED, DELETION_TO_REMOVED_HELP, &node, &self.deletion_to_removed);
            out.extend(counter_protobuf(CENSORED, CENSORED_HELP, &censored));
            out.extend(counter_protobuf(READS, READS_HELP, &reads));
            out
        } else {
            let mut out = histogram_text(DELETION_TO_REMOVED, DELETION_TO_REMOVED_HELP, &node, &self.deletion_to_removed);
            out += &counter_text(CENSORED, CENSORED_HELP, &censored);
            out += &counter_text(READS, READS_HELP, &reads);
            out.into_bytes()
        }
    }
}
