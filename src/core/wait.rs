//! The preStop `Wait` handler (pure): what the webhook injects into a pod for it, and what the
//! operator answers the pod's waiter at its deletion (docs/wait.md).
//!
//! At CREATE the mutation ([`crate::core::mutate`]) adds an init container that copies the
//! waiter binary (`safe-termination-wait`, in the operator's image) into an emptyDir, a projected
//! volume with a service-account token of audience [`WAIT_AUDIENCE`] and the ConfigMap
//! [`CONFIG_MAP_NAME`] (the sleep each policy computes now, and the CA), and a `preStop.exec`
//! that runs the waiter. At deletion the waiter asks `GET /wait/v1`; the token says which pod
//! asks (its UID, from a TokenReview), and [`decide`] answers from what the leader's observer
//! knows of that pod's removals.
//!
//! Every answer that is not [`WaitState::Removed`], [`WaitState::LastEndpoint`] or
//! [`WaitState::Waiting`] makes the waiter fall back to the sleep the operator computes now,
//! minus what it already waited: doubt waits longer, never zero.

use serde::{Deserialize, Serialize};

/// The audience of the waiter's projected service-account token. The operator's TokenReview asks
/// for it, so a token for the API server (or any other audience) is refused here, and this token
/// is refused by the API server.
pub const WAIT_AUDIENCE: &str = "wait.safetermination.io";
/// The ConfigMap the leader keeps in each namespace with a `Wait` policy: `ca.crt` (the CA of the
/// operator's serving certificate) and `<policy>.preStopSeconds` per policy (the sleep it
/// computes now: the waiter's fallback). Projected into the pod, so the kubelet refreshes it.
pub const CONFIG_MAP_NAME: &str = "safe-termination-wait";
/// The ConfigMap's key of the serving CA (PEM).
pub const CONFIG_MAP_CA_KEY: &str = "ca.crt";
/// The pod annotation holding the serving CA at admission (PEM), projected by the downward API
/// as [`ADMISSION_CA_FILE`]: the waiter's CA when the namespace has no ConfigMap (a pod of the
/// cluster's default policy).
pub const ANNOTATION_WAIT_CA: &str = "safetermination.io/wait-ca";
/// The file of [`ANNOTATION_WAIT_CA`] in the projected volume.
pub const ADMISSION_CA_FILE: &str = "ca-admission.crt";
/// The pod annotation the mutation writes on a pod given the waiter: the handler, `Wait`.
pub const ANNOTATION_PRESTOP_HANDLER: &str = "safetermination.io/prestop-handler";

/// The emptyDir the init container copies the waiter into.
pub const BIN_VOLUME: &str = "safe-termination-wait-bin";
/// Where the app containers see [`BIN_VOLUME`] (read-only).
pub const BIN_MOUNT_PATH: &str = "/safe-termination/bin";
/// The waiter's path in the app containers.
pub const WAITER_PATH: &str = "/safe-termination/bin/safe-termination-wait";
/// The waiter's path in the operator's image (the init container runs it as `install`).
pub const WAITER_IMAGE_PATH: &str = "/usr/local/bin/safe-termination-wait";
/// The projected volume: `token`, the ConfigMap's keys, and [`ADMISSION_CA_FILE`].
pub const CONFIG_VOLUME: &str = "safe-termination-wait";
/// Where the app containers see [`CONFIG_VOLUME`] (read-only).
pub const CONFIG_MOUNT_PATH: &str = "/safe-termination/wait";
/// The init container's name.
pub const INSTALL_CONTAINER: &str = "safe-termination-wait-install";
/// The token's lifetime, seconds: the kubelet refreshes it at 80 % of it; an hour is the
/// TokenRequest API's default and the shortest lifetime the API server accepts is 10 minutes.
pub const TOKEN_EXPIRATION_SECONDS: u32 = 3600;
/// The emptyDir's size limit (the waiter is under 4 MB).
pub const BIN_VOLUME_SIZE_LIMIT: &str = "8Mi";

/// The margin a waiter adds after every node has removed the pod, seconds: the observer's
/// removals were within -0.25 s of the independent yardstick at their early end (its reads'
/// bounds: docs/benchmarks, "Observed removals"), so a removal can have been reported up to
/// 0.25 s before a node's rules really dropped the endpoint.
pub const REMOVED_MARGIN_SECONDS: f64 = 0.25;
/// The longest a `GET /wait/v1` is held, seconds (the waiter asks again).
pub const MAX_POLL_SECONDS: u64 = 10;
/// How long after the pod's deletion (or, when the deletion was not seen, after its first
/// question) the operator keeps answering `Waiting` without having joined the deletion with
/// an endpoint change, seconds; then `Unknown`, and the waiter falls back to the sleep.
pub const UNJOINED_SECONDS: f64 = 10.0;

/// Where the mutation points the waiter, and which image installs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitInjection {
    /// The image of the init container: the operator's own (it holds [`WAITER_IMAGE_PATH`]).
    pub image: String,
    /// `https://<service>.<namespace>.svc:8444/wait/v1`: the name the serving certificate holds,
    /// and the waiter endpoint's own port (`--wait-listen`, the Service's port `wait`).
    pub url: String,
    /// The Service's ClusterIP and port, when known: the waiter connects there and still checks
    /// the certificate against the URL's host (no cluster DNS needed at deletion).
    pub address: Option<String>,
    /// The serving CA (PEM), written on the pod as [`ANNOTATION_WAIT_CA`]; empty: none (the
    /// waiter then needs the ConfigMap's `ca.crt`).
    pub ca_pem: String,
}

impl Default for WaitInjection {
    /// The chart's defaults: release `safe-termination` in namespace `safe-termination`.
    fn default() -> Self {
        Self {
            image: format!("ghcr.io/safe-termination/safe-termination:{}", env!("CARGO_PKG_VERSION")),
            url: "https://safe-termination.safe-termination.svc:8444/wait/v1".into(),
            address: None,
            ca_pem: String::new(),
        }
    }
}

/// The ConfigMap key of `policy`'s current sleep.
pub fn fallback_key(policy: &str) -> String {
    format!("{policy}.preStopSeconds")
}

/// The waiter's deadline, seconds from the start of its hook: at most the policy's `maxSeconds`,
/// and leaving the app `appShutdownSeconds` of `grace` (the pod's grace after the mutation);
/// never below the admission sleep `pre_stop` (which the grace already holds).
pub fn deadline_seconds(max_seconds: u32, grace: i64, app_shutdown_seconds: u32, pre_stop: u32) -> u32 {
    let room = grace.saturating_sub(i64::from(app_shutdown_seconds)).clamp(0, i64::from(u32::MAX));
    let room = u32::try_from(room).unwrap_or(u32::MAX);
    max_seconds.min(room).max(pre_stop)
}

/// The state of one answer to `GET /wait/v1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitState {
    /// Some node still holds one of the pod's endpoints: ask again.
    Waiting,
    /// Every node that reports has removed the pod's endpoints: wait `marginSeconds` more.
    Removed,
    /// The pod is the last serving endpoint of each of its Services: kube-proxy keeps sending to
    /// it while it serves (ProxyTerminatingEndpoints, KEP-1669), so waiting changes nothing.
    LastEndpoint,
    /// This replica is not the leader (only the leader observes): ask again on a new connection.
    NotLeader,
    /// The operator cannot tell (observer off, deletion or endpoints not seen, the Service gone):
    /// the waiter falls back to the sleep.
    Unknown,
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitAnswer {
    /// The state.
    pub state: WaitState,
    /// With [`WaitState::Removed`]: seconds to wait more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin_seconds: Option<f64>,
    /// Why, in a few words.
    pub detail: String,
}

impl WaitAnswer {
    fn new(state: WaitState, detail: impl Into<String>) -> Self {
        Self { state, margin_seconds: None, detail: detail.into() }
    }
}

/// What a waiter reports at the end (`POST /wait/v1/report`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WaitOutcome {
    /// Every node removed the pod.
    Removed,
    /// The pod was its Services' last serving endpoint.
    LastEndpoint,
    /// The deadline passed while nodes still held it.
    Deadline,
    /// Doubt: it waited the sleep.
    Fallback,
}

impl WaitOutcome {
    /// Every outcome, in the order the status lists them.
    pub const ALL: [WaitOutcome; 4] = [WaitOutcome::Removed, WaitOutcome::LastEndpoint, WaitOutcome::Deadline, WaitOutcome::Fallback];

    /// The name, as the metric label and the status spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitOutcome::Removed => "Removed",
            WaitOutcome::LastEndpoint => "LastEndpoint",
            WaitOutcome::Deadline => "Deadline",
            WaitOutcome::Fallback => "Fallback",
        }
    }
}

/// A waiter's report, as it sends it (bounded by the server before parsing).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitReport {
    /// The outcome.
    pub outcome: WaitOutcome,
    /// The whole wait, seconds from the hook's start (planned at the decision).
    pub waited_seconds: f64,
    /// The sleep it would have fallen back to, seconds.
    pub fallback_seconds: f64,
    /// For a fallback: why.
    #[serde(default)]
    pub reason: String,
}

impl WaitReport {
    /// Checks the figures: finite, within [0, 1 day].
    ///
    /// Errors: the field that is out of range.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [("waitedSeconds", self.waited_seconds), ("fallbackSeconds", self.fallback_seconds)] {
            if !v.is_finite() || !(0.0..=86_400.0).contains(&v) {
                return Err(format!("{name} ({v}) must be within [0, 86400]"));
            }
        }
        Ok(())
    }
}

/// One finished wait, as the leader keeps it for the status.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitRecord {
    /// When its report came, unix seconds.
    pub at: f64,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The outcome.
    pub outcome: WaitOutcome,
    /// The whole wait, seconds.
    pub waited_seconds: f64,
    /// The sleep it would have fallen back to (the sleep it would have had), seconds.
    pub fallback_seconds: f64,
    /// The pod's window when the report came (the slowest of its removals, from the deletion
    /// the operator saw), seconds; None while a removal is open or none was observed.
    pub window_seconds: Option<f64>,
}

/// The waits of a namespace over the rolling window: how each ended, how long they took, and
/// against the sleep each would have had instead.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitSummary {
    /// Waits reported.
    pub waits: u32,
    /// Per outcome ([`WaitOutcome::ALL`]' order): how many.
    pub by_outcome: [u32; 4],
    /// The median wait, seconds.
    pub p50_seconds: Option<f64>,
    /// The 99th percentile wait (nearest rank), seconds.
    pub p99_seconds: Option<f64>,
    /// The longest wait, seconds.
    pub max_seconds: Option<f64>,
    /// The median of the sleeps the same pods would have had, seconds.
    pub sleep_p50_seconds: Option<f64>,
    /// Seconds waited in all, and slept in all had each pod slept instead.
    pub total_waited_seconds: f64,
    /// The sum of the sleeps, seconds.
    pub total_sleep_seconds: f64,
    /// Waits whose pod's window was known at the report.
    pub with_window: u32,
    /// Of them, waits at least as long as the window (the coverage check of observed removals,
    /// applied to waits: the wait starts when the kubelet runs the hook, after the deletion the
    /// window is timed from, so this fails towards a miss).
    pub covered: u32,
    /// The largest window less its wait among the misses, seconds.
    pub worst_miss_seconds: Option<f64>,
}

/// The nearest-rank quantile `q` of sorted `v` (None when empty).
fn nearest_rank(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

impl WaitRecord {
    /// A record of namespace `a`, pod `p`, a 5 s sleep replaced (tests).
    #[cfg(test)]
    pub(crate) fn example(outcome: WaitOutcome, waited_seconds: f64, window_seconds: Option<f64>) -> Self {
        Self { at: 0.0, namespace: "a".into(), pod: "p".into(), outcome, waited_seconds, fallback_seconds: 5.0, window_seconds }
    }
}

/// Summarises `records` (any order).
pub fn summarise<'a>(records: impl IntoIterator<Item = &'a WaitRecord>) -> WaitSummary {
    let mut s = WaitSummary::default();
    let (mut waited, mut slept) = (Vec::new(), Vec::new());
    for r in records {
        s.waits += 1;
        if let Some(i) = WaitOutcome::ALL.iter().position(|o| *o == r.outcome) {
            s.by_outcome[i] += 1;
        }
        waited.push(r.waited_seconds);
        slept.push(r.fallback_seconds);
        s.total_waited_seconds += r.waited_seconds;
        s.total_sleep_seconds += r.fallback_seconds;
        if let Some(w) = r.window_seconds {
            s.with_window += 1;
            if r.waited_seconds >= w {
                s.covered += 1;
            } else {
                let miss = w - r.waited_seconds;
                s.worst_miss_seconds = Some(s.worst_miss_seconds.map_or(miss, |m: f64| m.max(miss)));
            }
        }
    }
    waited.sort_by(f64::total_cmp);
    slept.sort_by(f64::total_cmp);
    s.p50_seconds = nearest_rank(&waited, 0.5);
    s.p99_seconds = nearest_rank(&waited, 0.99);
    s.max_seconds = waited.last().copied();
    s.sleep_p50_seconds = nearest_rank(&slept, 0.5);
    s
}

/// One of the pod's removals (an endpoint of one Service port), as the observer holds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RemovalProgress {
    /// Open: some node has not reported it removed.
    Open,
    /// Closed: every node reported it removed (or cannot read its data plane).
    Removed,
    /// Closed at its deadline with some node still holding it.
    Censored,
    /// Neither open nor closed: dropped (its Service deleted, the store full).
    Gone,
}

/// What the leader knows of the asking pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    /// Whether the observer runs on this replica (it is the leader and removals are observed).
    pub observing: bool,
    /// Whether this replica leads.
    pub leader: bool,
    /// When the pod's deletion was seen, unix seconds (None: not seen).
    pub deletion_seen: Option<f64>,
    /// Whether its deletion was joined with its endpoints turning terminating (then
    /// `removals` holds each removal it opened; empty: no Service with a ClusterIP selects it).
    pub joined: bool,
    /// Each removal of the pod.
    pub removals: Vec<RemovalProgress>,
    /// Per Service of the pod: its endpoints that are ready, the pod's own excluded (None: not
    /// known).
    pub ready_others: Vec<Option<u64>>,
    /// Services with a ClusterIP that selected the pod at its deletion but have no removal of
    /// it observed (a second Service: a deletion joins on its first endpoint change only; or
    /// the Services not known then).
    pub unobserved: usize,
    /// When this pod first asked, unix seconds.
    pub first_asked: f64,
}

/// The answer to a pod's waiter at `now` (unix seconds), with `extra_seconds` (the policy's
/// `preStop.extraSeconds`, paths the observer does not see) added to the margin after a
/// removal. In order: not the leader; observer off; the deletion not seen or not joined within
/// [`UNJOINED_SECONDS`]; a removal gone; every Service without another ready endpoint; every
/// removal removed; a Service that selected the pod without an observed removal; else waiting.
pub fn decide(view: &PodView, now: f64, extra_seconds: u32) -> WaitAnswer {
    if !view.leader {
        return WaitAnswer::new(WaitState::NotLeader, "this replica does not lead");
    }
    if !view.observing {
        return WaitAnswer::new(WaitState::Unknown, "removals are not observed (agent.observeRemovals off)");
    }
    if !view.joined {
        let since = view.deletion_seen.unwrap_or(view.first_asked);
        let what = if view.deletion_seen.is_some() { "its endpoints did not turn terminating" } else { "its deletion was not seen" };
        if now - since > UNJOINED_SECONDS {
            return WaitAnswer::new(WaitState::Unknown, format!("{what} within {UNJOINED_SECONDS} s"));
        }
        return WaitAnswer::new(WaitState::Waiting, format!("{what} yet"));
    }
    if view.removals.contains(&RemovalProgress::Gone) {
        return WaitAnswer::new(WaitState::Unknown, "a removal of the pod is no longer observed (its Service deleted?)");
    }
    if view.unobserved > 0 {
        return WaitAnswer::new(WaitState::Unknown, format!("{} of its Services' removals not observed", view.unobserved));
    }
    let open = view.removals.iter().filter(|r| **r == RemovalProgress::Open).count();
    if open > 0 && !view.ready_others.is_empty() && view.ready_others.iter().all(|r| *r == Some(0)) {
        return WaitAnswer::new(WaitState::LastEndpoint, "the last serving endpoint of its Services");
    }
    if open > 0 || view.removals.contains(&RemovalProgress::Censored) {
        return WaitAnswer::new(WaitState::Waiting, format!("{open} of {} removals open", view.removals.len()));
    }
    let detail = if view.removals.is_empty() {
        "no Service with a ClusterIP routes to it".to_string()
    } else {
        format!("removed on every node ({})", view.removals.len())
    };
    WaitAnswer { state: WaitState::Removed, margin_seconds: Some(REMOVED_MARGIN_SECONDS + f64::from(extra_seconds)), detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(removals: &[RemovalProgress]) -> PodView {
        PodView {
            observing: true,
            leader: true,
            deletion_seen: Some(100.0),
            joined: true,
            removals: removals.to_vec(),
            ready_others: vec![Some(2)],
            unobserved: 0,
            first_asked: 100.1,
        }
    }

    #[test]
    fn every_state_in_its_order() {
        use RemovalProgress::*;
        assert_eq!(decide(&PodView { leader: false, ..view(&[Removed]) }, 101.0, 0).state, WaitState::NotLeader);
        assert_eq!(decide(&PodView { observing: false, ..view(&[Removed]) }, 101.0, 0).state, WaitState::Unknown);
        assert_eq!(decide(&view(&[Open, Removed]), 101.0, 0).state, WaitState::Waiting);
        let done = decide(&view(&[Removed, Removed]), 101.0, 2);
        assert_eq!(done.state, WaitState::Removed);
        assert_eq!(done.margin_seconds, Some(2.25), "the margin plus extraSeconds");
        assert_eq!(decide(&view(&[]), 101.0, 0).state, WaitState::Removed, "no ClusterIP Service: nothing to remove");
        assert_eq!(decide(&view(&[Removed, Gone]), 101.0, 0).state, WaitState::Unknown, "a dropped removal is doubt");
        assert_eq!(decide(&view(&[Censored]), 170.0, 0).state, WaitState::Waiting, "censored: the waiter's deadline ends it");
        let second = PodView { unobserved: 1, ..view(&[Removed]) };
        assert_eq!(decide(&second, 101.0, 0).state, WaitState::Unknown, "a second Service not observed is doubt, not Removed");
        assert_eq!(decide(&PodView { unobserved: 1, ..view(&[]) }, 101.0, 0).state, WaitState::Unknown, "a headless slice joined first");
    }

    #[test]
    fn the_last_endpoint_only_while_a_removal_is_open_and_no_service_has_another() {
        use RemovalProgress::*;
        let last = PodView { ready_others: vec![Some(0), Some(0)], ..view(&[Open]) };
        assert_eq!(decide(&last, 101.0, 0).state, WaitState::LastEndpoint);
        let one_other = PodView { ready_others: vec![Some(0), Some(1)], ..view(&[Open]) };
        assert_eq!(decide(&one_other, 101.0, 0).state, WaitState::Waiting);
        let unknown = PodView { ready_others: vec![Some(0), None], ..view(&[Open]) };
        assert_eq!(decide(&unknown, 101.0, 0).state, WaitState::Waiting, "a Service not known is not 'no other'");
        let removed = PodView { ready_others: vec![Some(0)], ..view(&[Removed]) };
        assert_eq!(decide(&removed, 101.0, 0).state, WaitState::Removed);
    }

    #[test]
    fn an_unseen_or_unjoined_deletion_waits_a_bounded_time_then_doubts() {
        let unseen = PodView { deletion_seen: None, joined: false, removals: vec![], ..view(&[]) };
        assert_eq!(decide(&unseen, 100.1 + UNJOINED_SECONDS - 0.01, 0).state, WaitState::Waiting);
        assert_eq!(decide(&unseen, 100.1 + UNJOINED_SECONDS + 0.01, 0).state, WaitState::Unknown);
        let unjoined = PodView { joined: false, removals: vec![], ..view(&[]) };
        assert_eq!(decide(&unjoined, 100.0 + UNJOINED_SECONDS + 0.01, 0).state, WaitState::Unknown);
        assert!(decide(&unjoined, 100.0 + UNJOINED_SECONDS + 0.01, 0).detail.contains("terminating"));
    }

    #[test]
    fn the_deadline_leaves_the_app_its_shutdown_and_never_goes_below_the_sleep() {
        assert_eq!(deadline_seconds(60, 90, 30, 5), 60);
        assert_eq!(deadline_seconds(60, 45, 30, 5), 15, "a user's grace of 45 s leaves 15 s to wait");
        assert_eq!(deadline_seconds(60, 20, 30, 5), 5, "never below the admission sleep");
        assert_eq!(deadline_seconds(10, 600, 30, 3), 10);
    }

    #[test]
    fn the_summary_counts_outcomes_and_takes_nearest_rank_quantiles() {
        let rec = WaitRecord::example;
        let rs = [
            rec(WaitOutcome::Removed, 1.0, Some(0.8)),
            rec(WaitOutcome::Removed, 2.0, Some(2.5)),
            rec(WaitOutcome::Fallback, 5.0, None),
            rec(WaitOutcome::LastEndpoint, 0.1, Some(0.0)),
        ];
        let s = summarise(&rs);
        assert_eq!(s.waits, 4);
        assert_eq!(s.by_outcome, [2, 1, 0, 1]);
        assert_eq!(s.p50_seconds, Some(1.0));
        assert_eq!(s.p99_seconds, Some(5.0));
        assert_eq!(s.sleep_p50_seconds, Some(5.0));
        assert!((s.total_waited_seconds - 8.1).abs() < 1e-9 && s.total_sleep_seconds == 20.0);
        assert_eq!((s.with_window, s.covered), (3, 2));
        assert_eq!(s.worst_miss_seconds, Some(0.5));
        assert_eq!(summarise(&[]).p50_seconds, None);
    }

    #[test]
    fn a_report_with_figures_out_of_range_is_refused() {
        let r = WaitReport { outcome: WaitOutcome::Removed, waited_seconds: 1.5, fallback_seconds: 5.0, reason: String::new() };
        assert!(r.validate().is_ok());
        assert!(WaitReport { waited_seconds: f64::NAN, ..r.clone() }.validate().unwrap_err().contains("waitedSeconds"));
        assert!(WaitReport { fallback_seconds: -1.0, ..r }.validate().unwrap_err().contains("fallbackSeconds"));
    }
}
