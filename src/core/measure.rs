//! The rolling measurement window: recent scrapes per node, so that every analysis uses the
//! delta of cumulative histogram buckets over (at least) the window rather than kube-proxy's
//! whole lifetime. Pure: the scraper records, the controller reads.
//!
//! Memory: the window of 5,000 nodes at the defaults (600 s / 30 s, 21 samples per
//! node) is 105,000 samples. Only the newest sample of a node is analysed whole; the older ones
//! are kept only because the oldest of them becomes the `earlier` scrape of the analysis, which
//! reads nothing but its sync and network-programming histograms ([`crate::core::model::measure_node`]).
//! So a node keeps its newest [`Sample`] as recorded and the older ones compact: those two
//! histograms, exactly (bucket counts packed as varint increments, the bounds shared by every
//! sample with the same layout), the proxy mode and the time. A whole v1.29 sample holds about
//! 2.7 KB; a compact one about 140 bytes, a tenth of the heap for 5,000 nodes x 21 samples
//! (`examples/store_memory.rs` measures it: docs/benchmarks/memory.md "Operator memory").

use crate::core::exposition::{Bucket, Histogram, KubeProxyScrape, NativeHistogram};
use crate::core::model::{NodeInput, ProxyMode};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;

/// One successful scrape of a node.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was taken, Unix seconds.
    pub at_unix_seconds: f64,
    /// The parsed scrape.
    pub scrape: KubeProxyScrape,
    /// `/proxyMode` answer, when read.
    pub proxy_mode: Option<ProxyMode>,
}

/// Which way a node's sample reached the operator (`--source auto` tries the first three in
/// this order, per node; see [`crate::sources::auto`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeSource {
    /// kube-proxy's `/metrics` scraped directly.
    KubeProxy,
    /// kube-proxy's `/metrics` read through the node agent (kube-proxy bound to loopback).
    Agent,
    /// A Prometheus server's window of kube-proxy's series.
    Prometheus,
    /// A saved scrape (`--source files`).
    File,
}

impl NodeSource {
    /// The label used in the status and the metrics: `kube-proxy`, `agent`, `prometheus`,
    /// `file`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KubeProxy => "kube-proxy",
            Self::Agent => "agent",
            Self::Prometheus => "prometheus",
            Self::File => "file",
        }
    }

    /// True when a sample is already a window (Prometheus' `increase()`), not kube-proxy's
    /// cumulative counters: no delta may be taken between it and any other sample.
    pub fn is_windowed(self) -> bool {
        self == Self::Prometheus
    }
}

/// Why a node's last scrape failed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFailure {
    /// Short reason label, one of [`reason`]: `connection_refused`, `timeout`, `http_status`,
    /// `parse`, `other`.
    pub reason: String,
    /// Full message, with a hint where one helps.
    pub message: String,
    /// When, Unix seconds.
    pub at_unix_seconds: f64,
}

/// Failure reason labels (the `reason` of [`NodeFailure`], of the scraper's
/// `scrape_errors_total` and of the node agent's reason header).
pub mod reason {
    /// Nothing listens on the target's port (kube-proxy's default bind is 127.0.0.1).
    pub const CONNECTION_REFUSED: &str = "connection_refused";
    /// No complete answer within the per-target timeout.
    pub const TIMEOUT: &str = "timeout";
    /// An HTTP status other than 2xx.
    pub const HTTP_STATUS: &str = "http_status";
    /// The body is not a usable kube-proxy scrape (cut off, no `+Inf` bucket, not UTF-8).
    pub const PARSE: &str = "parse";
    /// Anything else (DNS, TLS, reset connection, body too large).
    pub const OTHER: &str = "other";
}

/// A process-wide new revision (see [`MeasurementStore::revision`]).
fn next_revision() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The bucket counts of a stored histogram, exactly as scraped.
#[derive(Debug, Clone, PartialEq)]
enum Counts {
    /// Whole numbers that survive `f64 -> u64 -> f64` bit for bit and never decrease from one
    /// bucket to the next (the norm: cumulative counters), packed ([`pack`]): the increments
    /// between consecutive buckets as varints, a flat stretch (the empty head, the full tail)
    /// as one varint of its length. 82 network-programming buckets take 656 bytes as `u64`s,
    /// typically under 30 packed.
    Packed(Box<[u8]>),
    /// Anything else (a fraction, NaN, a negative count, `-0`, a count lower than the one
    /// before it): the counts as they are.
    Floats(Box<[f64]>),
}

impl Counts {
    fn new(buckets: &[Bucket]) -> Self {
        let exact = |c: f64| (c as u64 as f64).to_bits() == c.to_bits();
        let packed = buckets.iter().all(|b| exact(b.count)).then(|| pack(buckets.iter().map(|b| b.count as u64))).flatten();
        match packed {
            Some(bytes) => Self::Packed(bytes.into_boxed_slice()),
            None => Self::Floats(buckets.iter().map(|b| b.count).collect()),
        }
    }

    /// The `n` counts as `f64`, in bucket order (`n`: the number of bounds).
    fn to_f64(&self, n: usize) -> Vec<f64> {
        match self {
            Self::Packed(bytes) => unpack(bytes, n).into_iter().map(|c| c as f64).collect(),
            Self::Floats(c) => c.to_vec(),
        }
    }
}

/// Packs non-decreasing counts: a sequence of (number of zero increments, as a varint; then,
/// unless the counts end there, the next increment, non-zero, as a varint). Varints are LEB128:
/// seven bits a byte, low bits first, the high bit set on every byte but the last. `None` when
/// a count is lower than the one before it (no increment to write).
fn pack(counts: impl Iterator<Item = u64>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut previous, mut zeros) = (0u64, 0u64);
    for c in counts {
        let increment = c.checked_sub(previous)?;
        previous = c;
        if increment == 0 {
            zeros += 1;
        } else {
            varint(&mut out, zeros);
            varint(&mut out, increment);
            zeros = 0;
        }
    }
    if zeros > 0 {
        varint(&mut out, zeros);
    }
    Some(out)
}

/// The `n` counts [`pack`] packed into `bytes`.
fn unpack(mut bytes: &[u8], n: usize) -> Vec<u64> {
    let mut varint = || read_varint(&mut bytes);
    let mut out = Vec::with_capacity(n);
    let mut previous = 0u64;
    while out.len() < n {
        let zeros = usize::try_from(varint()).unwrap_or(usize::MAX).min(n - out.len());
        out.resize(out.len() + zeros, previous);
        if out.len() < n {
            previous += varint();
            out.push(previous);
        }
    }
    out
}

/// The bucket layouts (upper bounds) the store's compact samples use, one allocation each:
/// every node of a cluster normally has the same two (sync, network programming), so 5,000
/// nodes x 21 samples share them instead of holding 105,000 copies (656 bytes each for network
/// programming).
#[derive(Debug, Clone, Default)]
struct Layouts(Vec<Arc<[f64]>>);

impl Layouts {
    /// The shared bounds of `buckets` (bit for bit equal, so `-0` and `0` stay apart). A new
    /// layout first drops those no sample uses any more (an upgrade's old buckets), so the list
    /// stays as long as the layouts in use.
    fn intern(&mut self, buckets: &[Bucket]) -> Arc<[f64]> {
        let same = |l: &&Arc<[f64]>| l.len() == buckets.len() && l.iter().zip(buckets).all(|(a, b)| a.to_bits() == b.upper_bound_seconds.to_bits());
        if let Some(l) = self.0.iter().find(same) {
            return l.clone();
        }
        self.0.retain(|l| Arc::strong_count(l) > 1);
        let l: Arc<[f64]> = buckets.iter().map(|b| b.upper_bound_seconds).collect();
        self.0.push(l.clone());
        l
    }
}

/// A histogram as an older sample keeps it: the bounds (shared, [`Layouts`]), the counts
/// ([`Counts`]) and the sum. Re-expands to the same [`Histogram`].
#[derive(Debug, Clone, PartialEq)]
struct CompactHistogram {
    /// Upper bounds in seconds, sorted, the last `+Inf` (as in the histogram).
    bounds: Arc<[f64]>,
    counts: Counts,
    sum_seconds: Option<f64>,
}

impl CompactHistogram {
    /// `h` compacted, its bounds from `layouts`.
    fn new(h: &Histogram, layouts: &mut Layouts) -> Self {
        let buckets = h.buckets();
        Self { bounds: layouts.intern(buckets), counts: Counts::new(buckets), sum_seconds: h.sum_seconds }
    }

    /// The histogram it was made from.
    fn expand(&self) -> Histogram {
        let buckets = self.bounds.iter().zip(self.counts.to_f64(self.bounds.len())).map(|(&b, count)| Bucket { upper_bound_seconds: b, count }).collect();
        // the bounds come from a histogram: sorted, distinct and ending in +Inf
        Histogram::new(buckets, self.sum_seconds).expect("a compacted histogram re-expands")
    }
}

/// A native histogram as an older sample keeps it: the scalars, and each side's buckets packed
/// ([`pack_native`]) when every count is a whole number (kube-proxy's are: integer deltas), as
/// they are otherwise. About 60 bytes for kube-proxy's ~20 sync buckets instead of ~380.
#[derive(Debug, Clone, PartialEq)]
struct CompactNative {
    schema: i8,
    zero_threshold: f64,
    zero_count: f64,
    count: f64,
    sum: f64,
    positive: NativeBuckets,
    negative: NativeBuckets,
}

/// One side's native buckets, `(index, count)` sorted by index.
#[derive(Debug, Clone, PartialEq)]
enum NativeBuckets {
    /// [`pack_native`]'s varints.
    Packed(Box<[u8]>),
    /// The buckets as they are (a fractional, negative or `-0` count).
    Raw(Box<[(i32, f64)]>),
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn read_varint(bytes: &mut &[u8]) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    while let Some((&b, rest)) = bytes.split_first() {
        *bytes = rest;
        v |= u64::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
        shift += 7;
        if b & 0x80 == 0 {
            break;
        }
    }
    v
}

/// Packs native buckets: per bucket the index step as a varint (the first bucket's index
/// zigzag-encoded, each later one the gap after the previous bucket), then the count as a
/// varint. `None` when a count is not a whole number that survives `f64 -> u64 -> f64` bit
/// for bit.
fn pack_native(buckets: &[(i32, f64)]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(buckets.len() * 2);
    let mut previous: Option<i32> = None;
    for &(i, c) in buckets {
        if (c as u64 as f64).to_bits() != c.to_bits() {
            return None;
        }
        let step = match previous {
            None => ((i << 1) ^ (i >> 31)) as u32 as u64,
            Some(p) => (i64::from(i) - i64::from(p) - 1) as u64,
        };
        varint(&mut out, step);
        varint(&mut out, c as u64);
        previous = Some(i);
    }
    Some(out)
}

fn unpack_native(mut bytes: &[u8]) -> Vec<(i32, f64)> {
    let mut out = Vec::new();
    let mut previous: Option<i32> = None;
    while !bytes.is_empty() {
        let step = read_varint(&mut bytes);
        let i = match previous {
            None => {
                let z = step as u32;
                ((z >> 1) as i32) ^ -((z & 1) as i32)
            }
            Some(p) => (i64::from(p) + 1 + step as i64) as i32,
        };
        out.push((i, read_varint(&mut bytes) as f64));
        previous = Some(i);
    }
    out
}

impl NativeBuckets {
    fn new(buckets: &[(i32, f64)]) -> Self {
        match pack_native(buckets) {
            Some(bytes) => Self::Packed(bytes.into_boxed_slice()),
            None => Self::Raw(buckets.into()),
        }
    }

    /// The buckets, `(index, count)` sorted by index.
    fn buckets(&self) -> Vec<(i32, f64)> {
        match self {
            Self::Packed(bytes) => unpack_native(bytes),
            Self::Raw(b) => b.to_vec(),
        }
    }
}

impl CompactNative {
    fn new(h: &NativeHistogram) -> Self {
        Self {
            // the schema is -4..=8 (NativeHistogram checks it)
            schema: h.schema() as i8,
            zero_threshold: h.zero_threshold(),
            zero_count: h.zero_count(),
            count: h.count(),
            sum: h.sum(),
            positive: NativeBuckets::new(h.positive()),
            negative: NativeBuckets::new(h.negative()),
        }
    }

    /// The histogram it was made from.
    fn expand(&self) -> NativeHistogram {
        NativeHistogram::from_buckets(
            i32::from(self.schema),
            (self.zero_threshold, self.zero_count),
            (self.count, self.sum),
            &self.positive.buckets(),
            &self.negative.buckets(),
        )
        .expect("a compacted native histogram re-expands")
    }
}

/// An older sample of a node, reduced to what the analysis reads of an `earlier` scrape: the
/// sync and network-programming histograms (exact), the proxy mode and the time.
#[derive(Debug, Clone, PartialEq)]
struct CompactSample {
    at_unix_seconds: f64,
    proxy_mode: Option<ProxyMode>,
    sync_from_legacy_microseconds: bool,
    sync: Option<CompactHistogram>,
    network_programming: Option<CompactHistogram>,
    // boxed: 8 bytes each when absent (a text scrape, every older sample of a pre-1.37 node)
    // instead of the 88 of an inline `CompactNative`, 160 bytes per older sample
    sync_native: Option<Box<CompactNative>>,
    network_programming_native: Option<Box<CompactNative>>,
}

impl CompactSample {
    /// `sample` compacted, its bounds from `layouts`.
    fn new(sample: &Sample, layouts: &mut Layouts) -> Self {
        let scrape = &sample.scrape;
        Self {
            at_unix_seconds: sample.at_unix_seconds,
            proxy_mode: sample.proxy_mode,
            sync_from_legacy_microseconds: scrape.sync_from_legacy_microseconds,
            // a family with a native histogram keeps only that one: the analysis reads the
            // classic buckets of an earlier scrape only when the later one has no native
            // histogram ([`crate::core::model::measure_node`])
            sync: scrape.sync.as_ref().filter(|_| scrape.sync_native.is_none()).map(|h| CompactHistogram::new(h, layouts)),
            network_programming: scrape
                .network_programming
                .as_ref()
                .filter(|_| scrape.network_programming_native.is_none())
                .map(|h| CompactHistogram::new(h, layouts)),
            sync_native: scrape.sync_native.as_ref().map(|h| Box::new(CompactNative::new(h))),
            network_programming_native: scrape.network_programming_native.as_ref().map(|h| Box::new(CompactNative::new(h))),
        }
    }

    /// A scrape holding only the kept fields (sync and network programming, the rest default):
    /// what [`MeasurementStore::inputs`] gives the analysis as the earlier scrape.
    fn scrape(&self) -> KubeProxyScrape {
        KubeProxyScrape {
            sync: self.sync.as_ref().map(CompactHistogram::expand),
            sync_from_legacy_microseconds: self.sync_from_legacy_microseconds,
            network_programming: self.network_programming.as_ref().map(CompactHistogram::expand),
            sync_native: self.sync_native.as_deref().map(CompactNative::expand),
            network_programming_native: self.network_programming_native.as_deref().map(CompactNative::expand),
            ..KubeProxyScrape::default()
        }
    }
}

/// One node's window: the newest sample whole, the older ones compacted (oldest first).
#[derive(Debug, Clone)]
struct NodeSamples {
    older: VecDeque<CompactSample>,
    newest: Sample,
    /// How the newest sample was read (`None`: recorded with [`MeasurementStore::record`]).
    source: Option<NodeSource>,
}

/// Scrapes per node over a rolling window, plus the last failure of each failing node.
#[derive(Debug, Clone, Default)]
pub struct MeasurementStore {
    window_seconds: f64,
    nodes: BTreeMap<String, NodeSamples>,
    layouts: Layouts,
    failures: BTreeMap<String, NodeFailure>,
    revision: u64,
}

impl MeasurementStore {
    /// An empty store analysing `window_seconds` (default 600).
    pub fn new(window_seconds: f64) -> Self {
        Self { window_seconds, ..Default::default() }
    }

    /// The window, seconds.
    pub fn window_seconds(&self) -> f64 {
        self.window_seconds
    }

    /// Records a successful scrape and clears the node's failure. Keeps every sample inside the
    /// window plus the newest one at or before the window's start (the baseline of the delta).
    /// The previous newest sample is compacted: only the earlier scrape of the analysis is read
    /// from older samples, and only its sync and network programming (see the module docs).
    pub fn record(&mut self, node: &str, sample: Sample) {
        self.record_from(node, sample, None);
    }

    /// [`Self::record`], noting that the sample came through `source` ([`Self::node_sources`]).
    /// kube-proxy's counters read directly or through the agent are the same counters, so the
    /// window goes on across a switch between those two; a windowed sample (Prometheus), or
    /// the first sample after one, starts the node's window afresh (a delta between a window
    /// and a cumulative scrape means nothing).
    pub fn record_via(&mut self, node: &str, sample: Sample, source: NodeSource) {
        self.record_from(node, sample, Some(source));
    }

    fn record_from(&mut self, node: &str, mut sample: Sample, source: Option<NodeSource>) {
        sample.scrape.scraped_at_unix_seconds = Some(sample.at_unix_seconds);
        sample.scrape.oldest_pending_queued_unix_seconds = oldest_pending(self.nodes.get(node).map(|n| &n.newest.scrape), &sample.scrape);
        self.revision = next_revision();
        self.failures.remove(node);
        let start = sample.at_unix_seconds - self.window_seconds;
        let windowed = |s: Option<NodeSource>| s.is_some_and(NodeSource::is_windowed);
        let n = match self.nodes.get_mut(node) {
            Some(n) if !windowed(source) && !windowed(n.source) => n,
            _ => {
                self.nodes.insert(node.to_string(), NodeSamples { older: VecDeque::new(), newest: sample, source });
                return;
            }
        };
        n.source = source;
        let previous = std::mem::replace(&mut n.newest, sample);
        let compact = CompactSample::new(&previous, &mut self.layouts);
        drop(previous);
        // grow one sample at a time: the deque settles at the window's size instead of the next
        // power of two
        if n.older.len() == n.older.capacity() {
            n.older.reserve_exact(1);
        }
        n.older.push_back(compact);
        // the window is the older samples plus the newest: keep the second-oldest of them
        // inside the window, so the oldest is the newest sample at or before its start
        while n.older.len() >= 2 && n.older[1].at_unix_seconds <= start {
            n.older.pop_front();
        }
    }

    /// Records a failed scrape. The node's earlier samples stay (a transient failure does not
    /// lose the window), but it is reported as failed until its next success.
    pub fn record_failure(&mut self, node: &str, failure: NodeFailure) {
        self.failures.insert(node.to_string(), failure);
    }

    /// Drops nodes (and failures) not in `present` (kube-proxy pods that went away). One set
    /// lookup per node: a scan of `present` per node would be up to 25 million string
    /// comparisons every cycle with 5,000 nodes, under the store's lock.
    pub fn retain_nodes(&mut self, present: &[String]) {
        self.revision = next_revision();
        let present: HashSet<&str> = present.iter().map(String::as_str).collect();
        self.nodes.retain(|n, _| present.contains(n.as_str()));
        self.failures.retain(|n, _| present.contains(n.as_str()));
    }

    /// The measurement generation of the samples: it changes whenever [`Self::inputs`] may
    /// (a sample recorded, nodes dropped), so an analysis of the inputs can be reused while it
    /// stays the same. Unique in the process: two stores never share a revision with samples.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Nodes whose last scrape failed, with why.
    pub fn failures(&self) -> &BTreeMap<String, NodeFailure> {
        &self.failures
    }

    /// How each node's newest sample was read, for the nodes recorded with
    /// [`Self::record_via`], by node name.
    pub fn node_sources(&self) -> impl Iterator<Item = (&str, NodeSource)> {
        self.nodes.iter().filter_map(|(node, n)| n.source.map(|s| (node.as_str(), s)))
    }

    /// Number of nodes with at least one sample.
    pub fn nodes_with_data(&self) -> usize {
        self.nodes.len()
    }

    /// Time of the newest sample of any node, Unix seconds.
    pub fn last_scrape_unix_seconds(&self) -> Option<f64> {
        self.nodes.values().map(|n| n.newest.at_unix_seconds).reduce(f64::max)
    }

    /// The analysis inputs: per node, the newest sample and (when there are two or more) the
    /// oldest kept one as the earlier scrape. Failed nodes with old samples still contribute
    /// their last known window. The earlier scrape holds only its sync and network-programming
    /// histograms (and whether sync came from the legacy microsecond family), exactly as
    /// scraped, its other fields default: all the analysis reads of it.
    pub fn inputs(&self) -> Vec<NodeInput> {
        self.inputs_iter().collect()
    }

    /// [`Self::inputs`] one node at a time, in the same order: an analysis that measures each
    /// node's window as it goes never holds every node's copy at once.
    pub fn inputs_iter(&self) -> impl Iterator<Item = NodeInput> + '_ {
        self.nodes.iter().map(|(node, n)| {
            let earlier = n.older.front();
            NodeInput {
                node: node.clone(),
                later: n.newest.scrape.clone(),
                earlier: earlier.map(CompactSample::scrape),
                proxy_mode: n.newest.proxy_mode.or(earlier.and_then(|e| e.proxy_mode)),
            }
        })
    }
}

/// The oldest `last_queued` still waiting in `now`, carried from `previous` (the node's scrape
/// before it) when changes were waiting in both on a proxier whose last sync stayed the same
/// ([`KubeProxyScrape::waiting`]); None when `now` has nothing waiting or starts the wait.
fn oldest_pending(previous: Option<&KubeProxyScrape>, now: &KubeProxyScrape) -> Option<f64> {
    let (queued, synced) = now.waiting()??;
    let previous = previous?;
    let (previous_queued, previous_synced) = previous.waiting()??;
    (previous_synced == synced).then(|| previous.oldest_pending_queued_unix_seconds.unwrap_or(previous_queued).min(queued))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::exposition::{NativeParts, parse_kube_proxy_metrics, spans_of};

    fn s(at: f64) -> Sample {
        Sample { at_unix_seconds: at, scrape: KubeProxyScrape::default(), proxy_mode: None }
    }

    /// The real scrapes of tests/data/metrics/ that parse (the truncated Windows one does not).
    fn real_scrapes() -> Vec<(&'static str, KubeProxyScrape)> {
        [
            ("v1.29", include_str!("../../tests/data/metrics/kube-proxy-v1.29-iptables-excerpt.txt")),
            ("v1.13", include_str!("../../tests/data/metrics/kube-proxy-v1.13-legacy-microseconds.txt")),
            ("v1.8", include_str!("../../tests/data/metrics/kube-proxy-v1.8-legacy-nan-excerpt.txt")),
            ("windows", include_str!("../../tests/data/metrics/kube-proxy-windows-truncated.txt")),
        ]
        .into_iter()
        .filter_map(|(name, text)| Some((name, parse_kube_proxy_metrics(text).ok()?)))
        .collect()
    }

    /// `h` with `step` added to every count from bucket `from` on, and to the sum.
    fn grown(h: &Histogram, from: usize, step: f64) -> Histogram {
        let buckets = h
            .buckets()
            .iter()
            .enumerate()
            .map(|(i, b)| Bucket { upper_bound_seconds: b.upper_bound_seconds, count: b.count + if i >= from { step } else { 0.0 } })
            .collect();
        Histogram::new(buckets, h.sum_seconds.map(|s| s + step)).unwrap()
    }

    /// The store as it was before compaction (every sample whole, the same window rule): what
    /// `inputs()` must still give.
    struct WholeSamples(VecDeque<Sample>);

    impl WholeSamples {
        fn record(&mut self, sample: Sample, window_seconds: f64) {
            let start = sample.at_unix_seconds - window_seconds;
            self.0.push_back(sample);
            while self.0.len() > 2 && self.0[1].at_unix_seconds <= start {
                self.0.pop_front();
            }
        }
    }

    /// Everything of `input` the analysis reads, exactly (`{:?}` of f64 round-trips, and shows
    /// NaN counts, which `==` would not call equal).
    fn analysed(input: &NodeInput) -> String {
        let e = input.earlier.as_ref();
        format!(
            "{} {:?} {:?} {:?} {:?} {:?}",
            input.node,
            input.later,
            input.proxy_mode,
            e.map(|e| &e.sync),
            e.map(|e| &e.network_programming),
            e.map(|e| e.sync_from_legacy_microseconds),
        )
    }

    /// A scrape with only kube-proxy's two timestamps.
    fn timestamps(last_synced: f64, last_queued: f64) -> KubeProxyScrape {
        let mut s = KubeProxyScrape::default();
        *s.sync_timestamps_of("IPv4") = crate::core::exposition::parse::SyncTimestamps {
            ip_family: "IPv4".into(),
            last_queued_seconds: Some(last_queued),
            last_synced_seconds: Some(last_synced),
        };
        s
    }

    #[test]
    fn a_wait_is_carried_across_scrapes_until_a_sync_completes() {
        let mut store = MeasurementStore::new(600.0);
        let mut record = |at: f64, scrape: KubeProxyScrape| {
            store.record("n", Sample { at_unix_seconds: at, scrape, proxy_mode: None });
            let later = store.inputs().remove(0).later;
            (later.scraped_at_unix_seconds, later.oldest_pending_queued_unix_seconds)
        };
        // nothing pending
        assert_eq!(record(1000.0, timestamps(999.0, 998.0)), (Some(1000.0), None));
        // a change queued at 1001, still waiting at 1002: the wait starts at 1001
        assert_eq!(record(1002.0, timestamps(999.0, 1001.0)), (Some(1002.0), None));
        // more changes queued (last queued moves to 1031), no sync since 999: the oldest
        // still waiting is 1001's
        assert_eq!(record(1032.0, timestamps(999.0, 1031.0)), (Some(1032.0), Some(1001.0)));
        assert_eq!(record(1062.0, timestamps(999.0, 1061.0)), (Some(1062.0), Some(1001.0)));
        // a sync completed at 1063 and a new change at 1064 waits on its own
        assert_eq!(record(1065.0, timestamps(1063.0, 1064.0)), (Some(1065.0), None));
        assert_eq!(record(1067.0, timestamps(1066.0, 1065.0)), (Some(1067.0), None));
    }

    #[test]
    fn inputs_are_those_of_the_whole_samples_for_real_scrapes() {
        let scrapes = real_scrapes();
        assert_eq!(scrapes.iter().map(|s| s.0).collect::<Vec<_>>(), ["v1.29", "v1.13", "v1.8"]);
        // whole counts (kept as integers) and, from a restarted proxy, fractional ones (floats)
        for (name, base, fraction) in scrapes.into_iter().flat_map(|(n, s)| [(n, s.clone(), 0.0), (n, s, 0.25)]) {
            let mut store = MeasurementStore::new(600.0);
            let mut whole = WholeSamples(VecDeque::new());
            // 45 scrapes, some 30 s apart and some 45 s, counts growing in a moving bucket, a
            // restart (counts back to the base) and the mode answered only sometimes
            let mut at = 1.7e9;
            for i in 0..45usize {
                at += if i % 4 == 0 { 45.0 } else { 30.0 };
                let step = if i == 30 { 0.0 } else { (i * i) as f64 + if i > 30 { fraction } else { 0.0 } };
                let grow = |h: &Option<Histogram>| h.as_ref().map(|h| grown(h, i % h.buckets().len(), step));
                let mut scrape = base.clone();
                scrape.sync = grow(&base.sync);
                scrape.network_programming = grow(&base.network_programming);
                scrape.sync_full = grow(&base.sync_full);
                let proxy_mode = [None, Some(ProxyMode::Iptables), Some(ProxyMode::Nftables)][i % 3];
                let sample = Sample { at_unix_seconds: at, scrape, proxy_mode };
                store.record("n", sample.clone());
                whole.record(sample, 600.0);

                let inputs = store.inputs();
                let reference = NodeInput {
                    node: "n".into(),
                    // the store stamps the scrape's time, which the stale check reads
                    later: KubeProxyScrape { scraped_at_unix_seconds: Some(at), ..whole.0.back().unwrap().scrape.clone() },
                    earlier: (whole.0.len() >= 2).then(|| whole.0[0].scrape.clone()),
                    proxy_mode: whole.0.back().unwrap().proxy_mode.or((whole.0.len() >= 2).then(|| whole.0[0].proxy_mode).flatten()),
                };
                assert_eq!(inputs.len(), 1);
                assert_eq!(analysed(&inputs[0]), analysed(&reference), "{name} {fraction}, scrape {i}");
                // and the same window: as many samples, the oldest at the same time
                let n = &store.nodes["n"];
                assert_eq!(n.older.len() + 1, whole.0.len(), "{name}, scrape {i}");
                assert_eq!(n.older.front().map(|c| c.at_unix_seconds), (whole.0.len() >= 2).then(|| whole.0[0].at_unix_seconds));
                // fractional counts (scrapes 31 on of the fractional run, compacted from the next
                // record on) are kept as floats, whole ones packed
                let floats = n.older.iter().filter_map(|c| c.sync.as_ref()).filter(|h| matches!(h.counts, Counts::Floats(_))).count();
                assert_eq!(floats > 0, fraction > 0.0 && i > 31, "{name} {fraction}, scrape {i}");
                // and the same analysis
                let measured = |i: &NodeInput| format!("{:?}", crate::core::model::measure_node(i, 1.0, 5, None));
                assert_eq!(measured(&inputs[0]), measured(&reference), "{name}, scrape {i}");
            }
        }
    }

    #[test]
    fn native_histograms_compact_and_expand_exactly() {
        let h = |positive: Vec<(i32, f64)>, negative: Vec<(i32, f64)>| {
            let ((ps, pc), (ns, nc)) = (spans_of(&positive), spans_of(&negative));
            let count = pc.iter().chain(&nc).sum::<f64>() + 3.0;
            NativeHistogram::new(NativeParts {
                schema: 3,
                zero_threshold: 2f64.powi(-128),
                zero_count: 3.0,
                count,
                sum: 1.25,
                positive_spans: ps,
                positive_counts: pc,
                negative_spans: ns,
                negative_counts: nc,
            })
            .unwrap()
        };
        let cases = [
            // kube-proxy's shape: whole counts, consecutive and gapped indices
            h(vec![(-60, 1.0), (-59, 0.0), (-58, 7.0), (-40, 1_000_000.0), (i32::MAX, 1.0)], vec![]),
            h(vec![(i32::MIN + 1, 2.0), (0, 1.0)], vec![(-3, 4.0), (5, 1.0)]),
            // a fraction and -0 are kept as they are
            h(vec![(1, 0.5), (2, -0.0)], vec![]),
            h(vec![], vec![]),
        ];
        for (n, native) in cases.iter().enumerate() {
            let compact = CompactNative::new(native);
            assert_eq!(&compact.expand(), native, "case {n}");
            let bits = |b: &[(i32, f64)]| b.iter().map(|&(i, c)| (i, c.to_bits())).collect::<Vec<_>>();
            assert_eq!(bits(compact.expand().positive()), bits(native.positive()), "case {n}");
        }
        assert!(matches!(CompactNative::new(&cases[0]).positive, NativeBuckets::Packed(ref b) if b.len() < 20));
        assert!(matches!(CompactNative::new(&cases[2]).positive, NativeBuckets::Raw(_)));
    }

    #[test]
    fn counts_that_are_not_whole_numbers_are_kept_exactly() {
        let counts = [0.5, 1.0, 1.75, 1e20, 2.5e-300];
        let buckets =
            counts.iter().zip([0.1, 0.2, 0.4, 0.8, f64::INFINITY]).map(|(&count, upper_bound_seconds)| Bucket { upper_bound_seconds, count }).collect();
        let h = Histogram::new(buckets, Some(0.3)).unwrap();
        let compact = CompactHistogram::new(&h, &mut Layouts::default());
        assert!(matches!(compact.counts, Counts::Floats(_)));
        let back = compact.expand();
        let bits = |h: &Histogram| h.buckets().iter().map(|b| (b.upper_bound_seconds.to_bits(), b.count.to_bits())).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&h));
        assert_eq!(back.sum_seconds, Some(0.3));
        // whole numbers, up to the largest a u64 holds, are kept as integers
        for c in [0.0, 1.0, 9_007_199_254_740_992.0, 1.8e19] {
            let h = Histogram::new(vec![Bucket { upper_bound_seconds: f64::INFINITY, count: c }], None).unwrap();
            let compact = CompactHistogram::new(&h, &mut Layouts::default());
            assert!(matches!(compact.counts, Counts::Packed(_)), "{c}");
            assert_eq!(compact.expand().count().to_bits(), c.to_bits());
        }
        // but not -0, which a u64 would turn into 0
        let h = Histogram::new(vec![Bucket { upper_bound_seconds: f64::INFINITY, count: -0.0 }], None).unwrap();
        let back = CompactHistogram::new(&h, &mut Layouts::default()).expand();
        assert_eq!(back.count().to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn packed_counts_round_trip() {
        let cases: [&[u64]; 7] = [
            &[],
            &[0, 0, 0],
            &[5],
            &[0, 0, 1, 1, 1, 2, 2, 2, 2],
            &[1, 128, 300, 300, 16_384, u64::MAX / 2, u64::MAX / 2, u64::MAX],
            &[7; 200],
            &[0, 127, 128, 255, 256, 1 << 35, (1 << 35) + 1],
        ];
        for counts in cases {
            let bytes = pack(counts.iter().copied()).unwrap();
            assert_eq!(unpack(&bytes, counts.len()), counts, "{counts:?} as {bytes:?}");
        }
        // a flat stretch is one byte, however long
        assert_eq!(pack([0; 81].into_iter().chain([3])).unwrap(), [81, 3]);
        assert_eq!(pack([3; 81].into_iter()).unwrap(), [0, 3, 80]);
        // counts that go down are not packed
        assert_eq!(pack([2, 1].into_iter()), None);
        // the real network-programming histogram: 82 buckets in a few bytes
        let (_, scrape) = real_scrapes().into_iter().find(|(name, _)| *name == "v1.29").unwrap();
        let np = CompactHistogram::new(scrape.network_programming.as_ref().unwrap(), &mut Layouts::default());
        assert_eq!(np.bounds.len(), 82);
        assert!(matches!(&np.counts, Counts::Packed(b) if b.len() <= 10), "{:?}", np.counts);
    }

    /// `scrape` after an upgrade that added a network-programming bucket at `bound`.
    fn with_np_bucket(scrape: &KubeProxyScrape, bound: f64) -> KubeProxyScrape {
        let np = scrape.network_programming.as_ref().unwrap();
        let mut buckets = np.buckets().to_vec();
        buckets.push(Bucket { upper_bound_seconds: bound, count: 0.0 });
        KubeProxyScrape { network_programming: Some(Histogram::new(buckets, np.sum_seconds).unwrap()), ..scrape.clone() }
    }

    #[test]
    fn bounds_are_shared_between_samples_and_nodes() {
        let (_, base) = real_scrapes().into_iter().find(|(name, _)| *name == "v1.29").unwrap();
        let upgraded = with_np_bucket(&base, -1.0);
        let mut m = MeasurementStore::new(600.0);
        for (i, scrape) in [&base, &base, &base, &upgraded, &upgraded].into_iter().enumerate() {
            m.record("a", Sample { at_unix_seconds: 30.0 * i as f64, scrape: scrape.clone(), proxy_mode: None });
            m.record("b", Sample { at_unix_seconds: 30.0 * i as f64, scrape: scrape.clone(), proxy_mode: None });
        }
        let bounds = |node: &str, i: usize, np: bool| {
            let c = &m.nodes[node].older[i];
            if np { c.network_programming.as_ref() } else { c.sync.as_ref() }.unwrap().bounds.clone()
        };
        assert_eq!(m.nodes["a"].older.len(), 4);
        // one sync layout for every sample of both nodes; network programming changed once
        assert!((0..4).all(|i| Arc::ptr_eq(&bounds("a", 0, false), &bounds("a", i, false))));
        assert!(Arc::ptr_eq(&bounds("a", 0, false), &bounds("b", 0, false)));
        assert!(Arc::ptr_eq(&bounds("a", 0, true), &bounds("a", 2, true)));
        assert!(Arc::ptr_eq(&bounds("a", 0, true), &bounds("b", 1, true)));
        assert!(!Arc::ptr_eq(&bounds("a", 2, true), &bounds("a", 3, true)));
        assert_eq!(bounds("a", 3, true).len(), 83);
        assert_eq!(m.layouts.0.len(), 3);
        // once no sample uses the first layout, the next new one replaces it
        m.retain_nodes(&["a".into()]);
        let again = with_np_bucket(&upgraded, -2.0);
        for (i, scrape) in [&upgraded, &upgraded, &again, &again].into_iter().enumerate() {
            m.record("a", Sample { at_unix_seconds: 10_000.0 + 30.0 * i as f64, scrape: scrape.clone(), proxy_mode: None });
        }
        let np_lengths = |m: &MeasurementStore| m.layouts.0.iter().map(|l| l.len()).collect::<Vec<_>>();
        assert_eq!(np_lengths(&m), [16, 83, 84]);
        // -0 and 0 are not the same bound
        let zero = with_np_bucket(&base, -0.0);
        let mut layouts = Layouts::default();
        let a = CompactHistogram::new(zero.network_programming.as_ref().unwrap(), &mut layouts);
        let b = CompactHistogram::new(base.network_programming.as_ref().unwrap(), &mut layouts);
        assert!(!Arc::ptr_eq(&a.bounds, &b.bounds));
    }

    #[test]
    fn keeps_baseline_at_window_start() {
        let mut m = MeasurementStore::new(600.0);
        for t in (0..=1200).step_by(30) {
            m.record("a", s(f64::from(t)));
        }
        let n = &m.nodes["a"];
        // window start = 600: the baseline is the sample at 600, the newest 1200
        assert_eq!(n.older.front().unwrap().at_unix_seconds, 600.0);
        assert_eq!(n.newest.at_unix_seconds, 1200.0);
        // 20 older samples: the deque grew to that and no further
        assert_eq!((n.older.len(), n.older.capacity()), (20, 21));
        assert_eq!(m.inputs().len(), 1);
        assert!(m.inputs()[0].earlier.is_some());
    }

    #[test]
    fn single_sample_is_lifetime_and_failures_clear_on_success() {
        let mut m = MeasurementStore::new(600.0);
        m.record_failure("b", NodeFailure { reason: "timeout".into(), message: "t".into(), at_unix_seconds: 1.0 });
        m.record("a", s(10.0));
        assert!(m.inputs()[0].earlier.is_none());
        assert_eq!(m.failures().len(), 1);
        m.record("b", s(11.0));
        assert!(m.failures().is_empty());
        m.retain_nodes(&["b".into()]);
        assert_eq!(m.nodes_with_data(), 1);
    }

    #[test]
    fn a_window_goes_on_from_kube_proxy_to_the_agent_but_restarts_around_prometheus() {
        let mut m = MeasurementStore::new(600.0);
        m.record_via("a", s(0.0), NodeSource::KubeProxy);
        m.record_via("a", s(30.0), NodeSource::Agent);
        assert_eq!(m.inputs()[0].earlier.as_ref().map(|_| ()), Some(()), "the same counters: a delta across the switch");
        assert_eq!(m.node_sources().collect::<Vec<_>>(), [("a", NodeSource::Agent)]);
        m.record_via("a", s(60.0), NodeSource::Prometheus);
        assert!(m.inputs()[0].earlier.is_none(), "a Prometheus window stands alone");
        m.record_via("a", s(90.0), NodeSource::Agent);
        assert!(m.inputs()[0].earlier.is_none(), "no delta against a window");
        m.record_via("a", s(120.0), NodeSource::KubeProxy);
        assert!(m.inputs()[0].earlier.is_some());
        m.record("b", s(120.0));
        assert_eq!(m.node_sources().collect::<Vec<_>>(), [("a", NodeSource::KubeProxy)], "b's source is unknown");
        assert_eq!(NodeSource::KubeProxy.as_str(), "kube-proxy");
    }
}
