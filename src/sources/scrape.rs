//! The kube-proxy scrape source (adapter): find every kube-proxy, read its `/metrics` and
//! `/proxyMode` concurrently with a bound on requests in flight and a per-target timeout,
//! classify failures, and record them into the rolling [`MeasurementStore`]. The loop that does
//! this on an interval with jitter, with `--source auto`'s fallbacks, is
//! [`super::scrape_loop`].
//!
//! Pieces, each usable on its own:
//! - targets: [`discover`] (kube-proxy pods through the API: `kube-system`, `k8s-app=kube-proxy`,
//!   port 10249) or a static list ([`parse_static_targets`], `NODE=http://ip:port`) for tests
//!   and out-of-cluster runs; [`TargetSource`] is either;
//! - [`scrape_once`] / [`scrape_all`]: one target / every target, each giving a
//!   [`ScrapeOutcome`] whose failure is a [`NodeFailure`] with a [`reason`] label:
//!   `connection_refused` (the message carries the `metricsBindAddress` hint), `timeout`,
//!   `http_status`, `parse` (the message names the family and the line) or `other`;
//! - [`record_outcomes`]: outcomes into the store;
//! - kube-proxy's configuration: [`fetch_configz`], [`read_proxy_configmap`], and
//!   [`resolve_proxy_config`] (`/configz`, else the ConfigMap, else 1 s, with the source named);
//! - [`Jitter`]: the interval plus up to 10% of it, for the measurement loops
//!   ([`super::scrape_loop`], [`super::prometheus`]);
//! - [`ScrapeMetrics`]: `scrape_errors_total{reason}`, `scrape_duration_seconds`,
//!   `scrape_targets` for the process registry.

use super::error::SourceError;
use super::fetch::{FetchError, ScrapeBody, connect_hint, fetch_scrape, get_limited};
use super::oneshot::{decode_utf8, unix_now};
use crate::core::exposition::{ACCEPT_PROTOBUF_FIRST, KubeProxyScrape, ScrapeError, parse_scrape};
use crate::core::measure::{MeasurementStore, NodeFailure, NodeSource, Sample, reason};
use crate::core::model::ProxyMode;
use crate::core::proxyconfig::{self, Dataplane, ProxyConfig, ResolvedProxyConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// Default namespace of the kube-proxy pods.
pub const DEFAULT_NAMESPACE: &str = "kube-system";
/// Default label selector of the kube-proxy pods.
pub const DEFAULT_SELECTOR: &str = "k8s-app=kube-proxy";
/// Default label selector of Cilium agent pods (the `cilium` DaemonSet of Cilium's Helm chart
/// and of `cilium install`), looked for in every namespace when no kube-proxy pod is found.
pub const DEFAULT_CILIUM_SELECTOR: &str = "k8s-app=cilium";
/// Default kube-proxy metrics port (`metricsBindAddress`).
pub const DEFAULT_PORT: u16 = 10249;
/// Default time between scrape cycles.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// Default per-target timeout (both requests of a target together).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on targets scraped at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;
/// The jitter added to each interval is uniform in `[0, JITTER_FRACTION * interval]`.
pub const JITTER_FRACTION: f64 = 0.1;

/// One kube-proxy to scrape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// The key its samples are stored under: the node name (`spec.nodeName`) for discovered
    /// pods, the given name for static targets.
    pub node: String,
    /// Scheme, host and port without a trailing slash, e.g. `http://10.0.0.7:10249` or
    /// `http://[fd00::7]:10249`.
    pub base_url: String,
}

impl Target {
    /// A target named `node` at `base_url` (a trailing `/` and a trailing `/metrics` are removed).
    pub fn new(node: impl Into<String>, base_url: &str) -> Self {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/metrics").unwrap_or(base);
        Self { node: node.into(), base_url: base.to_string() }
    }

    /// A target at `ip:port` over plain HTTP (IPv6 addresses are bracketed).
    pub fn from_ip(node: impl Into<String>, ip: IpAddr, port: u16) -> Self {
        Self { node: node.into(), base_url: format!("http://{}", SocketAddr::new(ip, port)) }
    }

    /// `base_url` + `path` (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    /// The port of `base_url`, when it names one.
    pub fn port(&self) -> Option<u16> {
        reqwest::Url::parse(&self.base_url).ok().and_then(|u| u.port_or_known_default())
    }
}

/// Parses one static target: `NODE=http://host:port` (the URL may end in `/metrics`), or a bare
/// `http://host:port` named after its `host:port`.
///
/// Errors: not an http(s) URL, or an empty node name.
pub fn parse_static_target(spec: &str) -> Result<Target, SourceError> {
    let spec = spec.trim();
    let (node, url) = match spec.split_once('=') {
        Some((n, u)) if !n.contains("://") => (n.trim().to_string(), u.trim()),
        _ => (String::new(), spec),
    };
    let bad = |message: String| SourceError::Target { spec: spec.to_string(), message };
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(format!("{url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(bad(format!("expected http://host:port, got {url:?}")));
    }
    let node = if node.is_empty() {
        if spec.contains('=') && !spec.split_once('=').is_some_and(|(n, _)| n.contains("://")) {
            return Err(bad("empty node name before '='".to_string()));
        }
        match parsed.port() {
            Some(p) => format!("{}:{p}", parsed.host_str().unwrap_or_default()),
            None => parsed.host_str().unwrap_or_default().to_string(),
        }
    } else {
        node
    };
    Ok(Target::new(node, url))
}

/// Parses a static target list (see [`parse_static_target`]); errors name the bad entry.
/// Duplicate node names are an error (their samples would mix).
pub fn parse_static_targets<S: AsRef<str>>(specs: &[S]) -> Result<Vec<Target>, SourceError> {
    let mut out: Vec<Target> = Vec::with_capacity(specs.len());
    for s in specs {
        let t = parse_static_target(s.as_ref())?;
        if out.iter().any(|o| o.node == t.node) {
            return Err(SourceError::Target { spec: s.as_ref().to_string(), message: format!("node {:?} is listed twice", t.node) });
        }
        out.push(t);
    }
    Ok(out)
}

/// Where and how to find kube-proxy pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// Namespace of the kube-proxy pods (default `kube-system`).
    pub namespace: String,
    /// Label selector (default `k8s-app=kube-proxy`).
    pub selector: String,
    /// Metrics port (default 10249).
    pub port: u16,
    /// Label selector of Cilium agent pods, looked for in all namespaces when no kube-proxy pod
    /// is found (default `k8s-app=cilium`; empty: never look).
    pub cilium_selector: String,
}

impl Default for Discovery {
    fn default() -> Self {
        Self { namespace: DEFAULT_NAMESPACE.into(), selector: DEFAULT_SELECTOR.into(), port: DEFAULT_PORT, cilium_selector: DEFAULT_CILIUM_SELECTOR.into() }
    }
}

/// The dataplane of a cluster without kube-proxy pods, from the Cilium agent pods found there
/// (`agents`, listed by `selector`): with at least one agent not being deleted and not
/// `Failed`/`Succeeded`, Cilium does the Service load-balancing itself (kube-proxy replacement),
/// so the mode is `ebpf`. `None` without such a pod.
///
/// Cilium's replacement programs Services into eBPF maps from its own watch and exports no
/// kube-proxy histograms, so there is no sync p99 to measure: sizing uses the policy default,
/// and the note says so.
pub fn cilium_dataplane(agents: &[Pod], selector: &str) -> Option<Dataplane> {
    let live: Vec<&Pod> = agents
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Failed" | "Succeeded")))
        .collect();
    let first = live.first()?;
    let mut namespaces: Vec<&str> = live.iter().filter_map(|p| p.metadata.namespace.as_deref()).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    let ns = if namespaces.is_empty() { first.metadata.namespace.as_deref().unwrap_or("?").to_string() } else { namespaces.join(",") };
    Some(Dataplane {
        mode: ProxyMode::Ebpf,
        note: format!("no kube-proxy pods; {} Cilium agent pod(s) ({selector} in {ns}): eBPF dataplane, sized from the policy default", live.len()),
    })
}

/// Looks for Cilium agent pods in all namespaces (`discovery.cilium_selector`) and classifies
/// them with [`cilium_dataplane`]. `Ok(None)` when the selector is empty or no agent runs.
///
/// Errors: the API call failed (RBAC needs cluster-wide `list pods`, which pod counting needs
/// too).
pub async fn detect_dataplane(client: &kube::Client, discovery: &Discovery) -> Result<Option<Dataplane>, SourceError> {
    if discovery.cilium_selector.is_empty() {
        return Ok(None);
    }
    let api: Api<Pod> = Api::all(client.clone());
    let pods = api
        .list(&ListParams::default().labels(&discovery.cilium_selector).limit(100))
        .await
        .map_err(|source| SourceError::Kube { what: format!("listing Cilium agent pods {:?}", discovery.cilium_selector), source })?;
    Ok(cilium_dataplane(&pods.items, &discovery.cilium_selector))
}

/// Targets from kube-proxy pods: only pods in phase `Running`, not being deleted, with a pod IP
/// (kube-proxy runs with hostNetwork, so that is the node IP). The node name is
/// `spec.nodeName` (the pod name when unset). When a node has two such pods (a DaemonSet
/// rollout), the newest is kept. Sorted by node name.
pub fn targets_from_pods(pods: &[Pod], port: u16) -> Vec<Target> {
    let mut best: BTreeMap<String, (&Pod, IpAddr)> = BTreeMap::new();
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(status) = pod.status.as_ref() else { continue };
        if status.phase.as_deref() != Some("Running") {
            continue;
        }
        let Some(ip) = status.pod_ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok()) else { continue };
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).or_else(|| pod.metadata.name.clone()).unwrap_or_default();
        if node.is_empty() {
            continue;
        }
        match best.get(&node) {
            Some((other, _)) if other.metadata.creation_timestamp >= pod.metadata.creation_timestamp => {}
            _ => {
                best.insert(node, (pod, ip));
            }
        }
    }
    best.into_iter().map(|(node, (_, ip))| Target::from_ip(node, ip, port)).collect()
}

/// Lists the kube-proxy pods (`Api::<Pod>::namespaced(..).list(selector)`) and turns them into
/// targets with [`targets_from_pods`].
///
/// Errors: the API call failed (RBAC needs `list pods` in the namespace).
pub async fn discover(client: &kube::Client, discovery: &Discovery) -> Result<Vec<Target>, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &discovery.namespace);
    let pods = api.list(&ListParams::default().labels(&discovery.selector)).await?;
    Ok(targets_from_pods(&pods.items, discovery.port))
}

/// Where the scrape loop gets its targets.
#[derive(Clone)]
pub enum TargetSource {
    /// A fixed list (tests, out-of-cluster runs).
    Static(Vec<Target>),
    /// kube-proxy pods found through the API on every cycle.
    Kube {
        /// The API client.
        client: kube::Client,
        /// Namespace, selector, port.
        discovery: Discovery,
    },
}

impl std::fmt::Debug for TargetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Static(t) => f.debug_tuple("Static").field(&t.len()).finish(),
            Self::Kube { discovery, .. } => f.debug_struct("Kube").field("discovery", discovery).finish(),
        }
    }
}

impl TargetSource {
    /// The current targets. Errors: discovery through the API failed (message with the
    /// namespace and selector).
    pub async fn targets(&self) -> Result<Vec<Target>, SourceError> {
        match self {
            Self::Static(t) => Ok(t.clone()),
            Self::Kube { client, discovery } => discover(client, discovery)
                .await
                .map_err(|source| SourceError::Kube { what: format!("listing pods {:?} in namespace {}", discovery.selector, discovery.namespace), source }),
        }
    }

    /// The API client and discovery settings, for the ConfigMap fallback and the dataplane
    /// detection of [`resolve_proxy_config`].
    pub fn kube_client(&self) -> Option<(&kube::Client, &Discovery)> {
        match self {
            Self::Static(_) => None,
            Self::Kube { client, discovery } => Some((client, discovery)),
        }
    }
}

/// How to scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeOptions {
    /// Per-target limit for both requests together (default 5 s).
    pub timeout: Duration,
    /// Targets scraped at once (default 64; at least 1).
    pub max_in_flight: usize,
    /// Largest `/metrics` body accepted, bytes (default 32 MiB).
    pub max_body_bytes: usize,
    /// Also read `/proxyMode` (default true); a failure there is never an error.
    pub fetch_proxy_mode: bool,
}

impl Default for ScrapeOptions {
    fn default() -> Self {
        Self { timeout: DEFAULT_TIMEOUT, max_in_flight: DEFAULT_MAX_IN_FLIGHT, max_body_bytes: super::fetch::DEFAULT_MAX_BODY_BYTES, fetch_proxy_mode: true }
    }
}

/// The result of scraping one target.
#[derive(Debug, Clone)]
pub struct ScrapeOutcome {
    /// The target's node name.
    pub node: String,
    /// The sample, or why there is none.
    pub result: Result<Sample, NodeFailure>,
    /// Time from the first request to the parsed result (or the failure); with fallbacks,
    /// every source tried together.
    pub elapsed: Duration,
    /// The source that measured the node (for a failure: the last one tried).
    pub source: NodeSource,
}

impl ScrapeOutcome {
    /// The failure reason label, `None` on success.
    pub fn reason(&self) -> Option<&str> {
        self.result.as_ref().err().map(|f| f.reason.as_str())
    }
}

struct Failure {
    reason: &'static str,
    message: String,
}

fn classify(url: &str, e: &reqwest::Error) -> Failure {
    let message = connect_hint(e);
    let reason = if e.is_timeout() {
        reason::TIMEOUT
    } else if e.is_connect() && message.to_ascii_lowercase().contains("refused") {
        reason::CONNECTION_REFUSED
    } else {
        reason::OTHER
    };
    let message = if message.contains(url) { message } else { format!("{url}: {message}") };
    Failure { reason, message }
}

/// A fetch failure as the scraper records it: a [`reason`] label and a message naming the URL.
fn failure(url: &str, e: FetchError) -> Failure {
    match e {
        FetchError::Transport(e) => classify(url, &e),
        FetchError::Status(status) => Failure { reason: reason::HTTP_STATUS, message: format!("{url}: HTTP {status}") },
        e @ FetchError::TooLarge { .. } => Failure { reason: reason::OTHER, message: format!("{url}: {e}") },
    }
}

/// `bytes` from `url` as UTF-8 text, or a [`reason::PARSE`] failure.
fn text(url: &str, bytes: Vec<u8>) -> Result<String, Failure> {
    decode_utf8(url, bytes).map_err(|e| Failure { reason: reason::PARSE, message: e.to_string() })
}

/// A `/metrics` body from `url` read in the format its content type names ([`parse_scrape`]),
/// or a [`reason::PARSE`] failure naming the URL (a text body that is not UTF-8 as [`text`]
/// names it).
fn read_scrape(url: &str, body: ScrapeBody) -> Result<KubeProxyScrape, Failure> {
    match parse_scrape(&body.bytes, body.content_type.as_deref()) {
        Ok(scrape) => Ok(scrape),
        Err(ScrapeError::NotUtf8(e)) => {
            Err(text(url, body.bytes).err().unwrap_or_else(|| Failure { reason: reason::PARSE, message: format!("{url}: not UTF-8 text: {e}") }))
        }
        Err(e) => Err(Failure { reason: reason::PARSE, message: format!("{url}: {e}") }),
    }
}

/// Scrapes one target: GET `/metrics` (and, when enabled, `/proxyMode` at the same time), both
/// within `opts.timeout`, asking for the protobuf exposition first and text as the fallback
/// ([`ACCEPT_PROTOBUF_FIRST`]), then reads the body in the format its `Content-Type` names
/// ([`parse_scrape`]: protobuf carries the native histograms). Never panics; every failure
/// becomes a [`NodeFailure`] (see the [`reason`] labels): a refused connection carries
/// [`connect_hint`]'s `metricsBindAddress` advice, a parse failure names the URL, line and
/// family (`line 17: kubeproxy_sync_proxy_rules_duration_seconds: ...`; for protobuf the
/// message and its byte offset).
pub async fn scrape_once(client: &reqwest::Client, target: &Target, opts: &ScrapeOptions) -> ScrapeOutcome {
    let start = Instant::now();
    let metrics_url = target.url("/metrics");
    let mode_url = opts.fetch_proxy_mode.then(|| target.url("/proxyMode"));
    let work = fetch_scrape(client, &metrics_url, mode_url.as_deref(), opts.max_body_bytes, ACCEPT_PROTOBUF_FIRST);
    let fetched = tokio::time::timeout(opts.timeout, work).await;
    let at = unix_now();
    let fail = |f: Failure| NodeFailure { reason: f.reason.to_string(), message: f.message, at_unix_seconds: at };
    let result = match fetched {
        Err(_) => {
            let port = target.port().map_or_else(|| "the metrics port".to_string(), |p| format!("port {p}"));
            Err(fail(Failure {
                reason: reason::TIMEOUT,
                message: format!(
                    "{metrics_url}: no complete answer within {:.1} s (timed out: is a NetworkPolicy or host firewall blocking {port}, or is kube-proxy overloaded?)",
                    opts.timeout.as_secs_f64()
                ),
            }))
        }
        Ok((Err(e), _)) => Err(fail(failure(&metrics_url, e))),
        Ok((Ok(body), proxy_mode)) => match read_scrape(&metrics_url, body) {
            Ok(scrape) => Ok(Sample { at_unix_seconds: at, scrape, proxy_mode }),
            Err(f) => Err(fail(f)),
        },
    };
    ScrapeOutcome { node: target.node.clone(), result, elapsed: start.elapsed(), source: NodeSource::KubeProxy }
}

/// Scrapes every target with at most `opts.max_in_flight` at once
/// (`stream::iter(..).buffer_unordered(n)`), each bounded by `opts.timeout`. The outcomes come
/// back in completion order, one per target.
pub async fn scrape_all(client: &reqwest::Client, targets: &[Target], opts: &ScrapeOptions) -> Vec<ScrapeOutcome> {
    // by index, lazily: a closure over `&Target` would be higher-ranked over the reference's
    // lifetime, which makes a caller's `tokio::spawn` fail the `Send` check (rustc limitation);
    // collecting the futures first would allocate all of them at once
    futures::stream::iter((0..targets.len()).map(move |i| scrape_once(client, &targets[i], opts))).buffer_unordered(opts.max_in_flight.max(1)).collect().await
}

/// Counts of one [`record_outcomes`] call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Successful scrapes recorded.
    pub scraped: usize,
    /// Failures recorded.
    pub failed: usize,
}

/// Records outcomes into the store: samples with [`MeasurementStore::record_via`] (their
/// source noted), failures with
/// [`MeasurementStore::record_failure`]. Does not drop vanished nodes (see
/// [`MeasurementStore::retain_nodes`]).
pub fn record_outcomes(store: &mut MeasurementStore, outcomes: impl IntoIterator<Item = ScrapeOutcome>) -> Recorded {
    let mut n = Recorded::default();
    for o in outcomes {
        match o.result {
            Ok(sample) => {
                store.record_via(&o.node, sample, o.source);
                n.scraped += 1;
            }
            Err(f) => {
                store.record_failure(&o.node, f);
                n.failed += 1;
            }
        }
    }
    n
}

/// Reads kube-proxy's effective configuration from its `/configz` (metrics port) and parses it
/// with [`proxyconfig::parse_configz`]. Best effort: any failure (refused, timeout, HTTP error,
/// not kube-proxy's JSON) is an `Err` with a one-line message, and callers fall back to the
/// ConfigMap.
pub async fn fetch_configz(client: &reqwest::Client, target: &Target, timeout: Duration) -> Result<ProxyConfig, SourceError> {
    let url = target.url("/configz");
    let fetched = async { text(&url, get_limited(client, &url, 1024 * 1024).await.map_err(|e| failure(&url, e))?) };
    let text = match tokio::time::timeout(timeout, fetched).await {
        Err(_) => return Err(SourceError::Config(format!("{url}: no answer within {:.1} s", timeout.as_secs_f64()))),
        Ok(Err(f)) => return Err(SourceError::Config(f.message)),
        Ok(Ok(t)) => t,
    };
    proxyconfig::parse_configz(&text).map_err(|e| SourceError::Config(format!("{url}: {e}")))
}

/// The ConfigMaps kube-proxy's configuration is looked for in, in order: kubeadm's
/// `kube-proxy` (key `config.conf`), then EKS's `kube-proxy-config` (key `config`).
pub const CONFIGMAPS: [(&str, &str); 2] = [("kube-proxy", "config.conf"), ("kube-proxy-config", "config")];

/// Reads kube-proxy's configuration from the first of [`CONFIGMAPS`] present in `namespace`.
/// Returns the source (`ConfigMap kube-system/kube-proxy`) and the parsed configuration.
///
/// Errors: the API call failed (RBAC needs `get configmaps` in the namespace), neither
/// ConfigMap has its key, or the text is not a valid KubeProxyConfiguration.
pub async fn read_proxy_configmap(client: &kube::Client, namespace: &str) -> Result<(String, ProxyConfig), SourceError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    for (name, key) in CONFIGMAPS {
        let cm = api.get_opt(name).await.map_err(|source| SourceError::Kube { what: format!("reading ConfigMap {namespace}/{name}"), source })?;
        let Some(text) = cm.and_then(|cm| cm.data).and_then(|mut d| d.remove(key)) else { continue };
        let source = format!("ConfigMap {namespace}/{name}");
        return proxyconfig::parse_kube_proxy_config(&text).map(|c| (source.clone(), c)).map_err(|e| SourceError::Config(format!("{source} key {key}: {e}")));
    }
    Err(SourceError::Config(format!("no ConfigMap kube-proxy (key config.conf) or kube-proxy-config (key config) in {namespace}")))
}

/// kube-proxy's minSyncPeriod and mode, from the best source available: `/configz` of the
/// first of `targets` that answers (at most three are tried), else the ConfigMap (when a
/// client is given), else the default 1 s. The result names its source and says why better
/// sources were skipped. With a client and no target at all (no kube-proxy pod), Cilium agent
/// pods are looked for first ([`detect_dataplane`]); when found the result carries the
/// [`Dataplane`] (mode `ebpf`) and its source is `Cilium agent pods`.
pub async fn resolve_proxy_config(
    http: &reqwest::Client,
    targets: &[Target],
    kube: Option<(&kube::Client, &Discovery)>,
    timeout: Duration,
) -> ResolvedProxyConfig {
    let mut notes = Vec::new();
    for t in targets.iter().take(3) {
        match fetch_configz(http, t, timeout).await {
            Ok(c) => return ResolvedProxyConfig::from_config(c, format!("configz {}", t.node), notes),
            Err(e) => notes.push(format!("configz: {e}")),
        }
    }
    if targets.is_empty() {
        notes.push("configz: no kube-proxy target".into());
        if let Some((client, discovery)) = kube {
            match detect_dataplane(client, discovery).await {
                Ok(Some(dataplane)) => {
                    return ResolvedProxyConfig { source: "Cilium agent pods".into(), notes, dataplane: Some(dataplane), ..ResolvedProxyConfig::default() };
                }
                Ok(None) => {}
                Err(e) => notes.push(e.to_string()),
            }
        }
    }
    if let Some((client, discovery)) = kube {
        let ns = discovery.namespace.as_str();
        match read_proxy_configmap(client, ns).await {
            Ok((source, c)) => return ResolvedProxyConfig::from_config(c, source, notes),
            Err(e) => notes.push(e.to_string()),
        }
    }
    ResolvedProxyConfig { notes, ..ResolvedProxyConfig::default() }
}

/// `reason` label of `scrape_errors_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// One of the [`reason`] labels.
    pub reason: String,
}

/// Buckets of `scrape_duration_seconds`: 5 ms .. 30 s.
pub const SCRAPE_DURATION_BUCKETS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// The scraper's metrics. Register once with [`ScrapeMetrics::register`], e.g.
/// `telemetry.register("scrape", |r| m.register(r))`, which exposes
/// `safe_termination_scrape_errors_total{reason}`, `safe_termination_scrape_duration_seconds`
/// and `safe_termination_scrape_targets`. Clones share the same series.
#[derive(Debug, Clone)]
pub struct ScrapeMetrics {
    /// `errors_total{reason}`: failed target scrapes by reason.
    pub errors: Family<ReasonLabel, Counter>,
    /// `duration_seconds`: time to scrape and parse one target, successful or not.
    pub duration: Histogram,
    /// `targets`: kube-proxy targets in the last cycle.
    pub targets: Gauge,
}

impl Default for ScrapeMetrics {
    fn default() -> Self {
        Self { errors: Family::default(), duration: Histogram::new(SCRAPE_DURATION_BUCKETS), targets: Gauge::default() }
    }
}

impl ScrapeMetrics {
    /// Registers the three metrics in `registry` (names relative to the registry's prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register("errors", "Failed kube-proxy scrapes, by reason", self.errors.clone());
        registry.register_with_unit("duration", "Time to scrape and parse one kube-proxy", Unit::Seconds, self.duration.clone());
        registry.register("targets", "kube-proxy targets in the last scrape cycle", self.targets.clone());
    }

    /// Records a cycle's outcomes.
    pub fn observe(&self, outcomes: &[ScrapeOutcome]) {
        self.targets.set(outcomes.len() as i64);
        for o in outcomes {
            self.duration.observe(o.elapsed.as_secs_f64());
            if let Some(r) = o.reason() {
                self.errors.get_or_create(&ReasonLabel { reason: r.to_string() }).inc();
            }
        }
    }
}

/// A small xorshift64* generator for the loops' jitter (no cryptographic use).
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from the clock and the process id.
    pub fn seeded() -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Self((nanos ^ (std::process::id() as u64).rotate_left(32)) | 1)
    }

    /// Uniform in [0, 1).
    fn next_unit(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `interval` plus up to `JITTER_FRACTION` of it.
    pub fn delay(&mut self, interval: Duration) -> Duration {
        interval.mul_f64(1.0 + JITTER_FRACTION * self.next_unit())
    }

    /// Sleeps `interval` plus jitter; false when `cancel` fired first (the loop should end).
    pub async fn sleep(&mut self, interval: Duration, cancel: &CancellationToken) -> bool {
        let delay = self.delay(interval);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str, node: Option<&str>, phase: &str, ip: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(PodSpec { node_name: node.map(Into::into), host_network: Some(true), ..Default::default() }),
            status: Some(PodStatus { phase: Some(phase.into()), pod_ip: ip.map(Into::into), ..Default::default() }),
        }
    }

    #[test]
    fn a_cilium_agent_counts_only_while_it_runs() {
        let agent = |name: &str, phase: &str| {
            let mut p = pod(name, Some("n1"), phase, None);
            p.metadata.namespace = Some("kube-system".into());
            p
        };
        assert_eq!(cilium_dataplane(&[], "k8s-app=cilium"), None);
        assert_eq!(cilium_dataplane(&[agent("c1", "Failed"), agent("c2", "Succeeded")], "k8s-app=cilium"), None);
        let d = cilium_dataplane(&[agent("c1", "Pending"), agent("c2", "Running"), agent("c3", "Failed")], "k8s-app=cilium").unwrap();
        assert_eq!(d.mode, ProxyMode::Ebpf);
        assert_eq!(d.note, "no kube-proxy pods; 2 Cilium agent pod(s) (k8s-app=cilium in kube-system): eBPF dataplane, sized from the policy default");
    }

    #[test]
    fn pods_become_targets_running_with_an_ip_only() {
        let pods = vec![
            pod("kube-proxy-a", Some("node-a"), "Running", Some("10.0.0.1")),
            pod("kube-proxy-b", Some("node-b"), "Pending", Some("10.0.0.2")),
            pod("kube-proxy-c", Some("node-c"), "Running", None),
            pod("kube-proxy-d", Some("node-d"), "Running", Some("fd00::4")),
            pod("kube-proxy-e", None, "Running", Some("10.0.0.5")),
            pod("kube-proxy-f", Some("node-f"), "Failed", Some("10.0.0.6")),
        ];
        let t = targets_from_pods(&pods, 10249);
        assert_eq!(
            t,
            vec![
                Target::new("kube-proxy-e", "http://10.0.0.5:10249"),
                Target::new("node-a", "http://10.0.0.1:10249"),
                Target::new("node-d", "http://[fd00::4]:10249"),
            ]
        );
        assert_eq!(t[1].url("/metrics"), "http://10.0.0.1:10249/metrics");
        assert_eq!(t[2].port(), Some(10249));
    }

    #[test]
    fn terminating_pods_are_skipped_and_the_newest_pod_of_a_node_wins() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let mut old = pod("kube-proxy-old", Some("n"), "Running", Some("10.0.0.1"));
        let mut new = pod("kube-proxy-new", Some("n"), "Running", Some("10.0.0.9"));
        old.metadata.creation_timestamp = Some(Time("2024-01-01T00:00:00Z".parse().unwrap()));
        new.metadata.creation_timestamp = Some(Time("2024-06-01T00:00:00Z".parse().unwrap()));
        assert_eq!(targets_from_pods(&[new.clone(), old.clone()], 1)[0].base_url, "http://10.0.0.9:1");
        assert_eq!(targets_from_pods(&[old.clone(), new.clone()], 1)[0].base_url, "http://10.0.0.9:1");
        new.metadata.deletion_timestamp = Some(Time("2024-06-02T00:00:00Z".parse().unwrap()));
        assert_eq!(targets_from_pods(&[old, new], 1)[0].base_url, "http://10.0.0.1:1");
    }

    #[test]
    fn static_targets() {
        let t = parse_static_targets(&["node-a=http://127.0.0.1:10249", "http://127.0.0.1:9000/metrics", "b=http://[::1]:1/"]).unwrap();
        assert_eq!(t[0], Target::new("node-a", "http://127.0.0.1:10249"));
        assert_eq!(t[1], Target::new("127.0.0.1:9000", "http://127.0.0.1:9000"));
        assert_eq!(t[2].base_url, "http://[::1]:1");
        assert!(parse_static_target("a=10.0.0.1:10249").unwrap_err().to_string().contains("not a URL"));
        assert!(parse_static_target("a=ftp://x").unwrap_err().to_string().contains("expected http://host:port"));
        assert!(parse_static_target("=http://x:1").unwrap_err().to_string().contains("empty node name"));
        assert!(parse_static_targets(&["a=http://x:1", "a=http://y:1"]).unwrap_err().to_string().contains("listed twice"));
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let mut j = Jitter(42);
        let base = Duration::from_secs(30);
        let mut seen_low = false;
        let mut seen_high = false;
        for _ in 0..10_000 {
            let d = j.delay(base);
            assert!(d >= base && d <= base.mul_f64(1.1), "{d:?}");
            seen_low |= d < base.mul_f64(1.01);
            seen_high |= d > base.mul_f64(1.09);
        }
        assert!(seen_low && seen_high);
    }

    #[test]
    fn metrics_register_and_count_reasons() {
        let m = ScrapeMetrics::default();
        let mut r = Registry::with_prefix("safe_termination_scrape");
        m.register(&mut r);
        let fail = |reason: &str| ScrapeOutcome {
            node: "n".into(),
            result: Err(NodeFailure { reason: reason.into(), message: String::new(), at_unix_seconds: 0.0 }),
            elapsed: Duration::from_millis(3),
            source: NodeSource::KubeProxy,
        };
        m.observe(&[fail(reason::TIMEOUT), fail(reason::TIMEOUT), fail(reason::PARSE)]);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(text.contains("safe_termination_scrape_errors_total{reason=\"timeout\"} 2"), "{text}");
        assert!(text.contains("safe_termination_scrape_errors_total{reason=\"parse\"} 1"), "{text}");
        assert!(text.contains("safe_termination_scrape_duration_seconds_count 3"), "{text}");
        assert!(text.contains("safe_termination_scrape_targets 3"), "{text}");
    }
}
