//! The operator's measurement task: the source chosen by `--source` runs only while this
//! replica leads, recording into the shared store and bumping the measurement generation.
//! `--source auto` is the kube-proxy scrape loop with fallbacks ([`Auto`]).

use super::agent_client::{AgentClientFiles, AgentSource, AgentTargets};
use super::prometheus::{PrometheusLoop, PrometheusSource};
use super::scrape::{ScrapeMetrics, ScrapeOptions};
use super::scrape_loop::{Fallbacks, ScrapeLoop};
use super::targets::{Discovery, Target, TargetSource};
use crate::runtime::{Shared, Tasks};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Which source measures, with its settings.
#[derive(Debug, Clone)]
pub enum Measurement {
    /// Scrape every kube-proxy: the static targets when there are any, else those discovery
    /// finds.
    KubeProxy {
        /// `--kube-proxy-target` entries (empty: discover).
        static_targets: Vec<Target>,
        /// Where kube-proxy (and, without it, Cilium) pods are looked for.
        discovery: Discovery,
        /// Per-target timeout, concurrency and body limit.
        options: ScrapeOptions,
        /// Time between cycles.
        interval: Duration,
        /// The scraper's own instruments.
        metrics: ScrapeMetrics,
        /// `--source auto`: the fallbacks of nodes whose direct scrape fails (none: direct
        /// only, `--source kube-proxy`).
        auto: Option<Box<Auto>>,
    },
    /// Query a Prometheus server.
    Prometheus {
        /// Its base URL.
        url: String,
        /// The analysed window.
        window: Duration,
        /// Per-query timeout.
        timeout: Duration,
        /// Time between rounds.
        interval: Duration,
        /// Namespace of kube-proxy's ConfigMap (minSyncPeriod).
        kube_proxy_namespace: String,
    },
    /// Saved scrapes already in the store: nothing runs; one generation announces them.
    Files,
}

/// The fallbacks of `--source auto`, as settings (the loop builds its [`Fallbacks`] each time
/// it starts).
#[derive(Debug, Clone)]
pub struct Auto {
    /// `--agent-target` entries (empty: agent pods found by `agent_selector`).
    pub agent_targets: Vec<Target>,
    /// The namespace of the agent pods (the operator's, unless `--agent-namespace`).
    pub agent_namespace: String,
    /// Label selector of the agent pods.
    pub agent_selector: String,
    /// The agents' mutual-TLS port.
    pub agent_port: u16,
    /// The operator's client certificate for the agents.
    pub client_files: AgentClientFiles,
    /// Prometheus, last (`--prometheus-url`), with its window.
    pub prometheus_url: Option<String>,
    /// The window of the Prometheus queries.
    pub window: Duration,
}

impl Auto {
    /// The fallbacks for one run of the loop; requests bounded by `timeout`.
    fn fallbacks(&self, client: &kube::Client, timeout: Duration) -> Fallbacks {
        let targets = if self.agent_targets.is_empty() {
            AgentTargets::Kube { client: client.clone(), namespace: self.agent_namespace.clone(), selector: self.agent_selector.clone(), port: self.agent_port }
        } else {
            AgentTargets::Static(self.agent_targets.clone())
        };
        let prometheus = self.prometheus_url.as_deref().and_then(|url| match PrometheusSource::new(url, self.window, timeout) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!(error = %e, "Prometheus fallback disabled");
                None
            }
        });
        Fallbacks { agents: Some(AgentSource::new(targets, self.client_files.clone(), timeout)), prometheus }
    }
}

/// Starts `measurement` in `tasks`: the source's loop runs while `shared.leader` is true.
pub fn spawn(shared: &Shared, tasks: &mut Tasks, measurement: Measurement) {
    if let Measurement::Files = measurement {
        shared.generation.send_modify(|g| *g += 1);
        return;
    }
    let ctx = shared.clone();
    let start = move |token: CancellationToken| -> BoxFuture<'static, ()> {
        match &measurement {
            Measurement::Prometheus { url, window, timeout, interval, kube_proxy_namespace } => {
                match PrometheusSource::new(url, *window, *timeout) {
                    Ok(src) => PrometheusLoop::new(src, ctx.store.clone(), ctx.generation.clone())
                        .with_interval(*interval)
                        // minSyncPeriod from the kube-proxy ConfigMap, every 10 rounds
                        .with_configmap(ctx.client.clone(), kube_proxy_namespace, ctx.proxy.clone(), 10)
                        .run(token)
                        .boxed(),
                    Err(e) => {
                        tracing::error!(error = %e, "Prometheus source");
                        futures::future::ready(()).boxed()
                    }
                }
            }
            Measurement::KubeProxy { static_targets, discovery, options, interval, metrics, auto } => {
                let source = if static_targets.is_empty() {
                    TargetSource::Kube { client: ctx.client.clone(), discovery: discovery.clone() }
                } else {
                    TargetSource::Static(static_targets.clone())
                };
                let mut scrape = ScrapeLoop::new(source, ctx.store.clone(), ctx.generation.clone())
                    .with_interval(*interval)
                    .with_options(options.clone())
                    .with_metrics(metrics.clone())
                    // publishes kube-proxy's configuration straight into the controller's handle
                    .with_proxy_config(ctx.proxy.clone());
                if let Some(auto) = auto {
                    scrape = scrape.with_fallbacks(auto.fallbacks(&ctx.client, options.timeout));
                }
                scrape.run(token).boxed()
            }
            Measurement::Files => futures::future::ready(()).boxed(),
        }
    };
    tasks.spawn("measurement", measure_while_leading(start, shared.leader.clone(), shared.stop.clone()));
}

/// Runs a measurement loop (kube-proxy scraping or Prometheus queries: `start(token)` returns
/// it) only while `leader` is true: started on acquiring the lease, cancelled on losing it, so
/// only one replica measures. Returns on `stop`.
pub async fn measure_while_leading(
    mut start: impl FnMut(CancellationToken) -> BoxFuture<'static, ()>,
    mut leader: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    loop {
        while !*leader.borrow_and_update() {
            tokio::select! {
                _ = stop.cancelled() => return,
                r = leader.changed() => if r.is_err() { return },
            }
        }
        tracing::info!("leading: measuring");
        let running = stop.child_token();
        let task = tokio::spawn(start(running.clone()));
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                r = leader.changed() => if r.is_err() || !*leader.borrow() { break },
            }
        }
        running.cancel();
        let _ = task.await;
        if stop.is_cancelled() {
            return;
        }
        tracing::info!("lost the lease: measuring stopped");
    }
}
