//! Observed removals: the per-removal arithmetic of the observer (pure). A node's reader (one per
//! data plane: kube-proxy's iptables and nftables rules, later Cilium's BPF maps) reads, while a
//! removal is pending on its node, whether the Service's rules still send new connections to the
//! endpoint; each removal on each node becomes a [`NodeObservation`]; this module turns them into
//! windows, censoring, a p99 and the coverage of each pod's own sleep.
//!
//! The rules follow the yardstick of the tests (`tests/common/rules.rs`), written separately:
//! - only successful reads count: a failed read is no sample;
//! - a removal happened after the start of the last successful read that still showed the
//!   endpoint and by the end of the first successful read that no longer did (the read bound);
//!   its window is measured to the end of that read, so it never reads short;
//! - a removal not seen by its deadline is **censored**: its window is at least the deadline
//!   less the deletion; it is reported and counted, never dropped;
//! - per removal, the cluster's window is the slowest node's: a censored node makes the removal
//!   censored.
//!
//! Times are unix seconds on the operator's clock: the adapter moves each node's read times to it
//! with [`ClockOffset`], taken late by the offset's bound, so no skew is left to apply here.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;

/// A Service port as the data planes key it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The port's name (`""` for an unnamed single port).
    pub port_name: String,
    /// `TCP`, `UDP` or `SCTP` (as the Service spells it; the readers fold the case).
    pub protocol: String,
    /// The ClusterIP.
    #[serde(rename = "clusterIP")]
    pub cluster_ip: IpAddr,
    /// The Service port.
    pub port: u16,
}

/// What one node's reads said of one removal.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum NodeObservation {
    /// Removed: after `last_with` (the start of the last successful read that still held the
    /// endpoint; None when no successful read held it after the deletion) and by `first_without`
    /// (the end of the first successful read that did not).
    Removed {
        /// Start of the last successful read with the endpoint, unix seconds.
        last_with: Option<f64>,
        /// End of the first successful read without it, unix seconds.
        first_without: f64,
    },
    /// Still held at `deadline`, unix seconds: right-censored.
    Censored {
        /// When the node stopped waiting, unix seconds.
        deadline: f64,
        /// Start of the last successful read that still held the endpoint, unix seconds (None
        /// when no read held it).
        last_with: Option<f64>,
    },
}

/// One removal: an endpoint of a Service leaving every node's data plane after its pod's
/// deletion.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Removal {
    /// `namespace/name` of the Service.
    pub service: String,
    /// The endpoint's IP.
    pub endpoint: String,
    /// `namespace/name` of the pod.
    pub pod: String,
    /// When the pod's deletion was seen, unix seconds.
    pub deletion: f64,
    /// The pod's own injected preStop sleep, seconds (None: the pod had none).
    pub sleep_seconds: Option<u32>,
    /// Per node: (node name, what its reads said). A closed removal keeps only the nodes that
    /// decide its window and precision ([`Removal::compacted`]).
    pub nodes: Vec<(String, NodeObservation)>,
}

/// How long before a Service's deletion its pods' removals count as its teardown, seconds
/// ([`RemovalStore::forget_service`]): a namespace's deletion deletes its pods and its Services
/// in the same pass of the namespace controller, seconds apart; a minute leaves room for a
/// loaded control plane. A rollout just before its Service's deletion loses its removals too:
/// fewer samples, never a shorter sleep for a live Service.
pub const TEARDOWN_SECONDS: f64 = 60.0;

/// How recent a censored node's last read holding the endpoint must be at the deadline, seconds,
/// for the censoring to count: a node whose reads stopped succeeding long before (a listing
/// slower than its timeout, a chain gone with its namespace) says only that it held the
/// endpoint then, not at the deadline.
pub const CENSORED_FRESH_SECONDS: f64 = 5.0;

/// The widest read bound (last read with the endpoint to first read without it, seconds) of a
/// removal whose window counts in the p99: a slow listing (`nft` at 12,000 Services takes
/// seconds per read) bounds a removal only coarsely, and its late end would size W from the
/// reader's slowness, and a coverage from it would count misses that may not be. Coarse removals
/// are counted apart. A node whose first read already lacked the endpoint is bounded by the
/// deletion instead (the endpoint cannot have left before the deletion that removes it): a fast
/// removal read soon after it is precise, one read late is coarse.
pub const PRECISE_BOUND_SECONDS: f64 = 0.5;

/// A removal's window, seconds from the deletion.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Window {
    /// Seen removed on every node: the slowest node's window.
    Observed(f64),
    /// Not seen removed on some node by its deadline: at least this long.
    AtLeast(f64),
}

impl Window {
    /// The seconds (exact or the lower bound).
    pub fn seconds(self) -> f64 {
        match self {
            Self::Observed(s) | Self::AtLeast(s) => s,
        }
    }
}

impl NodeObservation {
    /// Bounded within [`PRECISE_BOUND_SECONDS`] (from the later of the last read holding the
    /// endpoint and the `deletion`, or from the deletion when no read held it), or, censored,
    /// read as held within
    /// [`CENSORED_FRESH_SECONDS`] of its deadline.
    fn is_precise(&self, deletion: f64) -> bool {
        match *self {
            Self::Removed { last_with: Some(lw), first_without } => first_without - lw.max(deletion) <= PRECISE_BOUND_SECONDS,
            Self::Removed { last_with: None, first_without } => first_without - deletion <= PRECISE_BOUND_SECONDS,
            Self::Censored { deadline, last_with } => last_with.is_some_and(|lw| deadline - lw <= CENSORED_FRESH_SECONDS),
        }
    }
}

impl Removal {
    /// Every node's removal is bounded within [`PRECISE_BOUND_SECONDS`], and every censored
    /// node read the endpoint as held within [`CENSORED_FRESH_SECONDS`] of its deadline (its
    /// window is then a lower bound, ranked above every observed one).
    pub fn is_precise(&self) -> bool {
        self.nodes.iter().all(|(_, o)| o.is_precise(self.deletion))
    }

    /// The same removal with at most three nodes: the slowest removed one, the longest censored
    /// one and the first imprecise one, which give the same [`Self::window`] and
    /// [`Self::is_precise`]. A closed removal of a 5,000-node cluster would otherwise keep 5,000
    /// observations, of which the summary reads these three.
    pub fn compacted(mut self) -> Removal {
        let pick = |f: &dyn Fn(&NodeObservation) -> Option<f64>| {
            self.nodes.iter().enumerate().filter_map(|(i, (_, o))| Some((i, f(o)?))).max_by(|a, b| a.1.total_cmp(&b.1)).map(|(i, _)| i)
        };
        let slowest = pick(&|o| if let NodeObservation::Removed { first_without, .. } = o { Some(*first_without) } else { None });
        let censored = pick(&|o| if let NodeObservation::Censored { deadline, .. } = o { Some(*deadline) } else { None });
        let imprecise = self.nodes.iter().position(|(_, o)| !o.is_precise(self.deletion));
        let keep: BTreeSet<usize> = [slowest, censored, imprecise].into_iter().flatten().collect();
        let mut i = 0;
        self.nodes.retain(|_| {
            i += 1;
            keep.contains(&(i - 1))
        });
        // retain keeps the capacity of every node
        self.nodes.shrink_to_fit();
        self
    }

    /// The cluster's window of this removal: the slowest node's, `AtLeast` when any node is
    /// censored (the longest censored wait, or the slowest observed node if that is longer).
    /// None without any node.
    pub fn window(&self) -> Option<Window> {
        let mut observed: Option<f64> = None;
        let mut censored: Option<f64> = None;
        for (_, o) in &self.nodes {
            match *o {
                NodeObservation::Removed { first_without, .. } => {
                    let w = (first_without - self.deletion).max(0.0);
                    observed = Some(observed.map_or(w, |m| m.max(w)));
                }
                NodeObservation::Censored { deadline, .. } => {
                    let w = (deadline - self.deletion).max(0.0);
                    censored = Some(censored.map_or(w, |m| m.max(w)));
                }
            }
        }
        match (observed, censored) {
            (_, Some(c)) => Some(Window::AtLeast(c.max(observed.unwrap_or(0.0)))),
            (Some(o), None) => Some(Window::Observed(o)),
            (None, None) => None,
        }
    }
}

/// A pod whose own sleep did not cover its window.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Miss {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// Its window, seconds (a lower bound when censored).
    pub window_seconds: f64,
    /// Its sleep, seconds (0 when it had none).
    pub sleep_seconds: u32,
    /// The window was censored (the pod was still in some node's rules at the deadline).
    pub censored: bool,
}

/// The removals of a rolling window, summarised.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemovalSummary {
    /// Removals with a window (observed or censored).
    pub removals: usize,
    /// Of them, censored.
    pub censored: usize,
    /// Of them, bounded too coarsely to count in the p99 ([`PRECISE_BOUND_SECONDS`]).
    pub coarse: usize,
    /// The p99 of the precise windows, seconds: the smallest window with at least 99% of the
    /// precise removals at or below it, censored ones ranked above every observed one; None
    /// without a precise removal, or when the rank falls on a censored removal (only a lower
    /// bound is known: see `p99_at_least_seconds`).
    pub p99_seconds: Option<f64>,
    /// When the p99's rank falls on a censored removal: the lower bound it is known to exceed.
    pub p99_at_least_seconds: Option<f64>,
    /// Precise removals of pods that had a sleep, and of them the share whose sleep covered the
    /// window (a censored window longer than the sleep is a miss); None without such a removal.
    pub coverage_ratio: Option<f64>,
    /// Removals counted in the coverage.
    pub coverage_removals: usize,
    /// The worst miss: the largest window less sleep among the misses.
    pub worst_miss: Option<Miss>,
}

impl RemovalSummary {
    /// The p99 as W takes it: the observed p99, or the lower bound when its rank fell on a
    /// censored removal (with `true`); None without a precise removal.
    pub fn p99(&self) -> Option<(f64, bool)> {
        self.p99_seconds.map(|p| (p, false)).or(self.p99_at_least_seconds.map(|p| (p, true)))
    }
}

/// Summarises `removals`: the p99 and the coverage over the precise ones
/// ([`Removal::is_precise`]), the others counted.
pub fn summarise<'a>(removals: impl IntoIterator<Item = &'a Removal>) -> RemovalSummary {
    let windows: Vec<(&Removal, Window)> = removals.into_iter().filter_map(|r| Some((r, r.window()?))).collect();
    let censored = windows.iter().filter(|(_, w)| matches!(w, Window::AtLeast(_))).count();
    let precise: Vec<&(&Removal, Window)> = windows.iter().filter(|(r, _)| r.is_precise()).collect();
    // observed ascending, then censored (ascending by their bound) above every observed one
    let mut ranked: Vec<Window> = precise.iter().map(|(_, w)| *w).collect();
    ranked.sort_by(|a, b| match (a, b) {
        (Window::Observed(x), Window::Observed(y)) | (Window::AtLeast(x), Window::AtLeast(y)) => x.total_cmp(y),
        (Window::Observed(_), Window::AtLeast(_)) => std::cmp::Ordering::Less,
        (Window::AtLeast(_), Window::Observed(_)) => std::cmp::Ordering::Greater,
    });
    let (p99_seconds, p99_at_least_seconds) = match ranked.len() {
        0 => (None, None),
        n => match ranked[((0.99 * n as f64).ceil() as usize).clamp(1, n) - 1] {
            Window::Observed(s) => (Some(s), None),
            Window::AtLeast(s) => (None, Some(s)),
        },
    };
    let mut covered = 0usize;
    let mut counted = 0usize;
    let mut worst: Option<Miss> = None;
    for (r, w) in &precise {
        let Some(sleep) = r.sleep_seconds else { continue };
        counted += 1;
        let (seconds, is_censored) = (w.seconds(), matches!(w, Window::AtLeast(_)));
        // a censored window of exactly the sleep is still a miss: the endpoint was held longer
        let missed = if is_censored { seconds >= f64::from(sleep) } else { seconds > f64::from(sleep) };
        if !missed {
            covered += 1;
            continue;
        }
        let miss = Miss { pod: r.pod.clone(), window_seconds: seconds, sleep_seconds: sleep, censored: is_censored };
        if worst.as_ref().is_none_or(|m| seconds - f64::from(sleep) > m.window_seconds - f64::from(m.sleep_seconds)) {
            worst = Some(miss);
        }
    }
    RemovalSummary {
        removals: windows.len(),
        censored,
        coarse: windows.len() - precise.len(),
        p99_seconds,
        p99_at_least_seconds,
        coverage_ratio: (counted > 0).then(|| covered as f64 / counted as f64),
        coverage_removals: counted,
        worst_miss: worst,
    }
}

/// The share of observed removals whose pod's own sleep must cover its window: below it the
/// `PodsUnderprotected` condition and the `PreStopSleepMissed` alert fire (a miss in a hundred
/// removals is one too many to ignore, one in a thousand is the p99 the sleep is sized for).
pub const OBSERVED_COVERAGE_TARGET: f64 = 0.99;
/// How long after a deletion a node still holding the endpoint counts as censored, seconds.
pub const DEFAULT_DEADLINE_SECONDS: f64 = 60.0;
/// Removals watched at once at most: past it the oldest open removal is dropped (counted).
pub const MAX_OPEN_REMOVALS: usize = 10_000;
/// Closed removals kept at most (the rolling window's).
pub const MAX_CLOSED_REMOVALS: usize = 20_000;

/// A removal to observe: an endpoint of a Service port whose pod's deletion was seen.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingRemoval {
    /// The Service port whose rules hold the endpoint.
    pub service: ServicePort,
    /// The endpoint's IP.
    pub endpoint: IpAddr,
    /// `namespace/name` of the pod.
    pub pod: String,
    /// When the pod's deletion was seen, unix seconds (the operator's clock).
    pub deletion: f64,
    /// The pod's injected preStop sleep, seconds (None: it had none).
    pub sleep_seconds: Option<u32>,
    /// When a node still holding the endpoint counts as censored, unix seconds.
    pub deadline: f64,
}

/// What one node's agent last said of one watched removal, its times already on the operator's
/// clock and taken late by the clock-offset bound (the caller's conversion).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NodeReport {
    /// Removed: [`NodeObservation::Removed`]'s bounds.
    Removed {
        /// Start of the last successful read with the endpoint, unix seconds.
        last_with: Option<f64>,
        /// End of the first successful read without it, unix seconds.
        first_without: f64,
    },
    /// Every successful read so far held it; the last one started at `last_with`.
    Held {
        /// Start of the last successful read that held the endpoint, unix seconds.
        last_with: Option<f64>,
    },
    /// The node's reads of its data plane failed, none succeeding (a reader that cannot run):
    /// the node says nothing of the removal, does not hold it open, and is left out of it.
    Unread,
    /// The node has not read since it was asked (its answer came before its first round): it
    /// holds the removal open, and is left out of it if it never reads by the deadline.
    NotYetRead,
}

#[derive(Debug, Clone)]
struct Open {
    pending: PendingRemoval,
    /// Per node (its name shared with every other open removal: [`RemovalStore::names`]).
    nodes: BTreeMap<Arc<str>, NodeReport>,
}

/// Watched and closed removals, keyed by (Service port, endpoint). The adapters feed it: a
/// deletion seen opens a removal ([`RemovalStore::open`]), each agent's answer reports per node
/// ([`RemovalStore::report`]), and [`RemovalStore::close`] ends the removals every node has
/// dropped or whose deadline passed. A node that never answered for a removal, or never read its
/// data plane successfully ([`NodeReport::Unread`]), is not in it (a removal with no other node
/// is counted in [`RemovalStore::unobserved`]): no read says nothing about its rules, and
/// taking it for "still held" would censor every removal at its deadline.
#[derive(Debug, Default)]
pub struct RemovalStore {
    open: BTreeMap<(ServicePort, IpAddr), Open>,
    /// The node names of the open removals' reports, one allocation each however many removals
    /// are open (100 open removals on 5,000 nodes hold 500,000 reports); emptied with `open`.
    names: BTreeSet<Arc<str>>,
    /// (closed at, removal), oldest first.
    closed: VecDeque<(f64, Removal)>,
    dropped: u64,
    unobserved: u64,
    service_gone: u64,
    /// Bumped by every change to `closed`, `closed_by_plane` and `data_planes`. Between two
    /// changes the removals within a window are a suffix of each list that only shortens as they
    /// age out, so (this, how many are within) names them: the summaries' cache key.
    changes: u64,
    /// The last summary and its key (`changes`, the removals within the window): every policy's
    /// reconcile asks for it, and it changes only with them.
    cached: Option<((u64, usize), RemovalSummary)>,
    /// Each node's data plane, as its agent names it ([`DATA_PLANES`]; a node not named is in
    /// no data plane's tally).
    data_planes: BTreeMap<String, &'static str>,
    /// Per data plane, (closed at, the removal as that data plane's nodes saw it: its slowest
    /// of them), oldest first, each at most [`MAX_CLOSED_REMOVALS`].
    closed_by_plane: BTreeMap<&'static str, VecDeque<(f64, Removal)>>,
    /// The last per-data-plane summaries and their key (`changes`, each data plane's removals
    /// within the window): every policy's reconcile asks for them too.
    cached_by_plane: Option<(PlanesKey, Vec<DataPlaneSummary>)>,
}

/// The per-data-plane summaries' cache key: `changes`, and each data plane's removals within the
/// window, in [`DATA_PLANES`]' order.
type PlanesKey = (u64, Vec<usize>);

/// The removals of `closed` ((closed at, removal), oldest first) closed within `window_seconds`
/// before `now`.
fn within(closed: &VecDeque<(f64, Removal)>, now: f64, window_seconds: f64) -> impl Iterator<Item = &Removal> {
    closed.iter().filter(move |(at, _)| now - at <= window_seconds).map(|(_, r)| r)
}

/// The data planes an agent may name (its `dataPlane`): kube-proxy's iptables modes by backend,
/// its nftables mode, and Cilium's eBPF load balancer. Anything else is no data plane.
pub const DATA_PLANES: [&str; 4] = ["iptables-nft", "iptables-legacy", "nftables", "cilium"];

/// The removals one data plane's nodes saw: each removal's window is the slowest of those nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DataPlaneSummary {
    /// The data plane ([`DATA_PLANES`]).
    pub data_plane: &'static str,
    /// Its nodes (whose agents named it).
    pub nodes: usize,
    /// Their removals, summarised as the cluster's are ([`summarise`]).
    pub summary: RemovalSummary,
}

/// One watch the agents are asked to keep: the Service port, the endpoint, how long to keep
/// reading, seconds, and how long ago the pod's deletion was seen, seconds (at least 0).
pub type Watch<'a> = (&'a ServicePort, IpAddr, f64, f64);

impl RemovalStore {
    /// Opens the removal of `p`; a removal of the same Service port and endpoint already open is
    /// kept (the earlier deletion). Past [`MAX_OPEN_REMOVALS`] the oldest open one is dropped.
    pub fn open(&mut self, p: PendingRemoval) {
        let key = (p.service.clone(), p.endpoint);
        if self.open.contains_key(&key) {
            return;
        }
        while self.open.len() >= MAX_OPEN_REMOVALS {
            let Some(oldest) = self.open.iter().min_by(|a, b| a.1.pending.deletion.total_cmp(&b.1.pending.deletion)).map(|(k, _)| k.clone()) else { break };
            self.open.remove(&oldest);
            self.dropped += 1;
        }
        self.open.insert(key, Open { pending: p, nodes: BTreeMap::new() });
    }

    /// What every agent should watch at `now`: each open removal not past its deadline.
    pub fn watches(&self, now: f64) -> Vec<Watch<'_>> {
        self.open
            .values()
            .filter(|o| o.pending.deadline > now)
            .map(|o| (&o.pending.service, o.pending.endpoint, o.pending.deadline - now, (now - o.pending.deletion).max(0.0)))
            .collect()
    }

    /// `node` said `report` of the removal of `endpoint` from `service`; a report of a removal not
    /// open is ignored. A node seen removed stays removed (its earliest bound is kept).
    pub fn report(&mut self, node: &str, service: &ServicePort, endpoint: IpAddr, report: NodeReport) {
        let Some(o) = self.open.get_mut(&(service.clone(), endpoint)) else { return };
        match (o.nodes.get(node), report) {
            (Some(NodeReport::Removed { .. }), _) => {}
            // a node that read keeps what it said over an answer built before its next read
            (Some(NodeReport::Held { .. }), NodeReport::NotYetRead) => {}
            _ => {
                let name = match self.names.get(node) {
                    Some(n) => n.clone(),
                    None => {
                        let n: Arc<str> = node.into();
                        self.names.insert(n.clone());
                        n
                    }
                };
                o.nodes.insert(name, report);
            }
        }
    }

    /// How far the removal of `endpoint` from `service` after the deletion seen at `deletion`
    /// (unix seconds) is, for a pod's waiter ([`crate::core::wait::RemovalProgress`]). The
    /// closed removals are searched from the newest back to the first closed before the
    /// deletion, so a question costs the removals closed since, not the whole window.
    pub fn progress(&self, service: &ServicePort, endpoint: IpAddr, deletion: f64) -> crate::core::wait::RemovalProgress {
        use crate::core::wait::RemovalProgress;
        if self.open.get(&(service.clone(), endpoint)).is_some_and(|o| o.pending.deletion == deletion) {
            return RemovalProgress::Open;
        }
        let (svc, ip) = (format!("{}/{}", service.namespace, service.name), endpoint.to_string());
        for (closed_at, r) in self.closed.iter().rev() {
            if *closed_at < deletion {
                break;
            }
            if r.deletion == deletion && r.endpoint == ip && r.service == svc {
                // closed with no node's observation: at its deadline, no node ever read it
                return match r.window() {
                    Some(Window::Observed(_)) => RemovalProgress::Removed,
                    Some(Window::AtLeast(_)) | None => RemovalProgress::Censored,
                };
            }
        }
        RemovalProgress::Gone
    }

    /// The window of the removal of `endpoint` from `service` after the deletion seen at
    /// `deletion`, once closed with every node's observation (None while open, censored, or not
    /// found), seconds. Searched like [`RemovalStore::progress`].
    pub fn closed_window(&self, service: &ServicePort, endpoint: IpAddr, deletion: f64) -> Option<f64> {
        let (svc, ip) = (format!("{}/{}", service.namespace, service.name), endpoint.to_string());
        let r = self
            .closed
            .iter()
            .rev()
            .take_while(|(at, _)| *at >= deletion)
            .map(|(_, r)| r)
            .find(|r| r.deletion == deletion && r.endpoint == ip && r.service == svc)?;
        match r.window()? {
            Window::Observed(w) => Some(w),
            Window::AtLeast(_) => None,
        }
    }

    /// Closes, at `now`, every open removal that each node of `nodes` (the agents answering
    /// now) and each node that reported on it before reports removed, and every one past its
    /// deadline: a node still holding the endpoint then is censored at the deadline (an agent
    /// that went silent after saying "held" keeps its removal open until then). Returns how
    /// many closed.
    pub fn close(&mut self, now: f64, nodes: &BTreeSet<String>) -> usize {
        let done: Vec<(ServicePort, IpAddr)> = self
            .open
            .iter()
            .filter(|(_, o)| {
                let removed = |n: &str| matches!(o.nodes.get(n), Some(NodeReport::Removed { .. } | NodeReport::Unread));
                let all_removed = !nodes.is_empty() && nodes.iter().all(|n| removed(n)) && o.nodes.keys().all(|n| removed(n));
                all_removed || now >= o.pending.deadline
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in &done {
            let Some(o) = self.open.remove(key) else { continue };
            let p = o.pending;
            let nodes: Vec<(String, NodeObservation)> = o
                .nodes
                .into_iter()
                .filter_map(|(n, r)| {
                    let obs = match r {
                        NodeReport::Removed { last_with, first_without } => NodeObservation::Removed { last_with, first_without },
                        NodeReport::Held { last_with } => NodeObservation::Censored { deadline: p.deadline, last_with },
                        NodeReport::Unread | NodeReport::NotYetRead => return None,
                    };
                    Some((n.to_string(), obs))
                })
                .collect();
            if nodes.is_empty() {
                self.unobserved += 1;
                continue;
            }
            if self.closed.len() >= MAX_CLOSED_REMOVALS {
                self.closed.pop_front();
            }
            let removal = Removal {
                service: format!("{}/{}", p.service.namespace, p.service.name),
                endpoint: p.endpoint.to_string(),
                pod: p.pod,
                deletion: p.deletion,
                sleep_seconds: p.sleep_seconds,
                nodes,
            };
            self.close_by_plane(now, &removal);
            self.closed.push_back((now, removal.compacted()));
            self.changes += 1;
        }
        if self.open.is_empty() {
            self.names.clear();
        }
        done.len()
    }

    /// `node`'s agent reads data plane `name`; a name not in [`DATA_PLANES`] is ignored (the node
    /// then counts in no data plane's tally). Bounded by the nodes that answer.
    pub fn set_data_plane(&mut self, node: &str, name: &str) {
        let Some(plane) = DATA_PLANES.iter().find(|p| **p == name) else { return };
        if self.data_planes.get(node) != Some(plane) {
            self.data_planes.insert(node.to_string(), plane);
            self.changes += 1;
        }
    }

    /// Files `removal` (all its nodes) under each data plane of its nodes, as that data plane's
    /// nodes alone saw it.
    fn close_by_plane(&mut self, now: f64, removal: &Removal) {
        let planes: BTreeSet<&'static str> = removal.nodes.iter().filter_map(|(n, _)| self.data_planes.get(n).copied()).collect();
        for plane in planes {
            let nodes = removal.nodes.iter().filter(|(n, _)| self.data_planes.get(n) == Some(&plane)).cloned().collect();
            let closed = self.closed_by_plane.entry(plane).or_default();
            if closed.len() >= MAX_CLOSED_REMOVALS {
                closed.pop_front();
            }
            // (the fields but the nodes: a removal of 5,000 nodes is not copied whole per plane)
            let view = Removal {
                service: removal.service.clone(),
                endpoint: removal.endpoint.clone(),
                pod: removal.pod.clone(),
                deletion: removal.deletion,
                sleep_seconds: removal.sleep_seconds,
                nodes,
            };
            closed.push_back((now, view.compacted()));
        }
    }

    /// Per data plane with removals closed within `window_seconds` before `now`: its nodes and
    /// their removals summarised ([`summarise`]), in [`DATA_PLANES`]' order. Made once per set of
    /// closed removals, then reused (as [`RemovalStore::summary`]).
    pub fn summary_by_data_plane(&mut self, now: f64, window_seconds: f64) -> Vec<DataPlaneSummary> {
        let nodes_of = |plane: &str| self.data_planes.values().filter(|p| **p == plane).count();
        let plane_within = |plane: &str| self.closed_by_plane.get(plane).map(|c| within(c, now, window_seconds));
        let key = (self.changes, DATA_PLANES.iter().map(|plane| plane_within(plane).map_or(0, Iterator::count)).collect::<Vec<_>>());
        if let Some((k, sums)) = &self.cached_by_plane
            && *k == key
        {
            return sums.clone();
        }
        let sums: Vec<DataPlaneSummary> = DATA_PLANES
            .iter()
            .zip(&key.1)
            .filter(|(_, within_count)| **within_count > 0)
            .filter_map(|(plane, _)| Some(DataPlaneSummary { data_plane: plane, nodes: nodes_of(plane), summary: summarise(plane_within(plane)?) }))
            .collect();
        self.cached_by_plane = Some((key, sums.clone()));
        sums
    }

    /// The removals closed within `window_seconds` before `now`, summarised ([`summarise`]).
    /// Made once per set of closed removals (a sort of up to [`MAX_CLOSED_REMOVALS`]), then reused.
    pub fn summary(&mut self, now: f64, window_seconds: f64) -> RemovalSummary {
        let key = (self.changes, within(&self.closed, now, window_seconds).count());
        if let Some((k, sum)) = &self.cached
            && *k == key
        {
            return sum.clone();
        }
        let sum = summarise(within(&self.closed, now, window_seconds));
        self.cached = Some((key, sum.clone()));
        sum
    }

    /// The Service `namespace/name` was deleted at `at` (unix seconds, the clock of the
    /// deletions): its open removals are dropped, not observed, and so are its closed ones whose
    /// pod was deleted within [`TEARDOWN_SECONDS`] before. Such endpoints leave the rules in the
    /// Service's own teardown (a namespace deleted: the namespace controller deletes its pods and
    /// its Service in one pass, seconds apart), which no client reaches through a live Service
    /// afterwards: a preStop sleep is not sized from them. Left in, a namespace deletion's
    /// removals raised W above every rollout's window (the experiment saw such removals take
    /// 5.7 s at 4,000 Services, where a rollout's took 2.1 s). Returns how many were dropped.
    pub fn forget_service(&mut self, namespace: &str, name: &str, at: f64) -> usize {
        let before = self.open.len();
        self.open.retain(|(s, _), _| !(s.namespace == namespace && s.name == name));
        let mut dropped = before - self.open.len();
        let service = format!("{namespace}/{name}");
        let torn_down = |r: &Removal| r.service == service && r.deletion >= at - TEARDOWN_SECONDS;
        let before = self.closed.len();
        self.closed.retain(|(_, r)| !torn_down(r));
        dropped += before - self.closed.len();
        for closed in self.closed_by_plane.values_mut() {
            closed.retain(|(_, r)| !torn_down(r));
        }
        self.changes += 1;
        self.service_gone += dropped as u64;
        dropped
    }

    /// Removals dropped because their Service was deleted ([`RemovalStore::forget_service`]), so
    /// far.
    pub fn service_gone(&self) -> u64 {
        self.service_gone
    }

    /// Removals open now.
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Open removals dropped past [`MAX_OPEN_REMOVALS`] so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Removals closed without any node's answer, or only unread ones, so far.
    pub fn unobserved(&self) -> u64 {
        self.unobserved
    }
}

/// The offset between an agent's clock and the operator's, from one request: the agent's clock
/// `agent_now` was read between `sent` and `received` on the operator's clock, so the offset is
/// known within half the round trip ([`ClockOffset::bound`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockOffset {
    /// Agent clock less operator clock at the round trip's middle, seconds.
    pub offset: f64,
    /// Half the round trip, seconds: how far the true offset may lie from `offset`.
    pub bound: f64,
}

impl ClockOffset {
    /// The offset of one request (`sent` <= `received`, operator unix seconds).
    pub fn of(agent_now: f64, sent: f64, received: f64) -> Self {
        let (sent, received) = (sent.min(received), received.max(sent));
        Self { offset: agent_now - (sent + received) / 2.0, bound: (received - sent) / 2.0 }
    }

    /// Agent time `t` on the operator's clock, taken as late as the bound allows (for the end
    /// of a removal's read bound: a window never reads short).
    pub fn late(&self, t: f64) -> f64 {
        t - self.offset + self.bound
    }

    /// Agent time `t` on the operator's clock, taken as early as the bound allows.
    pub fn early(&self, t: f64) -> f64 {
        t - self.offset - self.bound
    }
}

/// A TCP Service port `ns/<name>:http` on 10.96.0.10:80, for the observer's unit tests.
#[cfg(test)]
pub(crate) fn test_port(name: &str) -> ServicePort {
    ServicePort {
        namespace: "ns".into(),
        name: name.into(),
        port_name: "http".into(),
        protocol: "TCP".into(),
        cluster_ip: "10.96.0.10".parse().unwrap(),
        port: 80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removal(pod: &str, deletion: f64, sleep: Option<u32>, nodes: &[(&str, NodeObservation)]) -> Removal {
        Removal {
            service: "ns/web".into(),
            endpoint: "10.244.1.5".into(),
            pod: format!("ns/{pod}"),
            deletion,
            sleep_seconds: sleep,
            nodes: nodes.iter().map(|(n, o)| (n.to_string(), o.clone())).collect(),
        }
    }

    fn removed(first_without: f64) -> NodeObservation {
        NodeObservation::Removed { last_with: Some(first_without - 0.1), first_without }
    }

    #[test]
    fn the_window_is_the_slowest_node_and_censoring_wins() {
        let r = removal("a", 100.0, Some(3), &[("node-a", removed(101.2)), ("node-b", removed(100.4))]);
        assert_eq!(r.window(), Some(Window::Observed(1.2000000000000028)));
        let r = removal(
            "b",
            100.0,
            Some(3),
            &[("node-a", removed(101.2)), ("node-b", NodeObservation::Censored { deadline: 130.0, last_with: Some(130.0 - 0.1) })],
        );
        assert_eq!(r.window(), Some(Window::AtLeast(30.0)));
        let r =
            removal("c", 100.0, None, &[("node-a", removed(140.0)), ("node-b", NodeObservation::Censored { deadline: 130.0, last_with: Some(130.0 - 0.1) })]);
        assert_eq!(r.window(), Some(Window::AtLeast(40.0)), "a slower observed node raises the bound");
        assert_eq!(removal("d", 1.0, None, &[]).window(), None);
    }

    #[test]
    fn the_summary_counts_censored_removals_and_names_the_worst_miss() {
        let mut rs: Vec<Removal> = (0..98).map(|i| removal(&format!("p{i}"), 0.0, Some(3), &[("n", removed(1.0 + f64::from(i) / 100.0))])).collect();
        rs.push(removal("slow", 0.0, Some(3), &[("n", removed(3.5))]));
        rs.push(removal("stuck", 0.0, Some(10), &[("n", NodeObservation::Censored { deadline: 30.0, last_with: Some(30.0 - 0.1) })]));
        let s = summarise(&rs);
        assert_eq!((s.removals, s.censored, s.coverage_removals), (100, 1, 100));
        assert_eq!(s.p99_seconds, Some(3.5), "rank 99 of 100: the slowest observed");
        assert_eq!(s.p99_at_least_seconds, None);
        assert_eq!(s.coverage_ratio, Some(0.98));
        assert_eq!(s.worst_miss, Some(Miss { pod: "ns/stuck".into(), window_seconds: 30.0, sleep_seconds: 10, censored: true }));
        // with two censored the p99 rank falls on one: only a lower bound is known
        rs.push(removal("stuck2", 0.0, None, &[("n", NodeObservation::Censored { deadline: 20.0, last_with: Some(20.0 - 0.1) })]));
        let s = summarise(&rs);
        assert_eq!((s.p99_seconds, s.p99_at_least_seconds), (None, Some(20.0)));
        assert_eq!(s.coverage_removals, 100, "a pod without a sleep is not in the coverage");
        let empty = summarise(&[]);
        assert_eq!((empty.removals, empty.p99_seconds, empty.coverage_ratio, empty.worst_miss), (0, None, None, None));
    }

    #[test]
    fn a_sleep_equal_to_an_observed_window_covers_it_and_a_censored_one_does_not() {
        let rs = [
            removal("a", 0.0, Some(3), &[("n", removed(3.0))]),
            removal("b", 0.0, Some(3), &[("n", NodeObservation::Censored { deadline: 3.0, last_with: Some(3.0 - 0.1) })]),
        ];
        let s = summarise(&rs);
        assert_eq!(s.coverage_ratio, Some(0.5));
        assert_eq!(s.worst_miss.map(|m| m.pod), Some("ns/b".into()));
    }
    use super::test_port as port;

    fn pending(ip: &str, deletion: f64) -> PendingRemoval {
        PendingRemoval {
            service: port("web"),
            endpoint: ip.parse().unwrap(),
            pod: format!("ns/{ip}"),
            deletion,
            sleep_seconds: Some(3),
            deadline: deletion + 60.0,
        }
    }

    #[test]
    fn the_store_closes_a_removal_once_every_answering_node_dropped_it() {
        let mut s = RemovalStore::default();
        s.open(pending("10.244.1.2", 100.0));
        s.open(pending("10.244.1.2", 101.0));
        assert_eq!(s.open_count(), 1, "the same endpoint again keeps the earlier deletion");
        assert_eq!(s.watches(100.5).len(), 1);
        assert!((s.watches(100.5)[0].2 - 59.5).abs() < 1e-9);
        assert!((s.watches(100.5)[0].3 - 0.5).abs() < 1e-9, "the deletion's age, seconds");
        let ip: IpAddr = "10.244.1.2".parse().unwrap();
        let nodes: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        s.report("a", &port("web"), ip, NodeReport::Removed { last_with: Some(100.2), first_without: 100.4 });
        s.report("a", &port("web"), ip, NodeReport::Held { last_with: Some(100.0) });
        s.report("b", &port("web"), ip, NodeReport::Held { last_with: Some(100.0) });
        assert_eq!(s.close(100.5, &nodes), 0, "node b still holds it");
        let only_a: BTreeSet<String> = ["a".to_string()].into();
        assert_eq!(s.close(100.6, &only_a), 0, "b said held: its silence keeps the removal open");
        s.report("b", &port("web"), ip, NodeReport::Removed { last_with: Some(101.0), first_without: 101.25 });
        s.report("b", &port("web"), ip, NodeReport::Held { last_with: Some(100.0) });
        s.report("b", &port("other"), ip, NodeReport::Held { last_with: Some(100.0) });
        assert_eq!(s.close(101.3, &nodes), 1);
        let sum = s.summary(101.3, 300.0);
        assert_eq!((sum.removals, sum.censored, sum.coverage_ratio), (1, 0, Some(1.0)));
        assert_eq!(sum.p99_seconds, Some(1.25), "the slowest node, and a Removed report is never taken back by a later Held");
        assert_eq!(s.summary(500.0, 300.0).removals, 0, "outside the rolling window");
        // a removal closed after a summary is in the next one (not the one made before)
        s.open(pending("10.244.1.7", 500.0));
        s.report("a", &port("web"), "10.244.1.7".parse().unwrap(), NodeReport::Removed { last_with: Some(500.1), first_without: 500.2 });
        s.report("b", &port("web"), "10.244.1.7".parse().unwrap(), NodeReport::Removed { last_with: Some(500.1), first_without: 500.3 });
        assert_eq!(s.close(500.4, &nodes), 1);
        assert_eq!(s.summary(500.4, 300.0).removals, 1);
    }

    #[test]
    fn each_data_plane_is_summarised_from_its_own_nodes() {
        let mut s = RemovalStore::default();
        let nodes: BTreeSet<String> = ["a", "b", "c", "d"].iter().map(|n| n.to_string()).collect();
        s.set_data_plane("a", "iptables-nft");
        s.set_data_plane("b", "iptables-nft");
        s.set_data_plane("c", "cilium");
        s.set_data_plane("d", "ipvs-or-anything");
        for (i, deletion) in [100.0, 200.0].into_iter().enumerate() {
            let ip: IpAddr = format!("10.244.1.{i}").parse().unwrap();
            s.open(pending(&ip.to_string(), deletion));
            let at = |d: f64| NodeReport::Removed { last_with: Some(deletion + d - 0.05), first_without: deletion + d };
            s.report("a", &port("web"), ip, at(0.9));
            s.report("b", &port("web"), ip, at(1.4 + i as f64));
            s.report("c", &port("web"), ip, at(0.3));
            s.report("d", &port("web"), ip, at(5.0));
        }
        assert_eq!(s.close(300.0, &nodes), 2);
        let planes = s.summary_by_data_plane(300.0, 600.0);
        let got: Vec<(&str, usize, usize, Option<f64>)> = planes.iter().map(|p| (p.data_plane, p.nodes, p.summary.removals, p.summary.p99_seconds)).collect();
        // iptables-nft: node b is the slower of its two (1.4 s, 2.4 s); cilium: node c alone;
        // the node naming no known data plane is in no tally, but in the cluster's (5 s)
        assert_eq!(got, [("iptables-nft", 2, 2, Some(2.4000000000000057)), ("cilium", 1, 2, Some(0.30000000000001137))]);
        assert_eq!(s.summary(300.0, 600.0).p99_seconds, Some(5.0));
        assert_eq!(s.summary_by_data_plane(300.0, 600.0), planes, "the same closed removals: the same summaries");
        // one more removal closed: the cached summaries are not reused
        let ip: IpAddr = "10.244.1.9".parse().unwrap();
        s.open(pending("10.244.1.9", 250.0));
        s.report("c", &port("web"), ip, NodeReport::Removed { last_with: Some(250.1), first_without: 250.2 });
        assert_eq!(s.close(300.0, &["c".to_string()].into()), 1);
        assert_eq!(s.summary_by_data_plane(300.0, 600.0).iter().map(|p| p.summary.removals).collect::<Vec<_>>(), [2, 3]);
        assert!(s.summary_by_data_plane(1000.0, 600.0).is_empty(), "outside the rolling window");
    }

    #[test]
    fn past_its_deadline_a_held_node_is_censored_and_a_silent_removal_unobserved() {
        let mut s = RemovalStore::default();
        s.open(pending("10.244.1.2", 0.0));
        s.open(pending("10.244.1.3", 0.0));
        let nodes: BTreeSet<String> = ["a".to_string()].into();
        s.report("a", &port("web"), "10.244.1.2".parse().unwrap(), NodeReport::Held { last_with: Some(59.8) });
        assert_eq!(s.close(59.9, &nodes), 0);
        assert!(s.watches(60.0).is_empty(), "no watch past the deadline");
        assert_eq!(s.close(60.0, &nodes), 2);
        let sum = s.summary(60.0, 300.0);
        assert_eq!((sum.removals, sum.censored, sum.p99_at_least_seconds), (1, 1, Some(60.0)));
        assert_eq!(sum.worst_miss.clone().map(|m| (m.pod, m.censored)), Some(("ns/10.244.1.2".into(), true)));
        assert_eq!(s.unobserved(), 1);
        // a node whose reader never worked neither holds a removal open nor censors it
        let mut u = RemovalStore::default();
        u.open(pending("10.244.1.4", 0.0));
        let ip: IpAddr = "10.244.1.4".parse().unwrap();
        let both: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        u.report("a", &port("web"), ip, NodeReport::Unread);
        u.report("b", &port("web"), ip, NodeReport::Removed { last_with: Some(0.1), first_without: 0.3 });
        assert_eq!(u.close(0.4, &both), 1);
        let only = u.summary(0.4, 300.0);
        assert_eq!((only.removals, only.censored, only.p99_seconds), (1, 0, Some(0.3)));
        u.open(pending("10.244.1.4", 1.0));
        u.report("a", &port("web"), ip, NodeReport::Unread);
        assert_eq!((u.close(61.0, &both), u.unobserved()), (1, 1), "unread everywhere: unobserved, not censored");
        // an answer built before the node's first read holds the removal open (the node has not
        // looked yet), and is left out at the deadline
        u.open(pending("10.244.1.5", 100.0));
        let five: IpAddr = "10.244.1.5".parse().unwrap();
        u.report("a", &port("web"), five, NodeReport::NotYetRead);
        u.report("b", &port("web"), five, NodeReport::Removed { last_with: Some(100.1), first_without: 100.2 });
        assert_eq!(u.close(100.3, &both), 0, "a has not read yet");
        u.report("a", &port("web"), five, NodeReport::Held { last_with: Some(100.0) });
        u.report("a", &port("web"), five, NodeReport::NotYetRead);
        assert_eq!(u.close(160.0, &both), 1);
        let stale = u.summary(160.0, 300.0);
        assert_eq!(stale.censored, 1, "a said held, and a later answer before a read does not take that back");
        assert_eq!((stale.coarse, stale.p99_at_least_seconds), (1, None), "its last read holding it was 60 s before the deadline: censored, but coarse");
        assert_eq!((sum.p99(), sum.coverage_ratio), (Some((60.0, true)), Some(0.0)));
    }

    #[test]
    fn an_agents_times_are_moved_to_the_operators_clock_and_widened_by_half_the_round_trip() {
        // the agent's clock leads by 2 s; the request took 0.1 s
        let c = ClockOffset::of(1002.05, 1000.0, 1000.1);
        assert!((c.offset - 2.0).abs() < 1e-9 && (c.bound - 0.05).abs() < 1e-9);
        assert!((c.late(1003.0) - 1001.05).abs() < 1e-9);
        assert!((c.early(1003.0) - 1000.95).abs() < 1e-9);
        assert_eq!(ClockOffset::of(5.0, 2.0, 1.0).bound, 0.5, "a clock stepping back is taken as the longer trip");
    }

    #[test]
    fn coarsely_bounded_removals_are_counted_apart_from_the_p99_and_the_coverage() {
        let coarse = NodeObservation::Removed { last_with: Some(100.0), first_without: 107.0 };
        // no read held the endpoint: bounded from the deletion (at 100.0)
        let gone_at_first_read = NodeObservation::Removed { last_with: None, first_without: 100.3 };
        let first_read_late = NodeObservation::Removed { last_with: None, first_without: 101.2 };
        let rs = [
            removal("slow-reader", 100.0, Some(3), &[("a", removed(100.4)), ("b", coarse)]),
            removal("fast", 100.0, Some(3), &[("a", gone_at_first_read)]),
            removal("precise", 100.0, Some(3), &[("a", removed(100.8))]),
            removal("read-late", 100.0, Some(3), &[("a", first_read_late)]),
        ];
        assert_eq!(rs.iter().map(Removal::is_precise).collect::<Vec<_>>(), [false, true, true, false]);
        let s = summarise(&rs);
        assert_eq!((s.removals, s.coarse, s.coverage_removals), (4, 2, 2));
        assert!((s.p99_seconds.unwrap() - 0.8).abs() < 1e-9, "the p99 of the two precise ones: {s:?}");
        assert_eq!(s.worst_miss, None, "a 7 s bound says neither that the 3 s sleep missed nor that it covered");
    }

    #[test]
    fn open_removals_are_bounded() {
        let mut s = RemovalStore::default();
        for i in 0..MAX_OPEN_REMOVALS + 3 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0af4_0000 + i as u32));
            s.open(PendingRemoval { endpoint: ip, ..pending("10.0.0.1", i as f64) });
        }
        assert_eq!((s.open_count(), s.dropped()), (MAX_OPEN_REMOVALS, 3));
        assert!(s.watches(0.0).iter().all(|w| w.1 != IpAddr::from(std::net::Ipv4Addr::from(0x0af4_0000))), "the oldest went first");
    }

    proptest::proptest! {
        /// A closed removal keeps at most 3 nodes, and its window and precision are those of
        /// all its nodes.
        #[test]
        fn a_compacted_removal_keeps_its_window_and_precision(
            obs in proptest::collection::vec((0u8..4, 0.0f64..90.0, 0.0f64..8.0), 0..40),
        ) {
            let nodes: Vec<(String, NodeObservation)> = obs
                .iter()
                .enumerate()
                .map(|(i, &(kind, t, bound))| {
                    let o = match kind {
                        0 => NodeObservation::Removed { last_with: Some(100.0 + t - bound), first_without: 100.0 + t },
                        1 => NodeObservation::Removed { last_with: None, first_without: 100.0 + t },
                        2 => NodeObservation::Censored { deadline: 160.0 + t, last_with: Some(160.0 + t - bound) },
                        _ => NodeObservation::Censored { deadline: 160.0 + t, last_with: None },
                    };
                    (format!("node-{i}"), o)
                })
                .collect();
            let all = Removal { service: "ns/web".into(), endpoint: "10.244.1.5".into(), pod: "ns/a".into(), deletion: 100.0, sleep_seconds: Some(3), nodes };
            let small = all.clone().compacted();
            proptest::prop_assert!(small.nodes.len() <= 3);
            proptest::prop_assert_eq!(small.window(), all.window());
            proptest::prop_assert_eq!(small.is_precise(), all.is_precise());
        }
    }

    #[test]
    fn a_deleted_services_open_removals_are_dropped_not_observed() {
        let mut s = RemovalStore::default();
        let pending = |name: &str, ip: u32| PendingRemoval {
            service: ServicePort { name: name.into(), ..test_port("web") },
            endpoint: IpAddr::from(std::net::Ipv4Addr::from(ip)),
            pod: format!("ns/{name}-{ip}"),
            deletion: 100.0,
            sleep_seconds: Some(3),
            deadline: 160.0,
        };
        s.open(pending("web", 1));
        s.open(pending("web", 2));
        s.open(pending("api", 3));
        let ns = test_port("web").namespace;
        assert_eq!(s.forget_service(&ns, "web", 101.0), 2);
        assert_eq!(s.forget_service("other", "api", 101.0), 0, "another namespace's Service of that name");
        assert_eq!((s.open_count(), s.service_gone()), (1, 2));
        // nothing of them is ever closed or counted
        let nodes: BTreeSet<String> = ["a".to_string()].into();
        assert_eq!(s.close(200.0, &nodes), 1);
        assert_eq!(s.summary(200.0, 600.0).removals, 0, "the api removal had no node report: unobserved");
    }

    #[test]
    fn a_namespace_teardowns_closed_removals_leave_the_summaries_a_rollouts_stay() {
        let mut s = RemovalStore::default();
        s.set_data_plane("a", "nftables");
        let nodes: BTreeSet<String> = ["a".to_string()].into();
        // (Service, endpoint's last octet, deletion, window): web's rollout at 100 s, web's
        // teardown at 300 s (slower: its removals would set the p99), api's rollout at 300 s
        let removals = [("web", 1, 100.0, 0.5), ("web", 2, 100.0, 0.6), ("web", 3, 300.0, 5.7), ("web", 4, 301.0, 5.5), ("api", 5, 300.0, 0.4)];
        for (svc, ip, deletion, window) in removals {
            let port = ServicePort { name: svc.into(), ..test_port("web") };
            let ip = IpAddr::from(std::net::Ipv4Addr::new(10, 244, 1, ip));
            s.open(PendingRemoval {
                service: port.clone(),
                endpoint: ip,
                pod: format!("ns/{svc}-{ip}"),
                deletion,
                sleep_seconds: None,
                deadline: deletion + 60.0,
            });
            s.report("a", &port, ip, NodeReport::Removed { last_with: Some(deletion + window - 0.1), first_without: deletion + window });
        }
        assert_eq!(s.close(310.0, &nodes), 5);
        let ms = |p: Option<f64>| p.map(|p| (p * 1000.0).round() as u64);
        assert_eq!(ms(s.summary(310.0, 600.0).p99_seconds), Some(5700), "the teardown's removals would set it");
        let planes = s.summary_by_data_plane(310.0, 600.0);
        assert_eq!(planes[0].summary.removals, 5);
        // web is deleted at 305 s: the removals of its pods deleted from 245 s on go
        assert_eq!(s.forget_service("ns", "web", 305.0), 2);
        let sum = s.summary(310.0, 600.0);
        assert_eq!((sum.removals, ms(sum.p99_seconds)), (3, Some(600)), "web's rollout and api's removal stay");
        let planes = s.summary_by_data_plane(310.0, 600.0);
        assert_eq!((planes[0].summary.removals, ms(planes[0].summary.p99_seconds)), (3, Some(600)));
        assert_eq!(s.service_gone(), 2);
        // one removal dropped and another closed at the same instant: as many removals, the same
        // closing times, and yet another set; the summaries are made anew
        let port = ServicePort { name: "db".into(), ..test_port("web") };
        let ip = IpAddr::from(std::net::Ipv4Addr::new(10, 244, 1, 9));
        s.open(PendingRemoval { service: port.clone(), endpoint: ip, pod: "ns/db-0".into(), deletion: 300.0, sleep_seconds: None, deadline: 360.0 });
        s.report("a", &port, ip, NodeReport::Removed { last_with: Some(309.8), first_without: 309.9 });
        assert_eq!(s.forget_service("ns", "api", 310.0), 1);
        assert_eq!(s.close(310.0, &nodes), 1);
        let sum = s.summary(310.0, 600.0);
        assert_eq!((sum.removals, ms(sum.p99_seconds)), (3, Some(9900)), "db's 9.9 s removal in place of api's");
        assert_eq!(ms(s.summary_by_data_plane(310.0, 600.0)[0].summary.p99_seconds), Some(9900));
    }
}
