//! The operator's measurement loop (adapter): every interval it scrapes each kube-proxy directly
//! ([`super::scrape`]), completes the nodes that failed through `--source auto`'s fallbacks (the
//! node agents, [`super::agent`], then Prometheus, [`super::prometheus`], each node's choice made
//! by [`super::auto`]), records the outcomes into the store and refreshes kube-proxy's
//! configuration.
//!
//! - [`ScrapeLoop`]: all of the above every interval (default 30 s, plus up to 10% jitter),
//!   bumping a `watch` generation counter after each cycle so the controller re-reconciles,
//!   until a [`CancellationToken`] fires; [`CycleSummary`] is what one cycle did;
//! - [`Fallbacks`]: after the direct scrape of every node, the agents for the nodes that failed,
//!   then one Prometheus query for those still unmeasured ([`Applied`] is the result).
//!
//! This file composes the sources; none of them imports it.

use super::agent_client::{AgentSource, scrape_agent};
use super::auto::{Attempts, NextStep, Tried, next_step};
use super::fetch::http_client;
use super::oneshot::unix_now;
use super::prometheus::PrometheusSource;
use super::proxy_config::{fetch_configz, resolve_proxy_config};
use super::scrape::{DEFAULT_INTERVAL, Jitter, ScrapeMetrics, ScrapeOptions, ScrapeOutcome, record_outcomes, scrape_all};
use super::targets::{Target, TargetSource};
use crate::core::measure::{MeasurementStore, NodeFailure, NodeSource, Sample, reason};
use crate::core::proxyconfig::ResolvedProxyConfig;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What one cycle did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CycleSummary {
    /// Targets scraped this cycle.
    pub targets: usize,
    /// Successful scrapes.
    pub scraped: usize,
    /// Failed scrapes.
    pub failed: usize,
    /// Discovery failed and the previous targets were used (or none, on the first cycle).
    pub discovery_error: Option<String>,
    /// Wall time of the cycle.
    pub elapsed: Duration,
    /// The generation published after the cycle.
    pub generation: u64,
}

/// The measurement loop of the kube-proxy source: every interval (plus jitter) it finds the
/// targets, scrapes them, records the outcomes into the shared store, drops nodes that went
/// away, refreshes kube-proxy's configuration every few cycles, updates the metrics, and bumps
/// the generation counter. The store's mutex is only held for the (synchronous) recording.
///
/// ```no_run
/// # use safe_termination::{core::measure::MeasurementStore, sources::targets::*, sources::scrape_loop::ScrapeLoop};
/// # use std::sync::{Arc, Mutex};
/// # async fn f() -> Result<(), safe_termination::sources::SourceError> {
/// let store = Arc::new(Mutex::new(MeasurementStore::new(600.0)));
/// let (tx, _rx) = tokio::sync::watch::channel(0u64);
/// let targets = parse_static_targets(&["node-a=http://127.0.0.1:10249"])?;
/// let cancel = tokio_util::sync::CancellationToken::new();
/// ScrapeLoop::new(TargetSource::Static(targets), store, tx).run(cancel).await;
/// # Ok(()) }
/// ```
pub struct ScrapeLoop {
    source: TargetSource,
    store: Arc<Mutex<MeasurementStore>>,
    generation: watch::Sender<u64>,
    http: reqwest::Client,
    options: ScrapeOptions,
    interval: Duration,
    metrics: Option<ScrapeMetrics>,
    proxy_config: Arc<RwLock<ResolvedProxyConfig>>,
    config_every: u64,
    cycles: u64,
    last_targets: Vec<Target>,
    jitter: Jitter,
    fallbacks: Option<Fallbacks>,
}

impl ScrapeLoop {
    /// A loop over `source` feeding `store` and bumping `generation`, with the defaults:
    /// interval 30 s, [`ScrapeOptions::default`], an HTTP client from [`http_client`],
    /// configuration refreshed every 10 cycles.
    pub fn new(source: TargetSource, store: Arc<Mutex<MeasurementStore>>, generation: watch::Sender<u64>) -> Self {
        let options = ScrapeOptions::default();
        Self {
            source,
            store,
            generation,
            http: http_client(options.timeout),
            options,
            interval: DEFAULT_INTERVAL,
            metrics: None,
            proxy_config: Arc::new(RwLock::new(ResolvedProxyConfig::default())),
            config_every: 10,
            cycles: 0,
            last_targets: Vec::new(),
            jitter: Jitter::seeded(),
            fallbacks: None,
        }
    }

    /// `--source auto`: nodes whose direct scrape fails are tried through their agent, then
    /// Prometheus ([`Fallbacks`]); kube-proxy's configuration is read through an
    /// agent when no kube-proxy answered directly.
    pub fn with_fallbacks(mut self, fallbacks: Fallbacks) -> Self {
        self.fallbacks = Some(fallbacks);
        self
    }

    /// Sets the time between cycles (jitter adds up to 10% on top).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets timeout, concurrency and body cap; rebuilds the HTTP client for the new timeout.
    pub fn with_options(mut self, options: ScrapeOptions) -> Self {
        self.http = http_client(options.timeout);
        self.options = options;
        self
    }

    /// Records every cycle into these metrics.
    pub fn with_metrics(mut self, metrics: ScrapeMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Re-reads kube-proxy's configuration every `cycles` cycles (0: never; the first cycle
    /// always reads it unless 0).
    pub fn with_config_refresh(mut self, cycles: u64) -> Self {
        self.config_every = cycles;
        self
    }

    /// Publishes the refreshed kube-proxy configuration into `shared` (e.g. the controller's
    /// own handle) instead of a handle of the loop's making.
    pub fn with_proxy_config(mut self, shared: Arc<RwLock<ResolvedProxyConfig>>) -> Self {
        self.proxy_config = shared;
        self
    }

    /// The shared, refreshed kube-proxy configuration (minSyncPeriod, mode, source); starts as
    /// the 1 s default. Clone it before [`ScrapeLoop::run`] consumes the loop.
    pub fn proxy_config(&self) -> Arc<RwLock<ResolvedProxyConfig>> {
        Arc::clone(&self.proxy_config)
    }

    /// Runs one cycle now (see the type docs) and returns what it did.
    pub async fn run_cycle(&mut self) -> CycleSummary {
        let start = Instant::now();
        let mut summary = CycleSummary::default();
        let targets = match self.source.targets().await {
            Ok(t) => {
                self.last_targets = t.clone();
                t
            }
            Err(e) => {
                tracing::warn!(error = %e, "kube-proxy discovery failed; scraping the previous targets");
                summary.discovery_error = Some(e.to_string());
                self.last_targets.clone()
            }
        };
        let outcomes = scrape_all(&self.http, &targets, &self.options).await;
        let (outcomes, agents_answered) = match &self.fallbacks {
            Some(f) => {
                let applied = f.apply(&targets, outcomes, &self.options).await;
                (applied.outcomes, applied.agents_answered)
            }
            None => (outcomes, Vec::new()),
        };
        if let Some(m) = &self.metrics {
            m.observe(&outcomes);
        }
        for o in &outcomes {
            if let Err(f) = &o.result {
                tracing::debug!(node = %o.node, reason = %f.reason, message = %f.message, "kube-proxy scrape failed");
            }
        }
        if self.config_every > 0 && self.cycles.is_multiple_of(self.config_every) {
            // prefer targets that just answered
            let mut ordered: Vec<Target> = targets.iter().filter(|t| outcomes.iter().any(|o| o.node == t.node && o.result.is_ok())).cloned().collect();
            if ordered.is_empty() {
                ordered = targets.clone();
            }
            let resolved = match ordered.iter().any(|t| outcomes.iter().any(|o| o.node == t.node && o.result.is_ok() && o.source == NodeSource::KubeProxy)) {
                // no kube-proxy answered directly: its /configz through an agent that answered
                false if !agents_answered.is_empty() => configz_through_agents(&agents_answered, self.options.timeout).await,
                _ => None,
            };
            let resolved = match resolved {
                Some(r) => r,
                None => resolve_proxy_config(&self.http, &ordered, self.source.kube_client(), self.options.timeout).await,
            };
            tracing::debug!(source = %resolved.source, min_sync_period_seconds = resolved.min_sync_period_seconds, "kube-proxy configuration");
            *self.proxy_config.write().unwrap_or_else(PoisonError::into_inner) = resolved;
        }
        self.cycles += 1;
        summary.targets = targets.len();
        let present: Vec<String> = targets.iter().map(|t| t.node.clone()).collect();
        let recorded = {
            let mut store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
            let n = record_outcomes(&mut store, outcomes);
            if summary.discovery_error.is_none() {
                store.retain_nodes(&present);
            }
            n
        };
        summary.scraped = recorded.scraped;
        summary.failed = recorded.failed;
        self.generation.send_modify(|g| *g += 1);
        summary.generation = *self.generation.borrow();
        summary.elapsed = start.elapsed();
        tracing::info!(
            targets = summary.targets,
            scraped = summary.scraped,
            failed = summary.failed,
            elapsed_ms = summary.elapsed.as_millis() as u64,
            "kube-proxy scrape cycle"
        );
        summary
    }

    /// Runs cycles until `cancel` fires: one immediately, then one every interval plus jitter.
    /// A cycle in progress when `cancel` fires is abandoned at its next await point; nothing is
    /// half-recorded, since recording into the store is synchronous.
    pub async fn run(mut self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = self.run_cycle() => {}
            }
            if !self.jitter.sleep(self.interval, &cancel).await {
                return;
            }
        }
    }
}

/// kube-proxy's configuration through the first of `agents` (at most three tried) whose
/// `/configz` answers, named `configz <node> (agent)`; `None` when none does.
async fn configz_through_agents(agents: &[(Target, reqwest::Client)], timeout: Duration) -> Option<ResolvedProxyConfig> {
    let mut notes = Vec::new();
    for (t, client) in agents.iter().take(3) {
        match fetch_configz(client, t, timeout).await {
            Ok(c) => return Some(ResolvedProxyConfig::from_config(c, format!("configz {} (agent)", t.node), notes)),
            Err(e) => notes.push(format!("configz through the agent: {e}")),
        }
    }
    tracing::debug!(notes = %notes.join("; "), "kube-proxy configuration not read through the agents");
    None
}

/// The fallbacks of `--source auto` after the direct scrape: the agents, then Prometheus.
#[derive(Debug, Default)]
pub struct Fallbacks {
    /// The agents (none: the agent step is unavailable).
    pub agents: Option<AgentSource>,
    /// Prometheus (none: not configured).
    pub prometheus: Option<PrometheusSource>,
}

/// What [`Fallbacks::apply`] gives back: one outcome per target, and the agents that answered
/// (for kube-proxy's `/configz`, with the client that reached them).
pub struct Applied {
    /// One outcome per target, sorted by node.
    pub outcomes: Vec<ScrapeOutcome>,
    /// Agents that answered this cycle, with the client.
    pub agents_answered: Vec<(Target, reqwest::Client)>,
}

/// The host of a target's URL (an IPv6 address without brackets), to match Prometheus'
/// `instance` label.
fn host(target: &Target) -> Option<String> {
    let url = reqwest::Url::parse(&target.base_url).ok()?;
    Some(url.host_str()?.trim_start_matches('[').trim_end_matches(']').to_string())
}

impl Fallbacks {
    /// Completes `direct` (the direct scrape of each of `targets`): the nodes that failed are
    /// tried through their agent (at most `opts.max_in_flight` at once, each within
    /// `opts.timeout`), then those still unmeasured through one Prometheus query, each node's
    /// choice and failure message made by [`next_step`].
    pub async fn apply(&self, targets: &[Target], direct: Vec<ScrapeOutcome>, opts: &ScrapeOptions) -> Applied {
        let prometheus_unavailable = self.prometheus.is_none().then(|| "not configured (--prometheus-url)".to_string());
        let mut nodes: BTreeMap<String, (Attempts<Sample>, Duration)> = BTreeMap::new();
        for o in direct {
            let mut a = Attempts::new(None, prometheus_unavailable.clone());
            a.kube_proxy = match o.result {
                Ok(s) => Tried::Got(s),
                Err(f) => Tried::Failed(f),
            };
            nodes.insert(o.node, (a, o.elapsed));
        }
        let wants = |nodes: &BTreeMap<String, (Attempts<Sample>, Duration)>, s: NodeSource| -> Vec<String> {
            nodes.iter().filter(|(_, (a, _))| next_step(a) == NextStep::Try(s)).map(|(n, _)| n.clone()).collect()
        };
        let mut agents_answered = Vec::new();
        let need_agent = wants(&nodes, NodeSource::Agent);
        if !need_agent.is_empty() {
            let tried = self.try_agents(&need_agent, opts).await;
            for (node, tried, elapsed, answered) in tried {
                if let Some((a, total)) = nodes.get_mut(&node) {
                    a.agent = tried;
                    *total += elapsed;
                }
                agents_answered.extend(answered);
            }
        }
        let need_prometheus = wants(&nodes, NodeSource::Prometheus);
        if let (false, Some(prometheus)) = (need_prometheus.is_empty(), &self.prometheus) {
            let start = Instant::now();
            let snapshot = prometheus.fetch().await;
            let by_host: BTreeMap<&str, Option<String>> = targets.iter().map(|t| (t.node.as_str(), host(t))).collect();
            for node in need_prometheus {
                let keys = [Some(node.clone()), by_host.get(node.as_str()).cloned().flatten()];
                let tried = match &snapshot {
                    Err(e) => Tried::Failed(NodeFailure { reason: reason::OTHER.into(), message: e.to_string(), at_unix_seconds: unix_now() }),
                    Ok(s) => {
                        let input = s.inputs.iter().find(|i| keys.iter().flatten().any(|k| *k == i.node));
                        let failure = keys.iter().flatten().find_map(|k| s.failures.get(k));
                        match (input, failure) {
                            (Some(i), _) => Tried::Got(Sample { at_unix_seconds: s.at_unix_seconds, scrape: i.later.clone(), proxy_mode: i.proxy_mode }),
                            (None, Some(f)) => Tried::Failed(f.clone()),
                            (None, None) => Tried::Failed(NodeFailure {
                                reason: reason::OTHER.into(),
                                message: format!(
                                    "{}: no kube-proxy series for this node (label node={node:?}{})",
                                    prometheus.query_url(),
                                    keys[1].as_deref().map(|h| format!(" or an instance on {h}")).unwrap_or_default()
                                ),
                                at_unix_seconds: s.at_unix_seconds,
                            }),
                        }
                    }
                };
                if let Some((a, total)) = nodes.get_mut(&node) {
                    a.prometheus = tried;
                    *total += start.elapsed();
                }
            }
        }
        let outcomes = nodes
            .into_iter()
            .map(|(node, (mut a, elapsed))| {
                let (result, source) = match next_step(&a) {
                    NextStep::Chosen { source, passed_over } => {
                        if !passed_over.is_empty() {
                            tracing::debug!(node = %node, source = source.as_str(), passed_over = %passed_over.join("; "), "node measured through a fallback source");
                        }
                        match a.take(source) {
                            Some(sample) => (Ok(sample), source),
                            None => (Err(NodeFailure { reason: reason::OTHER.into(), message: "internal error: chosen source without a sample".into(), at_unix_seconds: unix_now() }), source),
                        }
                    }
                    NextStep::Failed(f) => (Err(f), last_tried(&a)),
                    NextStep::Try(s) => (Err(NodeFailure { reason: reason::OTHER.into(), message: format!("internal error: {} not tried", s.as_str()), at_unix_seconds: unix_now() }), s),
                };
                ScrapeOutcome { node, result, elapsed, source }
            })
            .collect();
        Applied { outcomes, agents_answered }
    }

    /// Tries `nodes` through their agents: per node what the agent gave, the time it took, and
    /// the agent with its client when it answered.
    #[allow(clippy::type_complexity)]
    async fn try_agents(&self, nodes: &[String], opts: &ScrapeOptions) -> Vec<(String, Tried<Sample>, Duration, Option<(Target, reqwest::Client)>)> {
        let unavailable = |why: String| nodes.iter().map(|n| (n.clone(), Tried::Unavailable(why.clone()), Duration::ZERO, None)).collect();
        let Some(agents) = &self.agents else { return unavailable("no agent source configured".into()) };
        let targets = match agents.targets().await {
            Ok(t) => t,
            Err(e) => return unavailable(format!("cannot find the agents: {e}")),
        };
        let (here, absent): (Vec<&String>, Vec<&String>) = nodes.iter().partition(|n| targets.contains_key(*n));
        let mut out: Vec<_> = absent.into_iter().map(|n| (n.clone(), Tried::Unavailable(agents.none_here()), Duration::ZERO, None)).collect();
        if here.is_empty() {
            return out;
        }
        let client = match agents.client() {
            Ok(c) => c,
            Err(e) => {
                let why = format!("an agent runs on this node, but the operator has no usable client certificate for it: {e}");
                out.extend(here.into_iter().map(|n| (n.clone(), Tried::Unavailable(why.clone()), Duration::ZERO, None)));
                return out;
            }
        };
        // by index: a closure over references would be higher-ranked over their lifetime, which
        // fails the `Send` check of the spawned loop (see `scrape_all`)
        let agents_here: Vec<Target> = here.iter().map(|n| targets[*n].clone()).collect();
        let scraped: Vec<ScrapeOutcome> = futures::stream::iter((0..agents_here.len()).map(|i| scrape_agent(&client, &agents_here[i], opts)))
            .buffer_unordered(opts.max_in_flight.max(1))
            .collect()
            .await;
        out.extend(scraped.into_iter().map(|o| {
            let answered = o.result.is_ok().then(|| (targets[&o.node].clone(), client.clone()));
            let tried = match o.result {
                Ok(s) => Tried::Got(s),
                Err(f) => Tried::Failed(f),
            };
            (o.node, tried, o.elapsed, answered)
        }));
        out
    }
}

/// The last source of a node's attempts that was tried (its failure is the one reported).
fn last_tried<T>(a: &Attempts<T>) -> NodeSource {
    super::auto::ORDER.into_iter().rev().find(|s| matches!(a.get(*s), Tried::Failed(_) | Tried::Got(_))).unwrap_or(NodeSource::KubeProxy)
}
