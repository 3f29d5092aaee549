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
//!
//! Protocol 3 bounds the wire while removals stay open (every agent is asked four times a
//! second): a request names its set of watches (`setId`), and once the agent holds that set the
//! operator sends only `{"watches":[],"setId":n,"sameSet":true}`; an agent holding another set
//! (it restarted) keeps none and says so in its answer's `setId`, and is sent the whole set next.
//! An answer carries the agent's [`AnswerMark`], and a request whose URL has
//! `?since=<epoch>.<generation>` (the mark of the last answer the operator read) is answered only
//! the records whose state changed after it: a new watch, its first read, its
//! [`UNREAD_AFTER_FAILED_READS`]th failed read before any success, its removal, its expiry. A mark of another epoch (the agent restarted) is
//! answered in full. The read counters and a held watch's last read in a record are those of its
//! last change.

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
/// A watch no read has held is unread (its node's reader fails: permission denied, a program
/// missing, a read that never settles) after this many failed reads with no success: one
/// failure says nothing yet. An unread node does not hold a removal open. The Service port's
/// chain absent before any read held the endpoint is no failed read (the node keeps holding the
/// removal open; the record's `lastError` says so): kube-proxy 1.37's iptables-nft node showed
/// a Service's chain absent in 8 reads over 0.4 s at 4,000 Services, and an unread node
/// there would have closed removals on the other node's word.
pub const UNREAD_AFTER_FAILED_READS: u32 = 3;

/// The protocol this agent speaks: 1, watches and records; 2, a watch may carry
/// `deletionAgeSeconds`; 3, sets of watches by id and answers of the changed records (above).
pub const OBSERVER_PROTOCOL: u32 = 3;

/// The operator's request: the removals to watch now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObserveRequest {
    /// The removals to watch (empty with `sameSet`).
    pub watches: Vec<WatchRequest>,
    /// The set's id, the operator's (protocol 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_id: Option<u64>,
    /// Keep the set `setId` names instead of replacing it (protocol 3; `watches` then empty).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub same_set: bool,
}

/// Where an agent's answers stand: its epoch (drawn at its start) and the generation of its
/// watches' changes when it answered. Written `<epoch>.<generation>` in a request's `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerMark {
    /// Drawn when the agent started.
    pub epoch: u64,
    /// Changes of its watches so far.
    pub generation: u64,
}

impl AnswerMark {
    /// The mark as a request's `since` query value.
    pub fn to_query(self) -> String {
        format!("{}.{}", self.epoch, self.generation)
    }

    /// A request's `since` value; None for anything else.
    pub fn from_query(value: &str) -> Option<Self> {
        let (epoch, generation) = value.split_once('.')?;
        Some(Self { epoch: epoch.parse().ok()?, generation: generation.parse().ok()? })
    }
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
    /// One record per watch kept, or (`complete` false) per watch changed since the request's
    /// `since`.
    pub records: Vec<WatchRecord>,
    /// The set the agent holds (protocol 3; None: none named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_id: Option<u64>,
    /// The mark to send as the next request's `since` (protocol 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mark: Option<AnswerMark>,
    /// Every watch kept has a record (false: only the changed ones).
    #[serde(default = "yes")]
    pub complete: bool,
}

fn protocol_1() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// Why an observe request is out of bounds: the first offending field, named as on the wire.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// More than [`MAX_WATCHES`] watches.
    #[error("{count} watches: at most {max}", max = MAX_WATCHES)]
    TooManyWatches {
        /// The watches sent.
        count: usize,
    },
    /// `sameSet` without a `setId`, or with watches.
    #[error("sameSet needs a setId and no watches")]
    SameSetWithoutSet,
    /// A watch's `remainingSeconds` not finite or outside 0 to [`MAX_REMAINING_SECONDS`].
    #[error("watches[{index}].remainingSeconds {value}: expected 0 to {max}", max = MAX_REMAINING_SECONDS)]
    RemainingSeconds {
        /// The watch's 0-based index.
        index: usize,
        /// The value sent, seconds.
        value: f64,
    },
    /// A watch's `deletionAgeSeconds` not finite or outside 0 to [`MAX_REMAINING_SECONDS`].
    #[error("watches[{index}].deletionAgeSeconds {value}: expected 0 to {max}", max = MAX_REMAINING_SECONDS)]
    DeletionAge {
        /// The watch's 0-based index.
        index: usize,
        /// The value sent, seconds.
        value: f64,
    },
}

impl ObserveRequest {
    /// Checks the bounds: at most [`MAX_WATCHES`] watches, each keeping a finite, non-negative
    /// time of at most [`MAX_REMAINING_SECONDS`], and a deletion age, if any, in the same range.
    ///
    /// Errors: the first offending field ([`RequestError`]).
    pub fn check(&self) -> Result<(), RequestError> {
        if self.watches.len() > MAX_WATCHES {
            return Err(RequestError::TooManyWatches { count: self.watches.len() });
        }
        if self.same_set && (self.set_id.is_none() || !self.watches.is_empty()) {
            return Err(RequestError::SameSetWithoutSet);
        }
        let in_range = |s: f64| s.is_finite() && (0.0..=MAX_REMAINING_SECONDS).contains(&s);
        for (index, w) in self.watches.iter().enumerate() {
            if !in_range(w.remaining_seconds) {
                return Err(RequestError::RemainingSeconds { index, value: w.remaining_seconds });
            }
            if let Some(value) = w.deletion_age_seconds.filter(|age| !in_range(*age)) {
                return Err(RequestError::DeletionAge { index, value });
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
    const RESPONSE: &str = r#"{"protocol":3,"agentUnixSeconds":1765000000.25,"dataPlane":"nftables","records":[{"service":{"namespace":"shop","name":"web","portName":"http","protocol":"TCP","clusterIP":"10.96.12.7","port":80},"endpoint":"10.244.1.5","state":"removed","lastWithUnixSeconds":1764999999.5,"firstWithoutUnixSeconds":1764999999.625,"reads":12,"failedReads":1,"lastError":"nft list chain: exit status: 1"}],"setId":7,"mark":{"epoch":42,"generation":9},"complete":false}"#;

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
        let e = req.check().unwrap_err();
        assert_eq!(e, RequestError::RemainingSeconds { index: 0, value: f64::INFINITY });
        assert_eq!(e.to_string(), "watches[0].remainingSeconds inf: expected 0 to 3600");
        req.watches = vec![req.watches[0].clone(); MAX_WATCHES + 1];
        req.watches[0].remaining_seconds = 1.0;
        let e = req.check().unwrap_err();
        assert_eq!(e, RequestError::TooManyWatches { count: 10_001 });
        assert_eq!(e.to_string(), "10001 watches: at most 10000");
        assert!(serde_json::from_str::<ObserveRequest>(r#"{"watches":[],"extra":1}"#).is_err(), "unknown fields are refused");
        req.watches.truncate(1);
        req.watches[0].deletion_age_seconds = Some(-0.1);
        let e = req.check().unwrap_err();
        assert_eq!(e, RequestError::DeletionAge { index: 0, value: -0.1 });
        assert_eq!(e.to_string(), "watches[0].deletionAgeSeconds -0.1: expected 0 to 3600");
    }

    #[test]
    fn an_answer_without_a_protocol_is_protocol_1_and_a_watch_without_an_age_reads() {
        let old = RESPONSE.replace(r#""protocol":3,"#, "").replace(r#","setId":7,"mark":{"epoch":42,"generation":9},"complete":false"#, "");
        let old: ObserveResponse = serde_json::from_str(&old).unwrap();
        assert_eq!((old.protocol, old.set_id, old.mark, old.complete), (1, None, None, true), "an answer before protocol 3 is complete");
        let req: ObserveRequest = serde_json::from_str(&REQUEST.replace(r#","deletionAgeSeconds":0.5"#, "")).unwrap();
        assert_eq!(req.watches[0].deletion_age_seconds, None);
        let poll: ObserveRequest = serde_json::from_str(r#"{"watches":[],"setId":7,"sameSet":true}"#).unwrap();
        poll.check().unwrap();
        assert_eq!(serde_json::to_string(&poll).unwrap(), r#"{"watches":[],"setId":7,"sameSet":true}"#);
        let bad = ObserveRequest { same_set: true, ..req.clone() };
        assert_eq!(bad.check().unwrap_err(), RequestError::SameSetWithoutSet);
        assert_eq!(RequestError::SameSetWithoutSet.to_string(), "sameSet needs a setId and no watches");
        assert_eq!(AnswerMark::from_query("42.9"), Some(AnswerMark { epoch: 42, generation: 9 }));
        assert_eq!(AnswerMark { epoch: 42, generation: 9 }.to_query(), "42.9");
        for bad in ["42", "42.", ".9", "x.9", "42.9.1", "-1.2"] {
            assert_eq!(AnswerMark::from_query(bad), None, "{bad}");
        }
    }
}
