//! The distribution of a deleted endpoint's window on one node, from kube-proxy's sync duration
//! histogram and its minSyncPeriod: how long after the change reaches kube-proxy the endpoint is
//! still in the node's rules. Pure maths, no I/O.
//!
//! kube-proxy's runner (`pkg/proxy/runner/bounded_frequency_runner.go`, 1.37.2) keeps
//! `minSyncPeriod` (m) between the *completion* of one sync and the *start* of the next, and a
//! sync reads the pending changes when it starts. While changes keep coming (a rolling update),
//! the runner cycles: a sync of duration S, a gap of m, the next sync. A removal that arrives
//! at a random moment of that cycle waits
//! - during a gap (probability m / (E[S] + m)): the rest of the gap, uniform on [0, m], then its
//!   own sync S';
//! - during a sync (probability E[S] / (E[S] + m)): the rest of that sync R, then m, then S'.
//!
//! The sync it lands in is length-biased (a long sync is hit more often), and the rest of it has
//! the residual-life density `(1 - F(t)) / E[S]` of renewal theory. S and S' are independent
//! draws of the sync histogram, whose observations are taken as spread evenly inside each
//! bucket. The window is the wait plus S'; [`DeletionWindow::quantile`] gives its p99, W.
//!
//! This is the busy runner: an idle kube-proxy starts the sync at once (window S' alone), so
//! the model is an upper bound of the idle case. Its extremes are S' (a change just before a sync
//! starts) and `max(S) + m + max(S)`; `minSyncPeriod + 2 x p99(sync)` counts two p99 syncs for
//! every removal and, on real nodes at 4,000 Services, stood 1.6 to 1.9 x above every window
//! (docs/benchmarks/sizing.md "Native histograms and the per-pod truth").

use crate::core::exposition::histogram::Histogram;
use crate::core::exposition::native::NativeHistogram;

/// Points taken inside each bucket of S' when the window's CDF is evaluated (midpoint rule).
const POINTS_PER_BUCKET: usize = 8;
/// The quantile search stops once the bracket is this narrow, seconds.
const QUANTILE_RESOLUTION_SECONDS: f64 = 1e-6;

/// Sync durations as a piecewise-uniform distribution, seconds: each bucket's observations
/// spread evenly over its `(lower, upper]`, a bucket with `lower == upper` a point mass.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncDurations {
    /// `(lower, upper, probability)`, ascending and disjoint, probabilities summing to 1.
    buckets: Vec<(f64, f64, f64)>,
    /// Knots of the CDF F: `(x, F just below x, F at x)`; F is linear between knots.
    knots: Vec<(f64, f64, f64)>,
    /// `∫_0^x (1 - F(t)) dt` at each knot.
    survival_integral: Vec<f64>,
}

impl SyncDurations {
    /// From `(lower, upper, count)` buckets in seconds. Buckets with a count that is not a
    /// positive finite number are dropped, negative bounds are raised to 0 (a duration is never
    /// negative), overlapping buckets are refused. `None` when no observation is left.
    pub fn from_ranges(ranges: impl IntoIterator<Item = (f64, f64, f64)>) -> Option<Self> {
        let mut buckets: Vec<(f64, f64, f64)> = ranges
            .into_iter()
            .filter(|&(lo, hi, c)| c.is_finite() && c > 0.0 && lo.is_finite() && hi.is_finite() && lo <= hi)
            .map(|(lo, hi, c)| (lo.max(0.0), hi.max(0.0), c))
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        if buckets.windows(2).any(|w| w[1].0 < w[0].1) {
            return None;
        }
        let total: f64 = buckets.iter().map(|b| b.2).sum();
        if !(total.is_finite() && total > 0.0) {
            return None;
        }
        for b in &mut buckets {
            b.2 /= total;
        }
        let mut knots: Vec<(f64, f64, f64)> = vec![(0.0, 0.0, 0.0)];
        let mut cum = 0.0;
        for &(lo, hi, p) in &buckets {
            let before = cum;
            cum = (cum + p).min(1.0);
            let mut knot = |x: f64, left: f64, right: f64| match knots.last_mut() {
                Some(k) if k.0 == x => k.2 = right,
                _ => knots.push((x, left, right)),
            };
            if hi > lo {
                knot(lo, before, before);
                knot(hi, cum, cum);
            } else {
                knot(lo, before, cum);
            }
        }
        let mut survival_integral = Vec::with_capacity(knots.len());
        survival_integral.push(0.0);
        for w in knots.windows(2) {
            let (a, b) = (w[0], w[1]);
            let last = *survival_integral.last().unwrap_or(&0.0);
            survival_integral.push(last + (b.0 - a.0) * (1.0 - (a.2 + b.1) / 2.0));
        }
        Some(Self { buckets, knots, survival_integral })
    }

    /// From a classic histogram: bucket `(previous le, le]`, the first from 0; the `+Inf`
    /// bucket's observations as a point mass at the top finite bound (their true durations are
    /// unknown and larger: the model then reports the p99 beyond the top bucket).
    pub fn from_classic(h: &Histogram) -> Option<Self> {
        let mut ranges = Vec::with_capacity(h.buckets().len());
        let (mut lower, mut below) = (0.0, 0.0);
        for b in h.buckets() {
            let count = b.count - below;
            if b.upper_bound_seconds.is_finite() {
                ranges.push((lower, b.upper_bound_seconds, count));
                lower = b.upper_bound_seconds;
            } else {
                ranges.push((lower, lower, count));
            }
            below = b.count;
        }
        Self::from_ranges(ranges)
    }

    /// From a native histogram's buckets ([`NativeHistogram::bucket_ranges`]).
    pub fn from_native(h: &NativeHistogram) -> Option<Self> {
        Self::from_ranges(h.bucket_ranges())
    }

    /// P(S <= x): linear inside each bucket, a point mass counted from its own bound on.
    pub fn cdf(&self, x: f64) -> f64 {
        if x.is_nan() || x < 0.0 {
            return 0.0;
        }
        let k = self.knots.partition_point(|k| k.0 <= x);
        if k == 0 {
            return 0.0;
        }
        let (x0, _, f0) = self.knots[k - 1];
        match self.knots.get(k) {
            Some(&(x1, f1, _)) => f0 + (f1 - f0) * (x - x0) / (x1 - x0),
            None => f0,
        }
    }

    /// E[S], seconds.
    pub fn mean_seconds(&self) -> f64 {
        *self.survival_integral.last().unwrap_or(&0.0)
    }

    /// The largest duration the distribution holds, seconds.
    pub fn max_seconds(&self) -> f64 {
        self.knots.last().map_or(0.0, |k| k.0)
    }

    /// `∫_0^x (1 - F(t)) dt`: E[S] times the residual-life CDF at `x`.
    fn survival_integral_to(&self, x: f64) -> f64 {
        if x <= 0.0 {
            return 0.0;
        }
        let k = self.knots.partition_point(|k| k.0 <= x) - 1;
        let (x0, _, f0) = self.knots[k];
        let Some(&(x1, f1, _)) = self.knots.get(k + 1) else {
            return self.survival_integral[k];
        };
        let f = f0 + (f1 - f0) * (x - x0) / (x1 - x0);
        self.survival_integral[k] + (x - x0) * (1.0 - (f0 + f) / 2.0)
    }
}

/// The window of a removal on one node: the wait for the next sync to start plus that sync.
#[derive(Debug, Clone, PartialEq)]
pub struct DeletionWindow {
    sync: SyncDurations,
    min_sync_period_seconds: f64,
}

impl DeletionWindow {
    /// `min_sync_period_seconds` below 0 or not finite counts as 0.
    pub fn new(sync: SyncDurations, min_sync_period_seconds: f64) -> Self {
        let m = if min_sync_period_seconds.is_finite() { min_sync_period_seconds.max(0.0) } else { 0.0 };
        Self { sync, min_sync_period_seconds: m }
    }

    /// P(wait <= y).
    fn wait_cdf(&self, y: f64) -> f64 {
        let (m, mean) = (self.min_sync_period_seconds, self.sync.mean_seconds());
        if m + mean <= 0.0 {
            return if y >= 0.0 { 1.0 } else { 0.0 };
        }
        let in_gap = if m > 0.0 { (y / m).clamp(0.0, 1.0) } else { f64::from(u8::from(y >= 0.0)) };
        let in_sync = if mean > 0.0 { (self.sync.survival_integral_to(y - m) / mean).clamp(0.0, 1.0) } else { f64::from(u8::from(y >= m)) };
        (m * in_gap + mean * in_sync) / (m + mean)
    }

    /// P(window <= x): the wait's CDF averaged over the own sync S' (each bucket at
    /// [`POINTS_PER_BUCKET`] midpoints); exactly 1 from [`DeletionWindow::max_seconds`] on,
    /// where every point's wait is certain (the coverage table asks there up to network
    /// programming's longest observation, often minutes).
    pub fn cdf(&self, x: f64) -> f64 {
        if x >= self.max_seconds() {
            return 1.0;
        }
        let mut p = 0.0;
        for &(lo, hi, w) in &self.sync.buckets {
            if hi > lo {
                let step = (hi - lo) / POINTS_PER_BUCKET as f64;
                let sum: f64 = (0..POINTS_PER_BUCKET).map(|i| self.wait_cdf(x - (lo + step * (i as f64 + 0.5)))).sum();
                p += w * sum / POINTS_PER_BUCKET as f64;
            } else {
                p += w * self.wait_cdf(x - lo);
            }
        }
        p.clamp(0.0, 1.0)
    }

    /// The longest window the distribution holds, seconds: `minSyncPeriod + 2 x` the longest
    /// sync (a removal that meets the longest sync just starting, then its own longest one).
    pub fn max_seconds(&self) -> f64 {
        self.min_sync_period_seconds + 2.0 * self.sync.max_seconds()
    }

    /// The `q` quantile of the window, seconds (`q` clamped to [0, 1]; NaN gives NaN): the
    /// smallest x with P(window <= x) >= q, to [`QUANTILE_RESOLUTION_SECONDS`].
    pub fn quantile(&self, q: f64) -> f64 {
        if q.is_nan() {
            return f64::NAN;
        }
        let q = q.clamp(0.0, 1.0);
        let (mut lo, mut hi) = (0.0, self.max_seconds());
        while hi - lo > QUANTILE_RESOLUTION_SECONDS * hi.max(1.0) {
            let mid = (lo + hi) / 2.0;
            if self.cdf(mid) >= q {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::exposition::Bucket;

    fn close(a: f64, b: f64, tol: f64) {
        assert!((a - b).abs() <= tol, "{a} vs {b}");
    }

    #[test]
    fn the_duration_cdf_is_linear_inside_buckets_and_steps_at_point_masses() {
        let d = SyncDurations::from_ranges([(0.0, 1.0, 1.0), (1.0, 2.0, 1.0), (3.0, 3.0, 2.0)]).unwrap();
        for (x, f) in [(-1.0, 0.0), (0.0, 0.0), (0.5, 0.125), (1.0, 0.25), (1.5, 0.375), (2.0, 0.5), (2.99, 0.5), (3.0, 1.0), (9.0, 1.0)] {
            close(d.cdf(x), f, 1e-12);
        }
        assert_eq!(d.cdf(f64::NAN), 0.0);
        assert_eq!(d.cdf(f64::INFINITY), 1.0);
    }

    #[test]
    fn a_fixed_sync_duration_gives_the_closed_form() {
        // every sync takes d = 1 s, m = 1 s: a removal lands in a gap with probability
        // m / (d + m) = 0.5 (window U[0, 1] + 1), else in a sync (window U[0, 1] + 1 + 1), so
        // above 2 s the CDF is 0.5 + 0.5 x (x - 2) and the p99 is 2 + 0.49 / 0.5 = 2.98 s
        let d = SyncDurations::from_ranges([(1.0, 1.0, 10.0)]).unwrap();
        let w = DeletionWindow::new(d, 1.0);
        close(w.quantile(0.99), 2.98, 1e-5);
        close(w.cdf(2.5), 0.75, 1e-12);
        close(w.cdf(1.5), 0.25, 1e-12);
        close(w.cdf(0.99), 0.0, 1e-12);
        // no minSyncPeriod: window = rest of the running sync + own sync, p99 = 1 + 0.99
        let d = SyncDurations::from_ranges([(1.0, 1.0, 10.0)]).unwrap();
        close(DeletionWindow::new(d, 0.0).quantile(0.99), 1.99, 1e-5);
    }

    #[test]
    fn the_window_cdf_reaches_1_exactly_at_its_longest_window() {
        // syncs of 0-0.5 s and one bucket at 2-4 s, m = 1 s: the longest window is 1 + 2 x 4 s
        let d = SyncDurations::from_ranges([(0.0, 0.5, 97.0), (2.0, 4.0, 3.0)]).unwrap();
        let w = DeletionWindow::new(d, 1.0);
        assert_eq!(w.max_seconds(), 9.0);
        let below = w.cdf(8.8);
        assert!(below > 0.99 && below < 1.0, "{below}");
        for x in [9.0, 9.5, 300.0, f64::INFINITY] {
            assert_eq!(w.cdf(x), 1.0, "{x}");
        }
        // the midpoint sum just below agrees with the shortcut's 1 to rounding once the last
        // bucket's points are all certain (x - 3.875 >= m + 4)
        close(w.cdf(8.875), 1.0, 1e-12);
    }

    #[test]
    fn a_rare_slow_sync_is_met_more_often_than_its_share() {
        // a classic histogram: 90 syncs in (0.128, 0.256], 9 in (0.256, 0.512], 1 in
        // (1.024, 2.048]: the sync p99 is 0.512 s, but a removal lands inside the slow sync
        // with probability 0.01 x 1.536 / (E[S] + 1) = 1.2% (E[S] = 0.2841 s), more than 1%,
        // so the window's p99 waits for part of it and lies above 1 + 2 x p99(sync)
        let bucket = |le: f64, count: f64| Bucket { upper_bound_seconds: le, count };
        let h = Histogram::new(
            vec![bucket(0.128, 0.0), bucket(0.256, 90.0), bucket(0.512, 99.0), bucket(1.024, 99.0), bucket(2.048, 100.0), bucket(f64::INFINITY, 100.0)],
            None,
        )
        .unwrap();
        let p99 = h.quantile(0.99).seconds;
        let durations = SyncDurations::from_classic(&h).unwrap();
        close(durations.mean_seconds(), 0.9 * 0.192 + 0.09 * 0.384 + 0.01 * 1.536, 1e-12);
        let w = DeletionWindow::new(durations, 1.0).quantile(0.99);
        assert!(w > 1.0 + 2.0 * p99 && w < 1.0 + 2.0 * 2.048, "{w} vs p99 {p99}");
        // monotone CDF from 0 to 1
        let mut last = 0.0;
        for i in 0..=600 {
            let c = DeletionWindow::new(SyncDurations::from_classic(&h).unwrap(), 1.0).cdf(f64::from(i) * 0.01);
            assert!(c >= last - 1e-12, "not monotone at {i}");
            last = c;
        }
        close(last, 1.0, 1e-12);
    }

    #[test]
    fn matches_a_simulated_runner() {
        // an independent reference: kube-proxy's busy runner simulated (syncs drawn from the
        // buckets, minSyncPeriod gaps, removals at uniform times), 400,000 removals
        let ranges = [(0.05, 0.1, 40.0), (0.1, 0.4, 50.0), (0.4, 1.6, 9.0), (1.6, 3.2, 1.0)];
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut uniform = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let total: f64 = ranges.iter().map(|r| r.2).sum();
        let draw = |u: &mut dyn FnMut() -> f64| {
            let mut t = u() * total;
            for &(lo, hi, c) in &ranges {
                if t < c {
                    return lo + (hi - lo) * u();
                }
                t -= c;
            }
            ranges[3].1
        };
        let m = 1.0;
        // the timeline: sync, gap, sync, ...; removals at uniform times over it
        let mut starts = Vec::new();
        let mut durations = Vec::new();
        let mut t = 0.0;
        for _ in 0..200_000 {
            let s = draw(&mut uniform);
            starts.push(t);
            durations.push(s);
            t += s + m;
        }
        let horizon = t - 10.0;
        let mut windows: Vec<f64> = (0..400_000)
            .map(|_| {
                let at = uniform() * horizon;
                // the first sync that starts after `at` removes it
                let i = starts.partition_point(|&s| s <= at);
                starts[i] + durations[i] - at
            })
            .collect();
        windows.sort_by(f64::total_cmp);
        let simulated = windows[(windows.len() as f64 * 0.99) as usize];
        let model = DeletionWindow::new(SyncDurations::from_ranges(ranges).unwrap(), m).quantile(0.99);
        assert!((model - simulated).abs() / simulated < 0.02, "model {model} vs simulated {simulated}");
    }

    #[test]
    fn bad_buckets_give_no_distribution() {
        assert_eq!(SyncDurations::from_ranges([(0.0, 1.0, f64::NAN)]), None);
        assert_eq!(SyncDurations::from_ranges([(0.0, 1.0, 0.0)]), None);
        assert_eq!(SyncDurations::from_ranges([(0.0, 1.0, 1.0), (0.5, 2.0, 1.0)]), None, "overlapping");
        assert_eq!(SyncDurations::from_ranges(Vec::new()), None);
        let d = SyncDurations::from_ranges([(0.0, 1.0, f64::INFINITY), (1.0, 2.0, 1.0)]).unwrap();
        close(d.mean_seconds(), 1.5, 1e-12);
        assert!(DeletionWindow::new(d, f64::NAN).quantile(f64::NAN).is_nan());
    }
}
