//! The control plane's part of a deletion's propagation window: from the pod's DELETE to its
//! endpoint turning terminating (or leaving its EndpointSlice), as one watcher sees both. Pure:
//! the adapter (`controller::service_index`) feeds it watch events with its own clock's times.
//!
//! A deletion's window runs from the DELETE to the moment a node stops sending new connections
//! to the pod: (1) the EndpointSlice controller marks the endpoint terminating, (2) the API
//! server and the watch deliver the change, (3) kube-proxy's runner and sync write the rules.
//! kube-proxy's histograms measure step 3 only ([`crate::core::window_distribution`]); network
//! programming latency covers steps 1-2 for pods turning Ready, never for deletions (the
//! EndpointSlice trigger time is not computed for deletions: k8s.io/endpointslice
//! `util/trigger_time_tracker.go`).
//! This module measures steps 1-2 for every deletion: the lag between a pod watch's first event
//! with `deletionTimestamp` set and an EndpointSlice watch's first event that shows the pod's
//! endpoint terminating or gone. Both times come from the same clock, so no skew enters; the
//! watcher's own delivery delay enters both and cancels to first order. (`deletionTimestamp`
//! minus `deletionGracePeriodSeconds` would name the DELETE without a pod watch, but in whole
//! seconds: `metav1.Time` is serialised to the second, a 1 s error on a 0.1 s lag.)
//!
//! [`LagDistribution`] composes the lag with a node's kube-proxy window by convolution:
//! `P(L + K <= x) = sum_j w_j P(K <= x - l_j)`, exact when the two are independent (a
//! deletion's lag does not know the phase of kube-proxy's runner it lands in). A sum of the two
//! p99s would add two tails that rarely meet.

use std::collections::{HashMap, VecDeque};

/// The finest lag resolution kept, seconds: lags are rounded UP to a multiple of it (so the
/// composed window never reads below the observed one).
pub const LAG_RESOLUTION_SECONDS: f64 = 0.005;
/// At most this many distinct lag values enter a composition (the resolution doubles until they
/// fit): each one costs one evaluation of the kube-proxy window's CDF per quantile step, so the
/// composition costs a node's analysis at most about this many times more (docs/benchmarks/sizing.md "The
/// control plane's part of a deletion").
pub const MAX_LAG_POINTS: usize = 16;
/// Lag samples kept at most (the oldest go first), whatever the rolling window: 16 bytes each.
pub const MAX_LAG_SAMPLES: usize = 20_000;
/// Deletions awaiting their endpoint change, at most (the oldest go first when more pods are
/// deleted at once; a deletion dropped this way is not a sample). 100 bytes or so each.
pub const MAX_PENDING_DELETIONS: usize = 50_000;
/// A pending deletion whose endpoint change was not seen within this long is dropped: a pod
/// backing no Service has no endpoint to wait for, seconds.
pub const PENDING_TTL_SECONDS: f64 = 600.0;

/// The empirical distribution of the control-plane lag over a rolling window, compressed to at
/// most [`MAX_LAG_POINTS`] point masses. Seconds throughout.
#[derive(Debug, Clone, PartialEq)]
pub struct LagDistribution {
    /// `(lag, weight)`, lags ascending, weights summing to 1.
    points: Vec<(f64, f64)>,
    /// Samples it was built from.
    samples: u32,
    /// The p99 of the samples themselves (the smallest sample with at least 99% at or below).
    p99_seconds: f64,
    /// The longest lag.
    max_seconds: f64,
}

impl LagDistribution {
    /// From lag samples, seconds; a negative or non-finite one counts as 0 (the endpoint change
    /// seen before the pod's: the two watches are separate streams). None without samples.
    pub fn from_samples(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted: Vec<f64> = samples.iter().map(|&l| if l.is_finite() { l.max(0.0) } else { 0.0 }).collect();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
        let mut resolution = LAG_RESOLUTION_SECONDS;
        let points = loop {
            let mut points: Vec<(f64, f64)> = Vec::new();
            for &l in &sorted {
                let at = (l / resolution).ceil() * resolution;
                match points.last_mut() {
                    Some(p) if (p.0 - at).abs() < resolution / 2.0 => p.1 += 1.0,
                    _ => points.push((at, 1.0)),
                }
            }
            if points.len() <= MAX_LAG_POINTS {
                break points;
            }
            resolution *= 2.0;
        };
        let points = points.into_iter().map(|(l, c)| (l, c / n as f64)).collect();
        Some(Self { points, samples: u32::try_from(n).unwrap_or(u32::MAX), p99_seconds: sorted[rank - 1], max_seconds: sorted[n - 1] })
    }

    /// Samples it was built from.
    pub fn samples(&self) -> u32 {
        self.samples
    }

    /// The lags' own p99, seconds.
    pub fn p99_seconds(&self) -> f64 {
        self.p99_seconds
    }

    /// The longest lag, seconds.
    pub fn max_seconds(&self) -> f64 {
        self.max_seconds
    }

    fn min_point(&self) -> f64 {
        self.points.first().map_or(0.0, |p| p.0)
    }

    fn max_point(&self) -> f64 {
        self.points.last().map_or(0.0, |p| p.0)
    }

    /// `P(L + K <= x)` for a K whose CDF is `cdf_k`.
    pub fn cdf_of_sum(&self, x: f64, cdf_k: impl Fn(f64) -> f64) -> f64 {
        self.points.iter().map(|&(l, w)| w * cdf_k(x - l)).sum::<f64>().clamp(0.0, 1.0)
    }

    /// The `q` quantile of `L + K`, seconds, for a K whose CDF is `cdf_k` and whose own `q`
    /// quantile is `k_quantile`: the answer lies in `[k_quantile + min L, k_quantile + max L]`
    /// (at `k_quantile + max L` every term's CDF is at least q; below `k_quantile + min L` none
    /// is). Searched by regula falsi with the Illinois step (a few CDF evaluations where
    /// bisection needs ten) until the bracket is 1 ms wide, at most 40 steps; the upper end is
    /// returned, so the answer never reads below the quantile. NaN when `q` or `k_quantile` is
    /// NaN.
    pub fn quantile_of_sum(&self, q: f64, k_quantile: f64, cdf_k: impl Fn(f64) -> f64) -> f64 {
        if q.is_nan() || !k_quantile.is_finite() {
            return if k_quantile.is_infinite() { k_quantile } else { f64::NAN };
        }
        let q = q.clamp(0.0, 1.0);
        let (mut lo, mut hi) = (k_quantile + self.min_point(), k_quantile + self.max_point());
        // g(x) = P(L + K <= x) - q: below 0 under the quantile, at least 0 from it on
        let g = |x: f64| self.cdf_of_sum(x, &cdf_k) - q;
        let (mut g_lo, mut g_hi) = (g(lo), g(hi));
        if g_lo >= 0.0 {
            return lo;
        }
        let mut side = 0i8;
        for _ in 0..40 {
            if hi - lo <= 1e-3 {
                break;
            }
            // the secant's root, kept 1% of the bracket inside it, else the midpoint
            let secant = if g_hi > g_lo { lo - g_lo * (hi - lo) / (g_hi - g_lo) } else { f64::NAN };
            let margin = (hi - lo) * 0.01;
            let x = if secant.is_finite() { secant.clamp(lo + margin, hi - margin) } else { (lo + hi) / 2.0 };
            let gx = g(x);
            if gx >= 0.0 {
                (hi, g_hi) = (x, gx);
                if side == 1 {
                    g_lo /= 2.0;
                }
                side = 1;
            } else {
                (lo, g_lo) = (x, gx);
                if side == -1 {
                    g_hi /= 2.0;
                }
                side = -1;
            }
        }
        hi
    }
}

/// One lag sample: when the endpoint change was seen (unix seconds) and the lag, seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LagSample {
    /// When the endpoint change was seen, unix seconds.
    pub at_unix_seconds: f64,
    /// The lag, seconds.
    pub lag_seconds: f64,
}

#[derive(Debug, Clone)]
struct Pending {
    namespace: String,
    /// The pod's name and its injected preStop sleep (its annotation), for observed removals.
    pod_name: String,
    sleep_seconds: Option<u32>,
    /// The endpoint's address, as a slice last listed it.
    address: Option<std::net::IpAddr>,
    /// When the pod's deletion was first seen, unix seconds.
    deleting_at: f64,
    /// The EndpointSlices that listed the pod's endpoint not terminating since its deletion was
    /// seen: the endpoint leaving one of them is the change.
    listed_in: Vec<String>,
    /// The endpoint change was seen (the sample is taken): kept until the pod is gone or the
    /// TTL ends, so that the pod's later events (each status update while it terminates shows
    /// `deletionTimestamp` again) are not taken for a new deletion.
    joined: bool,
}

/// A deletion joined with its endpoint change.
#[derive(Debug, Clone, PartialEq)]
pub struct Joined {
    /// The pod's UID.
    pub pod_uid: String,
    /// Its namespace.
    pub namespace: String,
    /// The lag, seconds (0 when the endpoint change was seen first).
    pub lag_seconds: f64,
    /// `terminating` or `left its EndpointSlice`.
    pub how: &'static str,
    /// The pod's name ("" when not given).
    pub pod_name: String,
    /// Its injected preStop sleep, seconds.
    pub sleep_seconds: Option<u32>,
    /// When its deletion was first seen, unix seconds.
    pub deleting_at: f64,
    /// The endpoint's address as a slice last listed it (None when no slice gave one).
    pub address: Option<std::net::IpAddr>,
}

/// One endpoint of an EndpointSlice as the tracker reads it: the pod's UID (`targetRef.uid`)
/// and whether it is terminating (`conditions.terminating`).
#[derive(Debug, Clone, PartialEq)]
pub struct SliceEndpoint {
    /// `targetRef.uid`.
    pub pod_uid: String,
    /// `conditions.terminating == true`.
    pub terminating: bool,
    /// Its first address.
    pub address: Option<std::net::IpAddr>,
}

/// Joins pod deletions with their endpoint changes and keeps the lags of a rolling window.
/// Bounded: at most [`MAX_PENDING_DELETIONS`] pending deletions for at most
/// [`PENDING_TTL_SECONDS`] each, and [`MAX_LAG_SAMPLES`] samples.
#[derive(Debug, Default)]
pub struct DeletionLags {
    /// pod UID -> its pending deletion.
    pending: HashMap<String, Pending>,
    /// pod UIDs in the order their deletion was seen (for the bounds; may hold UIDs no longer
    /// pending).
    order: VecDeque<(String, f64)>,
    samples: VecDeque<LagSample>,
    /// Deletions whose endpoint change never came within the TTL or the bound.
    dropped: u64,
    /// When the pod watch last went live (its list done), unix seconds.
    live_since: Option<f64>,
    /// The last distribution and the samples it was built from (how many, the first's and the
    /// last's time): every policy's reconcile asks for it, and it changes only with the samples.
    cached: Option<((usize, f64, f64), LagDistribution)>,
}

/// How long after the pod watch goes live its events may be replays of what happened while it
/// was not, seconds: a watch resumes from its list's resourceVersion, so a deletion made between
/// that list and the watch's start arrives as a new event, late.
pub const REPLAY_WINDOW_SECONDS: f64 = 10.0;

impl DeletionLags {
    /// The pod watch went live at `at` (its list done).
    pub fn watch_live(&mut self, at: f64) {
        self.live_since = Some(at);
    }

    /// A deletion seen at `at` that the API server stamped at `deleted_at` (`deletionTimestamp`
    /// less `deletionGracePeriodSeconds`, unix seconds, whole seconds) happened before the watch
    /// went live: seen within [`REPLAY_WINDOW_SECONDS`] of it, and stamped a second or more
    /// before it (a whole second for the stamp's rounding). Timed from its sighting, such a
    /// deletion reads short (a removal before it seen as a window of 0), so it is left out, as a
    /// pod listed already deleting is. Beyond the window the check is off: an operator's clock
    /// ahead of the API server's must not drop every deletion.
    pub fn predates_watch(&self, deleted_at: f64, at: f64) -> bool {
        self.live_since.is_some_and(|live| at < live + REPLAY_WINDOW_SECONDS && deleted_at <= live - 1.0)
    }

    /// A pod's metadata was seen with `deletionTimestamp` set at `at` (unix seconds). Only the
    /// first sighting counts; a pod already deleting when the watch listed it must not be given
    /// (its DELETE was before the watcher existed: left-censored).
    /// The pod's `name` and its injected preStop sleep go on with the joined deletion (observed
    /// removals count each pod's coverage with them).
    pub fn pod_deleting(&mut self, uid: &str, namespace: &str, name: &str, sleep_seconds: Option<u32>, at: f64) {
        if uid.is_empty() || self.pending.contains_key(uid) {
            return;
        }
        self.expire(at);
        while self.pending.len() >= MAX_PENDING_DELETIONS {
            let Some((old, _)) = self.order.pop_front() else { break };
            if self.pending.remove(&old).is_some() {
                self.dropped += 1;
            }
        }
        self.pending.insert(
            uid.to_string(),
            Pending {
                namespace: namespace.to_string(),
                pod_name: name.to_string(),
                sleep_seconds,
                address: None,
                deleting_at: at,
                listed_in: Vec::new(),
                joined: false,
            },
        );
        self.order.push_back((uid.to_string(), at));
    }

    /// The pod object is gone: forgotten, unless a slice still lists its endpoint (its next
    /// event, without it, is the change [`DeletionLags::slice`] joins).
    pub fn pod_gone(&mut self, uid: &str) {
        if let Some(p) = self.pending.get(uid)
            && (p.joined || p.listed_in.is_empty())
        {
            self.pending.remove(uid);
        }
    }

    /// An EndpointSlice `name` in `namespace` was seen at `at` (unix seconds) with `endpoints`;
    /// returns the deletions it completes. A pending pod whose endpoint is terminating here, or
    /// gone from a slice that listed it not terminating after its deletion, gives one sample.
    pub fn slice(&mut self, namespace: &str, name: &str, endpoints: &[SliceEndpoint], at: f64) -> Vec<Joined> {
        if self.pending() == 0 {
            return Vec::new();
        }
        let mut done: Vec<(String, &'static str)> = Vec::new();
        for (uid, p) in self.pending.iter_mut().filter(|(_, p)| !p.joined && p.namespace == namespace) {
            let listed = endpoints.iter().find(|e| &e.pod_uid == uid);
            if let Some(a) = listed.and_then(|e| e.address) {
                p.address = Some(a);
            }
            match listed {
                Some(e) if e.terminating => done.push((uid.clone(), "terminating")),
                Some(_) if !p.listed_in.iter().any(|s| s == name) => p.listed_in.push(name.to_string()),
                Some(_) => {}
                None if p.listed_in.iter().any(|s| s == name) => done.push((uid.clone(), "left its EndpointSlice")),
                None => {}
            }
        }
        let joined: Vec<Joined> = done
            .into_iter()
            .filter_map(|(uid, how)| {
                let p = self.pending.get_mut(&uid)?;
                p.joined = true;
                p.listed_in.clear();
                Some(Joined {
                    pod_uid: uid,
                    namespace: p.namespace.clone(),
                    lag_seconds: (at - p.deleting_at).max(0.0),
                    how,
                    pod_name: p.pod_name.clone(),
                    sleep_seconds: p.sleep_seconds,
                    deleting_at: p.deleting_at,
                    address: p.address,
                })
            })
            .collect();
        for j in &joined {
            if self.samples.len() >= MAX_LAG_SAMPLES {
                self.samples.pop_front();
            }
            self.samples.push_back(LagSample { at_unix_seconds: at, lag_seconds: j.lag_seconds });
        }
        joined
    }

    /// A slice that disappeared (its Service deleted, or the EndpointSlice controller merged
    /// it away): no sample. With its Service gone the endpoint's removal is not a propagation
    /// of the pod's deletion (a namespace being deleted takes Services, slices and pods in an
    /// order of its own); its pending pods no longer wait on it.
    pub fn slice_deleted(&mut self, namespace: &str, name: &str) {
        for p in self.pending.values_mut().filter(|p| p.namespace == namespace) {
            p.listed_in.retain(|s| s != name);
        }
    }

    /// Drops pending deletions older than [`PENDING_TTL_SECONDS`] at `now`.
    fn expire(&mut self, now: f64) {
        while let Some((uid, at)) = self.order.front() {
            if now - at <= PENDING_TTL_SECONDS && self.order.len() <= 2 * MAX_PENDING_DELETIONS {
                break;
            }
            if self.pending.get(uid).is_some_and(|p| p.deleting_at == *at) {
                self.pending.remove(uid);
                self.dropped += 1;
            }
            self.order.pop_front();
        }
    }

    /// The lags seen within `window_seconds` before `now`, as a distribution; None without any.
    /// Built once per set of samples (a sort of up to [`MAX_LAG_SAMPLES`]), then reused.
    pub fn distribution(&mut self, now: f64, window_seconds: f64) -> Option<LagDistribution> {
        let within: Vec<&LagSample> = self.samples.iter().filter(|s| now - s.at_unix_seconds <= window_seconds).collect();
        let key = (within.len(), within.first()?.at_unix_seconds, within.last()?.at_unix_seconds);
        if let Some((k, d)) = &self.cached
            && *k == key
        {
            return Some(d.clone());
        }
        let d = LagDistribution::from_samples(&within.iter().map(|s| s.lag_seconds).collect::<Vec<_>>())?;
        self.cached = Some((key, d.clone()));
        Some(d)
    }

    /// When the deletion of the pod `uid` was first seen (unix seconds) and whether it was
    /// joined with its endpoint change; None when no deletion of it is held (not seen, or the
    /// pod gone, or past [`PENDING_TTL_SECONDS`]).
    pub fn deletion_of(&self, uid: &str) -> Option<(f64, bool)> {
        self.pending.get(uid).map(|p| (p.deleting_at, p.joined))
    }

    /// Deletions waiting for their endpoint change now.
    pub fn pending(&self) -> usize {
        self.pending.values().filter(|p| !p.joined).count()
    }

    /// Deletions dropped unjoined (TTL or bound) so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Forgets everything pending (a watch restarted: what it missed cannot be joined).
    pub fn reset_pending(&mut self) {
        self.pending.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(uid: &str, terminating: bool) -> SliceEndpoint {
        SliceEndpoint { pod_uid: uid.into(), terminating, address: Some("10.244.1.9".parse().unwrap()) }
    }

    #[test]
    fn a_terminating_endpoint_completes_its_deletion() {
        let mut d = DeletionLags::default();
        d.pod_deleting("u1", "ns", "", None, 100.0);
        d.pod_deleting("u1", "ns", "", None, 100.5); // a later event of the same deletion
        assert!(d.slice("other", "s", &[ep("u1", true)], 100.2).is_empty(), "another namespace");
        assert!(d.slice("ns", "s", &[ep("u1", false)], 100.05).is_empty(), "still serving");
        let lags = d.slice("ns", "s", &[ep("u1", true), ep("u2", false)], 100.125);
        assert_eq!(lags.len(), 1);
        assert!((lags[0].lag_seconds - 0.125).abs() < 1e-9);
        assert_eq!((lags[0].pod_uid.as_str(), lags[0].how), ("u1", "terminating"));
        assert_eq!(d.pending(), 0);
        // the terminating pod's later status updates show deletionTimestamp again
        d.pod_deleting("u1", "ns", "", None, 101.5);
        assert!(d.slice("ns", "s", &[ep("u1", true)], 101.6).is_empty(), "one sample per deletion");
        d.pod_gone("u1");
        assert!(d.pending.is_empty(), "forgotten once gone");
        let dist = d.distribution(101.0, 60.0).unwrap();
        assert_eq!(dist.samples(), 1);
        assert!((dist.max_seconds() - 0.125).abs() < 1e-9);
        // a new sample is seen by the next distribution (not the cached one)
        d.pod_deleting("u3", "ns", "", None, 101.0);
        d.slice("ns", "s", &[ep("u3", true)], 101.5);
        let dist = d.distribution(102.0, 60.0).unwrap();
        assert_eq!((dist.samples(), dist.max_seconds()), (2, 0.5));
        assert!(d.distribution(200.0, 60.0).is_none(), "outside the rolling window");
    }

    #[test]
    fn an_endpoint_leaving_a_slice_that_listed_it_completes_its_deletion() {
        let mut d = DeletionLags::default();
        d.pod_deleting("u1", "ns", "web-1", Some(3), 10.0);
        assert!(d.slice("ns", "b", &[ep("u2", false)], 10.01).is_empty(), "never listed in b");
        assert!(d.slice("ns", "a", &[ep("u1", false)], 10.02).is_empty());
        let lags = d.slice("ns", "a", &[ep("u2", false)], 10.3);
        assert_eq!(lags.len(), 1);
        assert!((lags[0].lag_seconds - 0.3).abs() < 1e-9);
        assert_eq!(lags[0].how, "left its EndpointSlice");
        // the address the slice last listed, with the pod's name and sleep, for the observer
        assert_eq!((lags[0].pod_name.as_str(), lags[0].sleep_seconds, lags[0].deleting_at), ("web-1", Some(3), 10.0));
        assert_eq!(lags[0].address, Some("10.244.1.9".parse().unwrap()));
    }

    /// A namespace being deleted takes the Service's slices with its pods: the endpoint gone
    /// with its slice is no sample.
    #[test]
    fn a_deleted_slice_gives_no_sample() {
        let mut d = DeletionLags::default();
        d.pod_deleting("u1", "ns", "", None, 10.0);
        assert!(d.slice("ns", "a", &[ep("u1", false)], 10.02).is_empty());
        d.slice_deleted("ns", "a");
        assert!(d.slice("ns", "a", &[], 11.0).is_empty(), "a slice of the same name made again never listed it");
        assert!(d.distribution(11.0, 60.0).is_none());
        assert_eq!(d.pending(), 1, "still pending (another slice may show it terminating) until the pod is gone or the TTL ends");
        d.pod_gone("u1");
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn an_endpoint_seen_terminating_before_the_pod_event_counts_zero() {
        let mut d = DeletionLags::default();
        d.pod_deleting("u1", "ns", "", None, 10.0);
        assert_eq!(d.slice("ns", "a", &[ep("u1", true)], 9.9)[0].lag_seconds, 0.0);
    }

    #[test]
    fn a_deletion_replayed_when_the_watch_went_live_is_left_out() {
        let mut d = DeletionLags::default();
        assert!(!d.predates_watch(90.0, 100.0), "before the watch is live nothing is judged");
        d.watch_live(100.0);
        assert!(d.predates_watch(98.0, 100.4), "stamped 2 s before the watch went live, seen 0.4 s after");
        assert!(!d.predates_watch(99.5, 100.4), "within the stamp's rounding: kept");
        assert!(!d.predates_watch(100.0, 100.4), "after the watch went live: kept");
        assert!(!d.predates_watch(50.0, 111.0), "past the replay window the check is off (a skewed clock must not drop every deletion)");
    }

    #[test]
    fn pending_deletions_are_bounded_in_time_and_number() {
        let mut d = DeletionLags::default();
        d.pod_deleting("old", "ns", "", None, 0.0);
        d.pod_deleting("new", "ns", "", None, PENDING_TTL_SECONDS + 1.0);
        assert_eq!(d.pending(), 1, "the old one expired");
        assert_eq!(d.dropped(), 1);
        for i in 0..MAX_PENDING_DELETIONS + 10 {
            d.pod_deleting(&format!("p{i}"), "ns", "", None, PENDING_TTL_SECONDS + 2.0);
        }
        assert_eq!(d.pending(), MAX_PENDING_DELETIONS);
        d.pod_gone("p49999");
        assert_eq!(d.pending(), MAX_PENDING_DELETIONS - 1, "gone without a slice listing it");
    }

    #[test]
    fn samples_are_bounded() {
        let mut d = DeletionLags::default();
        for i in 0..MAX_LAG_SAMPLES + 5 {
            let uid = format!("u{i}");
            d.pod_deleting(&uid, "ns", "", None, i as f64);
            d.slice("ns", "s", &[ep(&uid, true)], i as f64 + 0.1);
        }
        assert_eq!(d.distribution(1e9, 1e10).unwrap().samples() as usize, MAX_LAG_SAMPLES);
    }

    #[test]
    fn the_distribution_rounds_up_and_keeps_at_most_16_points() {
        let dist = LagDistribution::from_samples(&[0.101, 0.102, -1.0, f64::NAN]).unwrap();
        assert_eq!(dist.points, vec![(0.0, 0.5), (0.105, 0.5)]);
        assert_eq!(dist.p99_seconds(), 0.102);
        let many: Vec<f64> = (0..1000).map(|i| f64::from(i) * 0.01).collect();
        let dist = LagDistribution::from_samples(&many).unwrap();
        assert!(dist.points.len() <= MAX_LAG_POINTS, "{}", dist.points.len());
        assert!((dist.points.iter().map(|p| p.1).sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(dist.max_point() >= 9.99, "rounded up, never down: {}", dist.max_point());
        assert_eq!(dist.p99_seconds(), 9.89);
        assert!(LagDistribution::from_samples(&[]).is_none());
    }

    /// The convolution against a closed form: L uniform over {0.1, 0.2} s and K uniform on
    /// [0, 1] s give `P(L + K <= x) = (min(x - 0.1, 1) + min(x - 0.2, 1)) / 2` for x >= 0.2,
    /// which is 0.99 at x = 1.18 (the first term is 1 from 1.1 on, the second 0.98).
    #[test]
    fn the_quantile_of_the_sum_is_the_convolution() {
        let dist = LagDistribution::from_samples(&[0.1, 0.2]).unwrap();
        let uniform = |x: f64| x.clamp(0.0, 1.0);
        let q = dist.quantile_of_sum(0.99, 0.99, uniform);
        assert!((q - 1.18).abs() <= 1.1e-3, "{q}");
        // a sum of p99s (0.99 + 0.2) overstates; K's p99 alone understates
        assert!(q < 0.99 + 0.2 && q > 0.99);
        assert!((dist.cdf_of_sum(1.15, uniform) - 0.975).abs() < 1e-12);
        assert!(dist.quantile_of_sum(f64::NAN, 1.0, uniform).is_nan());
        assert_eq!(dist.quantile_of_sum(0.99, f64::INFINITY, uniform), f64::INFINITY);
    }
}
