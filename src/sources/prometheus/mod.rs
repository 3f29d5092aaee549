//! The Prometheus source (adapter): instead of scraping every kube-proxy, ask a Prometheus
//! server that already does, through its HTTP API (`GET /api/v1/query`), and feed the same core
//! maths.
//!
//! Queries (`W` is the window, e.g. `600s`):
//!
//! | what | PromQL |
//! |---|---|
//! | sync buckets | `sum by (node, instance, le) (increase(kubeproxy_sync_proxy_rules_duration_seconds_bucket[W]))` |
//! | network programming buckets | the same over `kubeproxy_network_programming_duration_seconds_bucket` |
//! | sync native histogram | `sum by (node, instance) (increase(kubeproxy_sync_proxy_rules_duration_seconds[W]))` |
//! | network programming native histogram | the same over `kubeproxy_network_programming_duration_seconds` |
//! | last sync | `min by (node, instance, ip_family) (kubeproxy_sync_proxy_rules_last_timestamp_seconds)` |
//! | last queued | `max by (node, instance, ip_family) (kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds)` |
//! | iptables rules | `sum by (node, instance) (kubeproxy_sync_proxy_rules_iptables_total)` |
//!
//! Per instance the bucket vectors become [`Histogram`]s (`le` parsed, `"+Inf"` included, extra
//! labels such as `ip_family` already summed away by the query) in a [`KubeProxyScrape`], and
//! so a [`NodeInput`] with `earlier: None`: `increase()` over the window already is the
//! interval (Prometheus handles counter resets), so the core takes no further delta. The
//! oldest last-sync and newest last-queued match what the scrape parser does with dual-stack
//! series (worst staleness), and the rule count is summed over `table` as the parser does.
//!
//! # Native histograms
//!
//! kube-proxy 1.37 serves native histograms (schema 3) for its sync and network-programming
//! durations in the protobuf exposition only. Prometheus stores them when the scrape config (or
//! `global`) sets `scrape_native_histograms: true` (Prometheus 3.8 and later; before, the
//! `--enable-feature=native-histograms` flag), which also makes it ask for protobuf first; it
//! then keeps the classic `_bucket` series only with `always_scrape_classic_histograms: true`.
//! A native series has the family's own name, no `_bucket` suffix, and the same name over the
//! text exposition holds nothing, so without native ingestion (or with an older kube-proxy)
//! the native queries answer an empty vector and the snapshot is exactly the classic one. With
//! both, an instance gets `sync` and `sync_native` (and the network-programming pair), and the
//! model prefers the native one.
//!
//! The API's native histogram samples are turned back into [`NativeHistogram`]s by
//! [`ApiHistogram::to_native`] ([`api_histogram`]).
//!
//! Instance keys: the `node` label when the series carry one (kube-prometheus relabels it in),
//! else the `instance` label without its port (`10.0.0.7:10249` -> `10.0.0.7`).
//!
//! Because every answer is already a window, a snapshot must not be recorded into a
//! long-lived [`MeasurementStore`] (its deltas between two windows would be meaningless):
//! [`PrometheusSnapshot::into_store`] builds a fresh store per query, which [`PrometheusLoop`]
//! swaps in.

mod api;
mod api_histogram;
mod error;

use super::fetch::{DEFAULT_MAX_BODY_BYTES, FetchError, read_limited};
use super::oneshot::unix_now;
use super::proxy_config::read_proxy_configmap;
use super::scrape::Jitter;
use crate::core::exposition::{Bucket, Histogram, HistogramFamily, KubeProxyScrape, NativeHistogram};
use crate::core::measure::{MeasurementStore, NodeFailure, Sample, reason};
use crate::core::model::NodeInput;
use crate::core::proxyconfig::ResolvedProxyConfig;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use api::{VectorSample, decode_query_response, parse_sample_value};
pub use api_histogram::{ApiBucket, ApiHistogram, ApiHistogramError, BoundaryRule, BucketProblem};
pub use error::PrometheusError;

/// The key a series is stored under: a non-empty `node` label, else `instance` without its
/// port (`10.0.0.7:10249` -> `10.0.0.7`, `[fd00::7]:10249` -> `fd00::7`). `None` when the
/// series has neither.
pub fn instance_key(labels: &BTreeMap<String, String>) -> Option<String> {
    if let Some(node) = labels.get("node").filter(|n| !n.is_empty()) {
        return Some(node.clone());
    }
    let instance = labels.get("instance").filter(|i| !i.is_empty())?;
    if let Some((host, _)) = instance.strip_prefix('[').and_then(|rest| rest.split_once(']')) {
        return Some(host.to_string());
    }
    // host:port (one colon); a bare IPv6 address (several colons) is kept whole
    match instance.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.chars().all(|c| c.is_ascii_digit()) => Some(host.to_string()),
        _ => Some(instance.clone()),
    }
}

/// The PromQL of each query for a window of `window_seconds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queries {
    /// Sync-duration buckets increase over the window, per instance and `le`.
    pub sync_buckets: String,
    /// Network-programming buckets increase over the window, per instance and `le`.
    pub network_programming_buckets: String,
    /// Sync-duration native histogram increase over the window, per instance.
    pub sync_native: String,
    /// Network-programming native histogram increase over the window, per instance.
    pub network_programming_native: String,
    /// Oldest last successful sync per instance.
    pub last_sync: String,
    /// Newest last queued sync per instance.
    pub last_queued: String,
    /// iptables rules owned, summed over tables, per instance.
    pub iptables_rules: String,
}

impl Queries {
    /// The queries for a window of `window_seconds` (rounded to whole seconds, at least 1).
    pub fn new(window_seconds: f64) -> Self {
        let w = format!("{}s", window_seconds.round().max(1.0) as u64);
        let buckets = |family: HistogramFamily| format!("sum by (node, instance, le) (increase({}_bucket[{w}]))", family.name());
        let native = |family: HistogramFamily| format!("sum by (node, instance) (increase({}[{w}]))", family.name());
        Self {
            sync_buckets: buckets(HistogramFamily::Sync),
            network_programming_buckets: buckets(HistogramFamily::NetworkProgramming),
            sync_native: native(HistogramFamily::Sync),
            network_programming_native: native(HistogramFamily::NetworkProgramming),
            // per proxier: a family's queue is paired with its own sync ([`KubeProxyScrape::waiting`])
            last_sync: "min by (node, instance, ip_family) (kubeproxy_sync_proxy_rules_last_timestamp_seconds)".into(),
            last_queued: "max by (node, instance, ip_family) (kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds)".into(),
            iptables_rules: "sum by (node, instance) (kubeproxy_sync_proxy_rules_iptables_total)".into(),
        }
    }
}

/// The per-instance result of one round of queries.
#[derive(Debug, Clone)]
pub struct PrometheusSnapshot {
    /// One input per instance with at least one histogram, sorted by key; `earlier` is `None`.
    pub inputs: Vec<NodeInput>,
    /// Instances whose series could not be turned into a histogram (e.g. no `+Inf` bucket),
    /// reason `parse`.
    pub failures: BTreeMap<String, NodeFailure>,
    /// When the queries were answered, Unix seconds.
    pub at_unix_seconds: f64,
}

impl PrometheusSnapshot {
    /// A fresh store holding exactly this snapshot (one sample per instance, so the analysis
    /// uses each window as it is), with the failures recorded.
    pub fn into_store(self, window_seconds: f64) -> MeasurementStore {
        let mut store = MeasurementStore::new(window_seconds);
        for input in self.inputs {
            store.record_via(
                &input.node,
                Sample { at_unix_seconds: self.at_unix_seconds, scrape: input.later, proxy_mode: input.proxy_mode },
                crate::core::measure::NodeSource::Prometheus,
            );
        }
        for (node, f) in self.failures {
            store.record_failure(&node, f);
        }
        store
    }
}

/// The vectors of one round of queries, by role.
#[derive(Debug, Clone, Default)]
pub struct Vectors {
    /// Answer of [`Queries::sync_buckets`].
    pub sync_buckets: Vec<VectorSample>,
    /// Answer of [`Queries::network_programming_buckets`].
    pub network_programming_buckets: Vec<VectorSample>,
    /// Answer of [`Queries::sync_native`] (empty when the server holds no native histograms).
    pub sync_native: Vec<VectorSample>,
    /// Answer of [`Queries::network_programming_native`].
    pub network_programming_native: Vec<VectorSample>,
    /// Answer of [`Queries::last_sync`].
    pub last_sync: Vec<VectorSample>,
    /// Answer of [`Queries::last_queued`].
    pub last_queued: Vec<VectorSample>,
    /// Answer of [`Queries::iptables_rules`].
    pub iptables_rules: Vec<VectorSample>,
}

/// Turns the query answers into per-instance inputs (pure but for a warning log). Classic
/// series without an `le` label or with an unreadable one, float samples in a native answer,
/// and series without an instance key, are ignored; an instance whose buckets have no `+Inf`
/// bound, or whose native histogram does not convert ([`ApiHistogram::to_native`]), gets a
/// `parse` failure naming the family, which is logged and dropped when the instance has another
/// histogram to measure (e.g. a native histogram with custom buckets beside the classic ones).
/// Native histograms of one key (several instances relabelled to one node) are added.
pub fn build_snapshot(v: &Vectors, at_unix_seconds: f64) -> PrometheusSnapshot {
    let mut scrapes: BTreeMap<String, KubeProxyScrape> = BTreeMap::new();
    let mut failures = BTreeMap::new();
    let parse_failure = |message: String| NodeFailure { reason: reason::PARSE.into(), message, at_unix_seconds };
    for (family, samples) in [(HistogramFamily::Sync, &v.sync_buckets), (HistogramFamily::NetworkProgramming, &v.network_programming_buckets)] {
        for (key, h) in classic_per_instance(samples) {
            match h {
                Ok(h) => {
                    let scrape = scrapes.entry(key).or_default();
                    match family {
                        HistogramFamily::Sync => scrape.sync = Some(h),
                        _ => scrape.network_programming = Some(h),
                    }
                }
                Err(e) => {
                    failures.insert(key, parse_failure(format!("Prometheus series of {}: {e}", family.name())));
                }
            }
        }
    }
    for (family, samples) in [(HistogramFamily::Sync, &v.sync_native), (HistogramFamily::NetworkProgramming, &v.network_programming_native)] {
        for (key, h) in native_per_instance(samples) {
            match h {
                Ok(h) => {
                    let scrape = scrapes.entry(key).or_default();
                    match family {
                        HistogramFamily::Sync => scrape.sync_native = Some(h),
                        _ => scrape.network_programming_native = Some(h),
                    }
                }
                Err(e) => {
                    failures.insert(key, parse_failure(format!("Prometheus native histogram of {}: {e}", family.name())));
                }
            }
        }
    }
    // gauges only for instances that have a histogram (an instance with gauges alone has
    // nothing to measure)
    let mut gauge = |samples: &[VectorSample], set: fn(&mut KubeProxyScrape, f64, &str)| {
        for s in samples {
            if let Some(scrape) = instance_key(&s.labels).and_then(|k| scrapes.get_mut(&k)) {
                set(scrape, s.value, s.labels.get("ip_family").map_or("", String::as_str));
            }
        }
    };
    gauge(&v.last_sync, |s, x, family| {
        s.last_sync_timestamp_seconds = Some(s.last_sync_timestamp_seconds.map_or(x, |o| o.min(x)));
        s.sync_timestamps_of(family).last_synced_seconds = Some(x);
    });
    gauge(&v.last_queued, |s, x, family| {
        s.last_queued_timestamp_seconds = Some(s.last_queued_timestamp_seconds.map_or(x, |o| o.max(x)));
        s.sync_timestamps_of(family).last_queued_seconds = Some(x);
    });
    gauge(&v.iptables_rules, |s, x, _| s.iptables_rules_total = Some(s.iptables_rules_total.unwrap_or(0.0) + x));
    for k in scrapes.keys() {
        if let Some(f) = failures.remove(k) {
            tracing::warn!(instance = %k, "{}; measured from its other histograms", f.message);
        }
    }
    let inputs = scrapes
        .into_iter()
        .map(|(node, mut later)| {
            later.scraped_at_unix_seconds = Some(at_unix_seconds);
            NodeInput { node, later, earlier: None, proxy_mode: None }
        })
        .collect();
    PrometheusSnapshot { inputs, failures, at_unix_seconds }
}

/// The classic histogram of each instance key from one family's `_bucket` series (float
/// samples; series without an instance key or a readable `le` are skipped), or why its
/// buckets do not make one (no `+Inf` bound, ...).
fn classic_per_instance(samples: &[VectorSample]) -> BTreeMap<String, Result<Histogram, String>> {
    let mut per_key: BTreeMap<String, Vec<Bucket>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.histogram.is_none()) {
        let (Some(key), Some(le)) = (instance_key(&s.labels), s.labels.get("le").and_then(|l| parse_sample_value(l))) else {
            continue;
        };
        per_key.entry(key).or_default().push(Bucket { upper_bound_seconds: le, count: s.value });
    }
    per_key.into_iter().map(|(key, buckets)| (key, Histogram::new(buckets, None).map_err(|e| e.to_string()))).collect()
}

/// The native histogram of each instance key from one family's native series (samples without
/// a histogram or an instance key are skipped): the series of one key are added (several
/// instances relabelled to one node); one that does not convert fails its key.
fn native_per_instance(samples: &[VectorSample]) -> BTreeMap<String, Result<NativeHistogram, ApiHistogramError>> {
    let mut per_key: BTreeMap<String, Result<NativeHistogram, ApiHistogramError>> = BTreeMap::new();
    for s in samples {
        let (Some(key), Some(h)) = (instance_key(&s.labels), s.histogram.as_ref()) else {
            continue;
        };
        let h = h.to_native();
        let merged = match per_key.remove(&key) {
            None => h,
            Some(Ok(a)) => h.map(|b| a.add(&b)),
            Some(Err(e)) => Err(e),
        };
        per_key.insert(key, merged);
    }
    per_key
}

/// A Prometheus server to query.
#[derive(Debug, Clone)]
pub struct PrometheusSource {
    query_url: reqwest::Url,
    client: reqwest::Client,
    window_seconds: f64,
}

impl PrometheusSource {
    /// A source for the server at `base_url` (e.g. `http://prometheus.monitoring:9090`, a path
    /// prefix such as `/prometheus` kept), analysing `window` (default 10 minutes in the
    /// operator), each request bounded by `timeout`.
    ///
    /// Errors: `base_url` is not an http(s) URL.
    pub fn new(base_url: &str, window: Duration, timeout: Duration) -> Result<Self, PrometheusError> {
        let url_err = |message: String| PrometheusError::Url { url: base_url.to_string(), message };
        let mut base = reqwest::Url::parse(base_url).map_err(|e| url_err(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(url_err("expected http:// or https://".into()));
        }
        if !base.path().ends_with('/') {
            let p = format!("{}/", base.path());
            base.set_path(&p);
        }
        base.set_query(None);
        let query_url = base.join("api/v1/query").map_err(|e| url_err(e.to_string()))?;
        Ok(Self { query_url, client: super::fetch::keep_alive_http_client(timeout), window_seconds: window.as_secs_f64() })
    }

    /// The `/api/v1/query` URL used.
    pub fn query_url(&self) -> &str {
        self.query_url.as_str()
    }

    /// The analysed window, seconds.
    pub fn window_seconds(&self) -> f64 {
        self.window_seconds
    }

    /// Runs one instant query and returns its vector.
    ///
    /// Errors: no answer ([`PrometheusError::Transport`]), `"status": "error"`
    /// ([`PrometheusError::Api`]), another non-2xx answer ([`PrometheusError::Http`]), or a
    /// body that is not an instant vector ([`PrometheusError::Decode`]).
    pub async fn query(&self, promql: &str) -> Result<Vec<VectorSample>, PrometheusError> {
        let transport = |e: FetchError| PrometheusError::Transport { url: self.query_url.to_string(), message: e.to_string() };
        let resp = self.client.get(self.query_url.clone()).query(&[("query", promql)]).send().await.map_err(|e| transport(e.into()))?;
        let status = resp.status().as_u16();
        let body = read_limited(resp, DEFAULT_MAX_BODY_BYTES).await.map_err(transport)?;
        decode_query_response(promql, status, &String::from_utf8_lossy(&body))
    }

    /// Runs the seven queries of [`Queries`] concurrently and builds the snapshot. The
    /// iptables rule query is optional: its failure is ignored (only iptables mode has it).
    /// The native queries answer an empty vector when the server holds no native histograms
    /// (then the snapshot is the classic one alone).
    ///
    /// Errors: the first failure of the six required queries.
    pub async fn fetch(&self) -> Result<PrometheusSnapshot, PrometheusError> {
        let q = Queries::new(self.window_seconds);
        let (sync, np, sync_native, np_native, last, queued, rules) = tokio::join!(
            self.query(&q.sync_buckets),
            self.query(&q.network_programming_buckets),
            self.query(&q.sync_native),
            self.query(&q.network_programming_native),
            self.query(&q.last_sync),
            self.query(&q.last_queued),
            self.query(&q.iptables_rules),
        );
        let v = Vectors {
            sync_buckets: sync?,
            network_programming_buckets: np?,
            sync_native: sync_native?,
            network_programming_native: np_native?,
            last_sync: last?,
            last_queued: queued?,
            iptables_rules: rules.unwrap_or_default(),
        };
        Ok(build_snapshot(&v, unix_now()))
    }
}

/// The measurement loop of the Prometheus source: every interval (plus up to 10% jitter) it
/// queries, replaces the shared store with [`PrometheusSnapshot::into_store`], and bumps the
/// generation counter. A failed round keeps the previous store (the plan keeps its last good
/// measurement) and bumps nothing. Stops when `cancel` fires.
pub struct PrometheusLoop {
    source: PrometheusSource,
    store: Arc<Mutex<MeasurementStore>>,
    generation: watch::Sender<u64>,
    interval: Duration,
    last_error: Arc<Mutex<Option<String>>>,
    config: Option<ConfigRefresh>,
    rounds: AtomicU64,
}

/// Where [`PrometheusLoop`] reads kube-proxy's configuration from (the ConfigMap: with this
/// source the metrics port and its `/configz` are usually not reachable).
struct ConfigRefresh {
    client: kube::Client,
    namespace: String,
    shared: Arc<RwLock<ResolvedProxyConfig>>,
    every: u64,
}

impl PrometheusLoop {
    /// A loop with the default 30 s interval.
    pub fn new(source: PrometheusSource, store: Arc<Mutex<MeasurementStore>>, generation: watch::Sender<u64>) -> Self {
        Self { source, store, generation, interval: super::scrape::DEFAULT_INTERVAL, last_error: Arc::default(), config: None, rounds: AtomicU64::new(0) }
    }

    /// Also reads kube-proxy's configuration from its ConfigMap in `namespace`
    /// ([`crate::sources::scrape::read_proxy_configmap`]) on the first round and every
    /// `every` rounds (at least 1), publishing it into `shared`; when it cannot be read,
    /// `shared` gets the 1 s default with the reason in its notes.
    pub fn with_configmap(mut self, client: kube::Client, namespace: &str, shared: Arc<RwLock<ResolvedProxyConfig>>, every: u64) -> Self {
        self.config = Some(ConfigRefresh { client, namespace: namespace.to_string(), shared, every: every.max(1) });
        self
    }

    /// Sets the time between rounds.
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The last round's error (`None` after a success), for a `MetricsUnavailable` condition.
    pub fn last_error(&self) -> Arc<Mutex<Option<String>>> {
        Arc::clone(&self.last_error)
    }

    /// One round now. Returns the number of instances measured.
    ///
    /// Errors: the round's query error (the store is left as it was).
    pub async fn run_once(&self) -> Result<usize, PrometheusError> {
        let start = Instant::now();
        let round = self.rounds.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.config.as_ref().filter(|c| round.is_multiple_of(c.every)) {
            let resolved = match read_proxy_configmap(&c.client, &c.namespace).await {
                Ok((source, config)) => ResolvedProxyConfig::from_config(config, source, Vec::new()),
                Err(e) => ResolvedProxyConfig { notes: vec![e.to_string()], ..ResolvedProxyConfig::default() },
            };
            *c.shared.write().unwrap_or_else(PoisonError::into_inner) = resolved;
        }
        let result = self.source.fetch().await;
        let mut last_error = self.last_error.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(snapshot) => {
                let n = snapshot.inputs.len();
                let fresh = snapshot.into_store(self.source.window_seconds);
                *self.store.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
                *last_error = None;
                drop(last_error);
                self.generation.send_modify(|g| *g += 1);
                tracing::info!(instances = n, elapsed_ms = start.elapsed().as_millis() as u64, "Prometheus query round");
                Ok(n)
            }
            Err(e) => {
                tracing::warn!(error = %e, "Prometheus query round failed; keeping the previous measurement");
                *last_error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Runs rounds until `cancel` fires: one immediately, then every interval plus jitter.
    pub async fn run(self, cancel: CancellationToken) {
        let mut jitter = Jitter::seeded();
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = self.run_once() => {}
            }
            if !jitter.sleep(self.interval, &cancel).await {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    pub(super) fn s(pairs: &[(&str, &str)], value: f64) -> VectorSample {
        VectorSample { labels: labels(pairs), timestamp: 1.7e9, value, histogram: None }
    }

    #[test]
    fn keys() {
        assert_eq!(instance_key(&labels(&[("instance", "10.0.0.1:10249")])).as_deref(), Some("10.0.0.1"));
        assert_eq!(instance_key(&labels(&[("instance", "[fd00::1]:10249")])).as_deref(), Some("fd00::1"));
        assert_eq!(instance_key(&labels(&[("instance", "fd00::1")])).as_deref(), Some("fd00::1"));
        assert_eq!(instance_key(&labels(&[("instance", "node-a")])).as_deref(), Some("node-a"));
        assert_eq!(instance_key(&labels(&[("instance", "10.0.0.1:10249"), ("node", "node-a")])).as_deref(), Some("node-a"));
        assert_eq!(instance_key(&labels(&[("instance", "10.0.0.1:10249"), ("node", "")])).as_deref(), Some("10.0.0.1"));
        assert_eq!(instance_key(&labels(&[("job", "kube-proxy")])), None);
    }

    #[test]
    fn queries_name_the_window_and_families() {
        let q = Queries::new(600.0);
        assert_eq!(q.sync_buckets, "sum by (node, instance, le) (increase(kubeproxy_sync_proxy_rules_duration_seconds_bucket[600s]))");
        assert!(q.network_programming_buckets.contains("kubeproxy_network_programming_duration_seconds_bucket[600s]"));
        assert_eq!(Queries::new(0.2).sync_buckets, Queries::new(1.0).sync_buckets);
    }

    #[test]
    fn snapshot_from_vectors() {
        let a = [("instance", "10.0.0.1:10249")];
        let b = [("instance", "10.0.0.2:10249")];
        let with_le = |base: &[(&'static str, &'static str)], le: &'static str| {
            let mut v = base.to_vec();
            v.push(("le", le));
            v
        };
        let v = Vectors {
            sync_buckets: vec![
                s(&with_le(&a, "0.128"), 3.0),
                s(&with_le(&a, "0.256"), 9.0),
                s(&with_le(&a, "+Inf"), 10.0),
                s(&with_le(&b, "0.128"), 1.0), // b: no +Inf
                s(&[("le", "1")], 1.0),        // no instance: ignored
            ],
            network_programming_buckets: vec![s(&with_le(&a, "1"), 1.0), s(&with_le(&a, "+Inf"), 1.5)],
            sync_native: vec![],
            network_programming_native: vec![],
            last_sync: vec![s(&a, 100.0)],
            last_queued: vec![s(&a, 220.0), s(&b, 5.0)],
            iptables_rules: vec![s(&a, 30.0)],
        };
        let snap = build_snapshot(&v, 42.0);
        assert_eq!(snap.inputs.len(), 1);
        let n = &snap.inputs[0];
        assert_eq!(n.node, "10.0.0.1");
        assert!(n.earlier.is_none());
        let sync = n.later.sync.as_ref().unwrap();
        assert_eq!(sync.count(), 10.0);
        assert_eq!(n.later.network_programming.as_ref().unwrap().count(), 1.5);
        assert_eq!(n.later.last_sync_timestamp_seconds, Some(100.0));
        assert_eq!(n.later.last_queued_timestamp_seconds, Some(220.0));
        assert_eq!(n.later.iptables_rules_total, Some(30.0));
        let f = &snap.failures["10.0.0.2"];
        assert_eq!(f.reason, "parse");
        assert!(f.message.contains("kubeproxy_sync_proxy_rules_duration_seconds") && f.message.contains("+Inf"), "{}", f.message);
        let store = snap.into_store(600.0);
        assert_eq!(store.nodes_with_data(), 1);
        assert_eq!(store.failures().len(), 1);
        assert!(store.inputs()[0].earlier.is_none());
    }

    #[test]
    fn source_urls() {
        let s = PrometheusSource::new("http://prom:9090", Duration::from_secs(600), Duration::from_secs(5)).unwrap();
        assert_eq!(s.query_url(), "http://prom:9090/api/v1/query");
        let s = PrometheusSource::new("https://x/prometheus", Duration::from_secs(600), Duration::from_secs(5)).unwrap();
        assert_eq!(s.query_url(), "https://x/prometheus/api/v1/query");
        assert!(matches!(PrometheusSource::new("prom:9090", Duration::from_secs(1), Duration::from_secs(1)), Err(PrometheusError::Url { .. })));
    }

    /// The answers of a real Prometheus 3.16 (tests/data/prometheus/capture.py).
    pub(super) fn captured() -> serde_json::Value {
        serde_json::from_str(include_str!("../../../tests/data/prometheus/native-histogram-answers.json")).unwrap()
    }

    /// The captured answer to `query`, decoded as the source decodes it.
    pub(super) fn answer(query: &str) -> Vec<VectorSample> {
        let c = captured();
        let a = c["answers"].as_array().unwrap().iter().find(|a| a["query"] == query).unwrap_or_else(|| panic!("no capture of {query}"));
        decode_query_response(query, 200, &a["answer"].to_string()).unwrap()
    }

    pub(super) const KP: &str = "kubeproxy_sync_proxy_rules_duration_seconds";

    #[test]
    fn native_queries() {
        let q = Queries::new(600.0);
        assert_eq!(q.sync_native, "sum by (node, instance) (increase(kubeproxy_sync_proxy_rules_duration_seconds[600s]))");
        assert_eq!(q.network_programming_native, "sum by (node, instance) (increase(kubeproxy_network_programming_duration_seconds[600s]))");
    }

    #[test]
    fn snapshot_with_both_kinds() {
        let classic = answer(&format!("sum by (node, instance, le) ({KP}_bucket)"));
        let native = answer(&format!("sum by (node, instance) ({KP})"));
        let gauges = vec![s(&[("node", "node-a")], 100.0)];
        let v = Vectors { sync_buckets: classic.clone(), sync_native: native.clone(), last_sync: gauges.clone(), ..Vectors::default() };
        let snap = build_snapshot(&v, 1.0);
        assert!(snap.failures.is_empty(), "{:?}", snap.failures);
        assert_eq!(snap.inputs.len(), 1);
        let n = &snap.inputs[0].later;
        assert_eq!(snap.inputs[0].node, "node-a");
        assert_eq!((n.sync.as_ref().unwrap().count(), n.sync_native.as_ref().unwrap().count()), (3.0, 3.0));
        assert_eq!(n.sync_native.as_ref().unwrap().positive(), &[(-37, 1.0), (-21, 2.0)]);
        assert!(n.network_programming_native.is_none());
        assert_eq!(n.last_sync_timestamp_seconds, Some(100.0));

        // no native series on the server: the classic snapshot exactly as without the queries
        let without = build_snapshot(&Vectors { sync_buckets: classic.clone(), last_sync: gauges, ..Vectors::default() }, 1.0);
        assert!(without.inputs[0].later.sync_native.is_none());
        assert_eq!(without.inputs[0].later.sync, n.sync);

        // native only (classic buckets not kept by the server)
        let only = build_snapshot(&Vectors { sync_native: native.clone(), ..Vectors::default() }, 1.0);
        assert!(only.inputs[0].later.sync.is_none() && only.inputs[0].later.sync_native.is_some());

        // two instances relabelled to one node: added
        let mut twice = native.clone();
        twice.push(VectorSample { labels: labels(&[("node", "node-a"), ("instance", "10.0.0.9:10249")]), ..native[0].clone() });
        let added = build_snapshot(&Vectors { sync_native: twice, ..Vectors::default() }, 1.0);
        assert_eq!(added.inputs[0].later.sync_native.as_ref().unwrap().positive(), &[(-37, 2.0), (-21, 4.0)]);

        // a native histogram that does not convert: a failure alone, dropped beside the classic
        let custom = decode_query_response(
            "q",
            200,
            r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"node":"node-a"},"histogram":[1,{"count":"1","sum":"1","buckets":[[0,"0.005","0.01","1"]]}]}]}}"#,
        )
        .unwrap();
        let failed = build_snapshot(&Vectors { sync_native: custom.clone(), ..Vectors::default() }, 1.0);
        assert!(failed.inputs.is_empty());
        let f = &failed.failures["node-a"];
        assert_eq!(f.reason, "parse");
        assert!(f.message.starts_with(&format!("Prometheus native histogram of {KP}: ")) && f.message.contains("custom buckets"), "{}", f.message);
        let beside = build_snapshot(&Vectors { sync_buckets: classic, sync_native: custom, ..Vectors::default() }, 1.0);
        assert!(beside.failures.is_empty());
        assert!(beside.inputs[0].later.sync.is_some() && beside.inputs[0].later.sync_native.is_none());

        // float samples in a native answer are ignored
        let floats = build_snapshot(&Vectors { sync_native: vec![s(&[("node", "node-a")], 1.0)], ..Vectors::default() }, 1.0);
        assert!(floats.inputs.is_empty() && floats.failures.is_empty());
    }
}
