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
//! Times are unix seconds on the observing node's clock for the reads and on the operator's for
//! the deletion; the caller bounds the skew between them (see [`Removal::window`]).

use serde::Serialize;

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
    /// Still held (or never read successfully) at `deadline`, unix seconds: right-censored.
    Censored {
        /// When the node stopped waiting, unix seconds.
        deadline: f64,
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
    /// Per node: (node name, what its reads said).
    pub nodes: Vec<(String, NodeObservation)>,
}

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

impl Removal {
    /// The cluster's window of this removal: the slowest node's, `AtLeast` when any node is
    /// censored (the longest censored wait, or the slowest observed node if that is longer).
    /// `skew_seconds` bounds how far the nodes' clocks may lead the deletion's clock: each
    /// node's time is taken back by it, so skew never shortens a window below the truth. None
    /// without any node.
    pub fn window(&self, skew_seconds: f64) -> Option<Window> {
        let mut observed: Option<f64> = None;
        let mut censored: Option<f64> = None;
        for (_, o) in &self.nodes {
            match *o {
                NodeObservation::Removed { first_without, .. } => {
                    let w = (first_without + skew_seconds - self.deletion).max(0.0);
                    observed = Some(observed.map_or(w, |m| m.max(w)));
                }
                NodeObservation::Censored { deadline } => {
                    let w = (deadline - skew_seconds - self.deletion).max(0.0);
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
    /// The p99 of the windows, seconds: the smallest window with at least 99% of the removals
    /// at or below it, censored ones ranked above every observed one; None without removals, or
    /// when the rank falls on a censored removal (only a lower bound is known: see
    /// `p99_at_least_seconds`).
    pub p99_seconds: Option<f64>,
    /// When the p99's rank falls on a censored removal: the lower bound it is known to exceed.
    pub p99_at_least_seconds: Option<f64>,
    /// Removals of pods that had a sleep, and of them the share whose sleep covered the window
    /// (a censored window longer than the sleep is a miss); None without such a removal.
    pub coverage_ratio: Option<f64>,
    /// Removals counted in the coverage.
    pub coverage_removals: usize,
    /// The worst miss: the largest window less sleep among the misses.
    pub worst_miss: Option<Miss>,
}

/// Summarises `removals` with clock skew bounded by `skew_seconds` ([`Removal::window`]).
pub fn summarise(removals: &[Removal], skew_seconds: f64) -> RemovalSummary {
    let windows: Vec<(&Removal, Window)> = removals.iter().filter_map(|r| Some((r, r.window(skew_seconds)?))).collect();
    let censored = windows.iter().filter(|(_, w)| matches!(w, Window::AtLeast(_))).count();
    // observed ascending, then censored (ascending by their bound) above every observed one
    let mut ranked: Vec<Window> = windows.iter().map(|(_, w)| *w).collect();
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
    for (r, w) in &windows {
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
        p99_seconds,
        p99_at_least_seconds,
        coverage_ratio: (counted > 0).then(|| covered as f64 / counted as f64),
        coverage_removals: counted,
        worst_miss: worst,
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
        assert_eq!(r.window(0.0), Some(Window::Observed(1.2000000000000028)));
        // a node clock leading by up to 0.05 s: the window is taken as 0.05 s longer, never shorter
        assert!((r.window(0.05).unwrap().seconds() - 1.25).abs() < 1e-9);
        let r = removal("b", 100.0, Some(3), &[("node-a", removed(101.2)), ("node-b", NodeObservation::Censored { deadline: 130.0 })]);
        assert_eq!(r.window(0.0), Some(Window::AtLeast(30.0)));
        let r = removal("c", 100.0, None, &[("node-a", removed(140.0)), ("node-b", NodeObservation::Censored { deadline: 130.0 })]);
        assert_eq!(r.window(0.0), Some(Window::AtLeast(40.0)), "a slower observed node raises the bound");
        assert_eq!(removal("d", 1.0, None, &[]).window(0.0), None);
    }

    #[test]
    fn the_summary_counts_censored_removals_and_names_the_worst_miss() {
        let mut rs: Vec<Removal> = (0..98).map(|i| removal(&format!("p{i}"), 0.0, Some(3), &[("n", removed(1.0 + f64::from(i) / 100.0))])).collect();
        rs.push(removal("slow", 0.0, Some(3), &[("n", removed(3.5))]));
        rs.push(removal("stuck", 0.0, Some(10), &[("n", NodeObservation::Censored { deadline: 30.0 })]));
        let s = summarise(&rs, 0.0);
        assert_eq!((s.removals, s.censored, s.coverage_removals), (100, 1, 100));
        assert_eq!(s.p99_seconds, Some(3.5), "rank 99 of 100: the slowest observed");
        assert_eq!(s.p99_at_least_seconds, None);
        assert_eq!(s.coverage_ratio, Some(0.98));
        assert_eq!(s.worst_miss, Some(Miss { pod: "ns/stuck".into(), window_seconds: 30.0, sleep_seconds: 10, censored: true }));
        // with two censored the p99 rank falls on one: only a lower bound is known
        rs.push(removal("stuck2", 0.0, None, &[("n", NodeObservation::Censored { deadline: 20.0 })]));
        let s = summarise(&rs, 0.0);
        assert_eq!((s.p99_seconds, s.p99_at_least_seconds), (None, Some(20.0)));
        assert_eq!(s.coverage_removals, 100, "a pod without a sleep is not in the coverage");
        let empty = summarise(&[], 0.0);
        assert_eq!((empty.removals, empty.p99_seconds, empty.coverage_ratio, empty.worst_miss), (0, None, None, None));
    }

    #[test]
    fn a_sleep_equal_to_an_observed_window_covers_it_and_a_censored_one_does_not() {
        let rs = [removal("a", 0.0, Some(3), &[("n", removed(3.0))]), removal("b", 0.0, Some(3), &[("n", NodeObservation::Censored { deadline: 3.0 })])];
        let s = summarise(&rs, 0.0);
        assert_eq!(s.coverage_ratio, Some(0.5));
        assert_eq!(s.worst_miss.map(|m| m.pod), Some("ns/b".into()));
    }
}
