//! The observer's wire records between the operator and the node agent: the operator asks every
//! agent to watch the removals pending now, and each agent answers what its node's data plane
//! showed of each. JSON, camelCase.
//!
//! `POST /removals` with an [`ObserveRequest`] replaces the agent's set of watches (a watch not
//! in the request is forgotten, a new one starts reading); the answer is an
//! [`ObserveResponse`] with one [`WatchRecord`] per watch kept. The operator asks again while
//! removals are pending, so an agent that restarted is given its watches back at the next
//! request (its earlier reads are lost: its first read after the restart bounds the removal,
//! late, never early).
//!
//! Times in a record are the agent's clock (unix seconds); the answer carries the agent's clock
//! at the moment it was built, so the operator takes the offset between the two clocks within
//! half the request's round trip. A watch's deletion travels the other way as an age (seconds
//! since the deletion when the request was sent), which the agent takes against its own clock
//! at receipt: no clock is compared, and the request's one-way latency is the error (late).
//!
//! Versions: an answer names the agent's [`OBSERVER_PROTOCOL`]; an agent refuses fields it does
//! not know, so the operator sends a field added in protocol `n` only to an agent whose last
//! answer said `n` or more (an answer without the field is protocol 1).

use crate::core::removals::ServicePort;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// The path of the observer's requests.
pub const REMOVALS_PATH: &str = "/removals";
/// Watches one request may carry at most (the agent refuses more, 413).
pub const MAX_WATCHES: usize = 10_000;
/// The largest request body the agent reads, bytes: [`MAX_WATCHES`] watches of the longest
/// names fit.
pub const MAX_REQUEST_BYTES: usize = 8 << 20;
/// The longest a watch may ask to be kept, seconds; also the oldest deletion a watch may carry.
pub const MAX_REMAINING_SECONDS: f64 = 3600.0;
/// The protocol this agent speaks: 1, watches and records; 2, a watch may carry
/// `deletionAgeSeconds`.
pub const OBSERVER_PROTOCOL: u32 = 2;

/// The operator's request: the removals to watch now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObserveRequest {
    /// The removals to watch.
    pub watches: Vec<WatchRequest>,
}

/// One removal to watch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WatchRequest {
    /// The Service port whose rules hold the endpoint.
    pub service: ServicePort,
    /// The endpoint's IP.
    pub endpoint: IpAddr,
    /// How long from now to keep reading, seconds (0 to [`MAX_REMAINING_SECONDS`]).
    pub remaining_seconds: f64,
    /// Seconds since the pod's deletion as the operator saw it, when the request was sent (0 to
    /// [`MAX_REMAINING_SECONDS`]; protocol 2). The agent's deletion-to-removed histogram counts
    /// only watches that carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_age_seconds: Option<f64>,
}

/// What a node's reads showed of one watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WatchState {
    /// A successful read no longer held the endpoint.
    Removed,
    /// Every successful read so far held it, or none succeeded yet.
    Held,
    /// Past its time and still held (or never read): the agent stopped reading.
    Expired,
}

/// The agent's record of one watch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchRecord {
    /// The Service port.
    pub service: ServicePort,
    /// The endpoint's IP.
    pub endpoint: IpAddr,
    /// What the reads showed.
    pub state: WatchState,
    /// Start of the last successful read that still held the endpoint (before the first
    /// without), agent unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_with_unix_seconds: Option<f64>,
    /// End of the first successful read without it, agent unix seconds (state `removed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_without_unix_seconds: Option<f64>,
    /// Successful reads of the watch's Service port.
    pub reads: u32,
    /// Failed reads (no sample).
    pub failed_reads: u32,
    /// The last failed read's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObserveResponse {
    /// The agent's [`OBSERVER_PROTOCOL`] (1 when absent: agents before the field).
    #[serde(default = "protocol_1")]
    pub protocol: u32,
    /// The agent's clock when it built the answer, unix seconds.
    pub agent_unix_seconds: f64,
    /// The data plane it reads (`nftables`, `iptables-nft`, `iptables-legacy`, `cilium`), or None when it
    /// has none to read (every watch then stays `held` and expires).
    pub data_plane: Option<String>,
    /// One record per watch kept.
    pub records: Vec<WatchRecord>,
}

fn protocol_1() -> u32 {
    1
}

impl ObserveRequest {
    /// Checks the bounds: at most [`MAX_WATCHES`] watches, each keeping a finite, non-negative
    /// time of at most [`MAX_REMAINING_SECONDS`], and a deletion age, if any, in the same range. The error names the first offending watch.
    pub fn check(&self) -> Result<(), String> {
        if self.watches.len() > MAX_WATCHES {
            return Err(format!("{} watches: at most {MAX_WATCHES}", self.watches.len()));
        }
        for (i, w) in self.watches.iter().enumerate() {
            if !w.remaining_seconds.is_finite() || !(0.0..=MAX_REMAINING_SECONDS).contains(&w.remaining_seconds) {
                return Err(format!("watches[{i}].remainingSeconds {}: expected 0 to {MAX_REMAINING_SECONDS}", w.remaining_seconds));
            }
            if let Some(age) = w.deletion_age_seconds
                && (!age.is_finite() || !(0.0..=MAX_REMAINING_SECONDS).contains(&age))
            {
                return Err(format!("watches[{i}].deletionAgeSeconds {age}: expected 0 to {MAX_REMAINING_SECONDS}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request as the operator sends it, spelled out: the field names are the contract.
    const REQUEST: &str = r#"{"watches":[{"service":{"namespace":"shop","name":"web","portName":"http","protocol":"TCP","clusterIP":"10.96.12.7","port":80},"endpoint":"10.244.1.5","remainingSeconds":59.5,"deletionAgeSeconds":0.5}]}"#;
    const RESPONSE: &str = r#"{"protocol":2,"agentUnixSeconds":1765000000.25,"dataPlane":"nftables","records":[{"service":{"namespace":"shop","name":"web","portName":"http","protocol":"TCP","clusterIP":"10.96.12.7","port":80},"endpoint":"10.244.1.5","state":"removed","lastWithUnixSeconds":1764999999.5,"firstWithoutUnixSeconds":1764999999.625,"reads":12,"failedReads":1,"lastError":"nft list chain: exit status: 1"}]}"#;

    #[test]
    fn the_records_read_and_write_as_the_fixture() {
        let req: ObserveRequest = serde_json::from_str(REQUEST).unwrap();
        assert_eq!(req.watches[0].service.cluster_ip.to_string(), "10.96.12.7");
        assert_eq!(serde_json::to_string(&req).unwrap(), REQUEST);
        let resp: ObserveResponse = serde_json::from_str(RESPONSE).unwrap();
        assert_eq!(resp.records[0].state, WatchState::Removed);
        assert_eq!(serde_json::to_string(&resp).unwrap(), RESPONSE);
        req.check().unwrap();
    }

    #[test]
    fn a_request_out_of_bounds_is_refused_by_name() {
        let mut req: ObserveRequest = serde_json::from_str(REQUEST).unwrap();
        req.watches[0].remaining_seconds = f64::INFINITY;
        assert!(req.check().unwrap_err().contains("watches[0].remainingSeconds"));
        req.watches = vec![req.watches[0].clone(); MAX_WATCHES + 1];
        req.watches[0].remaining_seconds = 1.0;
        assert!(req.check().unwrap_err().contains("at most 10000"));
        assert!(serde_json::from_str::<ObserveRequest>(r#"{"watches":[],"extra":1}"#).is_err(), "unknown fields are refused");
        req.watches.truncate(1);
        req.watches[0].deletion_age_seconds = Some(-0.1);
        assert!(req.check().unwrap_err().contains("watches[0].deletionAgeSeconds -0.1"));
    }

    #[test]
    fn an_answer_without_a_protocol_is_protocol_1_and_a_watch_without_an_age_reads() {
        let old = RESPONSE.replace(r#""protocol":2,"#, "");
        assert_eq!(serde_json::from_str::<ObserveResponse>(&old).unwrap().protocol, 1);
        let req: ObserveRequest = serde_json::from_str(&REQUEST.replace(r#","deletionAgeSeconds":0.5"#, "")).unwrap();
        assert_eq!(req.watches[0].deletion_age_seconds, None);
    }
}
