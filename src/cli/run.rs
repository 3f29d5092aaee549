//! `safe-termination run`: the operator process. Wires the measurement source, the
//! TerminationPolicy controller, the plan publisher, the capability probe, the Service index,
//! leader election, the HTTPS webhook and the admin port under one shutdown signal.
//!
//! Every replica serves the webhook from the plan its own watch builds out of the policies'
//! status; only the lease holder measures and writes status. The process exits non-zero when
//! any task dies (a dead lease task included) and drains gracefully on SIGTERM (a second
//! signal aborts).

use crate::advisor::Thresholds;
use crate::cli::webhook::{Listeners, Served, ServingArgs, serve_with};
use crate::cli::{Error, number_in, parse_proxy_mode, whole_in};
use crate::model::ProxyMode;
use crate::controller::cluster::ClusterIndex;
use crate::controller::reconcile::{self, Context, Settings};
use crate::measure::MeasurementStore;
use crate::controller::metrics::{ControllerMetrics, KubeProxyMetrics};
use crate::controller::planner::DefaultPolicyRef;
use crate::sources::prometheus::{PrometheusLoop, PrometheusSource};
use crate::sources::scrape::{Discovery, ScrapeLoop, ScrapeMetrics, ScrapeOptions, TargetSource, parse_static_targets};
use crate::controller::tasks;
use crate::shutdown::Shutdown;
use crate::telemetry::{Readiness, Telemetry};
use crate::webhook::server::PlanHandle;
use futures::FutureExt;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Where measurements come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SourceKind {
    /// Scrape every kube-proxy's `/metrics` (discovered by selector, or `--kube-proxy-target`).
    KubeProxy,
    /// Query a Prometheus server (`--prometheus-url`).
    Prometheus,
    /// Saved scrapes (`--metrics-file NODE=FILE`), read once: air-gapped use and tests.
    Files,
}

/// Arguments of `run`. Every flag has an environment variable.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub serving: ServingArgs,
    /// The operator's namespace (capability probe, lease).
    #[arg(long, env = "POD_NAMESPACE", default_value = "safe-termination")]
    pub namespace: String,
    /// This replica's identity in the lease (defaults to the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Lease name for leader election.
    #[arg(long, env = "SAFE_TERMINATION_LEASE_NAME", default_value = "safe-termination-leader")]
    pub lease_name: String,
    /// Run without leader election (one replica only).
    #[arg(long, env = "SAFE_TERMINATION_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
    /// Measurement source.
    #[arg(long, value_enum, env = "SAFE_TERMINATION_SOURCE", default_value_t = SourceKind::KubeProxy)]
    pub source: SourceKind,
    /// Namespace of the kube-proxy pods.
    #[arg(long, env = "SAFE_TERMINATION_KUBE_PROXY_NAMESPACE", default_value = "kube-system")]
    pub kube_proxy_namespace: String,
    /// Label selector of the kube-proxy pods.
    #[arg(long, env = "SAFE_TERMINATION_KUBE_PROXY_SELECTOR", default_value = "k8s-app=kube-proxy")]
    pub kube_proxy_selector: String,
    /// kube-proxy metrics port.
    #[arg(long, env = "SAFE_TERMINATION_KUBE_PROXY_PORT", default_value_t = 10249)]
    pub kube_proxy_port: u16,
    /// Label selector of Cilium agent pods, looked for in all namespaces when no kube-proxy pod
    /// is found: with one running, the proxy mode is `ebpf` and sizing uses the policy default
    /// (empty: never look).
    #[arg(long, env = "SAFE_TERMINATION_CILIUM_SELECTOR", default_value = "k8s-app=cilium")]
    pub cilium_selector: String,
    /// Fixed kube-proxy targets `NODE=http://IP:PORT` instead of discovery (comma-separated or
    /// repeated).
    #[arg(long = "kube-proxy-target", env = "SAFE_TERMINATION_KUBE_PROXY_TARGETS", value_delimiter = ',')]
    pub kube_proxy_targets: Vec<String>,
    /// Prometheus base URL for `--source prometheus`.
    #[arg(long, env = "SAFE_TERMINATION_PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,
    /// Saved scrapes `NODE=FILE` for `--source files`.
    #[arg(long = "metrics-file", env = "SAFE_TERMINATION_METRICS_FILES", value_delimiter = ',')]
    pub metrics_files: Vec<String>,
    /// Seconds between measurements (plus up to 10% jitter), 1 to 3600.
    #[arg(long, env = "SAFE_TERMINATION_SCRAPE_INTERVAL_SECONDS", default_value_t = 30, allow_negative_numbers = true, value_parser = whole_in(1u64, 3600, "a whole number of seconds"))]
    pub scrape_interval_seconds: u64,
    /// Per-target scrape timeout, seconds, 1 to 300.
    #[arg(long, env = "SAFE_TERMINATION_SCRAPE_TIMEOUT_SECONDS", default_value_t = 5, allow_negative_numbers = true, value_parser = whole_in(1u64, 300, "a whole number of seconds"))]
    pub scrape_timeout_seconds: u64,
    /// kube-proxies scraped at once.
    #[arg(long, env = "SAFE_TERMINATION_SCRAPE_MAX_IN_FLIGHT", default_value_t = 64)]
    pub scrape_max_in_flight: usize,
    /// Rolling analysis window, seconds, 60 to 86400.
    #[arg(long, env = "SAFE_TERMINATION_WINDOW_SECONDS", default_value_t = 600, allow_negative_numbers = true, value_parser = whole_in(60u64, 86_400, "a whole number of seconds"))]
    pub window_seconds: u64,
    /// kube-proxy minSyncPeriod, seconds (0 to 300), overriding what /configz or the ConfigMap say.
    #[arg(long, env = "SAFE_TERMINATION_MIN_SYNC_PERIOD_SECONDS", allow_negative_numbers = true, value_parser = number_in(0.0, 300.0, false, "a number of seconds"))]
    pub min_sync_period_seconds: Option<f64>,
    /// Proxy mode, overriding /proxyMode, the ConfigMap and inference (`ebpf` when there is no
    /// kube-proxy: sizing then uses each policy's defaultSeconds; a running Cilium agent without
    /// kube-proxy pods is detected without this flag, see --cilium-selector).
    #[arg(long, env = "SAFE_TERMINATION_PROXY_MODE", value_parser = parse_proxy_mode)]
    pub proxy_mode: Option<ProxyMode>,
    /// `NAMESPACE/NAME` of the TerminationPolicy that applies to namespaces without one (off
    /// by default: such namespaces are not mutated).
    #[arg(long, env = "SAFE_TERMINATION_DEFAULT_POLICY")]
    pub default_policy: Option<String>,
    /// Seconds between capability probes, 1 to 86400 (also re-probed when the API server
    /// version changes).
    #[arg(long, env = "SAFE_TERMINATION_PROBE_INTERVAL_SECONDS", default_value_t = 600, allow_negative_numbers = true, value_parser = whole_in(1u64, 86_400, "a whole number of seconds"))]
    pub probe_interval_seconds: u64,
    /// ProxySyncSlow threshold, seconds (above 0, at most 3600).
    #[arg(long, env = "SAFE_TERMINATION_SYNC_SLOW_SECONDS", default_value_t = 1.0, allow_negative_numbers = true, value_parser = number_in(0.0, 3600.0, true, "a number of seconds"))]
    pub sync_slow_seconds: f64,
    /// iptables -> nftables threshold, Services.
    #[arg(long, env = "SAFE_TERMINATION_IPTABLES_SERVICES_THRESHOLD", default_value_t = 1000, allow_negative_numbers = true, value_parser = whole_in(1u64, 100_000_000, "a whole number of Services"))]
    pub iptables_services_threshold: u64,
    /// eBPF dataplane threshold, Services.
    #[arg(long, env = "SAFE_TERMINATION_EBPF_SERVICES_THRESHOLD", default_value_t = 8000, allow_negative_numbers = true, value_parser = whole_in(1u64, 100_000_000, "a whole number of Services"))]
    pub ebpf_services_threshold: u64,
    /// ProxyStale threshold, seconds (above 0, at most 86400).
    #[arg(long, env = "SAFE_TERMINATION_STALE_SECONDS", default_value_t = 30.0, allow_negative_numbers = true, value_parser = number_in(0.0, 86_400.0, true, "a number of seconds"))]
    pub stale_seconds: f64,
    /// Rewrite an unchanged status at most this often, seconds, 1 to 86400.
    #[arg(long, env = "SAFE_TERMINATION_STATUS_REFRESH_SECONDS", default_value_t = 300, allow_negative_numbers = true, value_parser = whole_in(1u64, 86_400, "a whole number of seconds"))]
    pub status_refresh_seconds: u64,
    /// Secret (in --namespace) where the leader keeps a generated CA and serving certificate,
    /// renewed at 2/3 of their lifetime (off when unset: certificates come from elsewhere).
    #[arg(long, env = "SAFE_TERMINATION_CERT_SECRET")]
    pub cert_secret: Option<String>,
    /// The webhook Service: the serving certificate is for `<service>.<namespace>.svc`.
    #[arg(long, env = "SAFE_TERMINATION_WEBHOOK_SERVICE", default_value = "safe-termination")]
    pub webhook_service: String,
    /// MutatingWebhookConfiguration whose caBundle the leader keeps equal to the generated CA.
    #[arg(long, env = "SAFE_TERMINATION_WEBHOOK_CONFIGURATION")]
    pub webhook_configuration: Option<String>,
    /// More names or IP addresses for the generated serving certificate (out-of-cluster runs).
    #[arg(long = "cert-extra-san", env = "SAFE_TERMINATION_CERT_EXTRA_SANS", value_delimiter = ',')]
    pub cert_extra_sans: Vec<String>,
    /// Also copy the generated certificate from the Secret to --tls-cert-file/--tls-key-file
    /// (out of cluster; in a pod the kubelet updates the mounted Secret).
    #[arg(long, env = "SAFE_TERMINATION_WRITE_CERT_FILES")]
    pub write_cert_files: bool,
    /// Seconds between certificate checks, 1 to 86400.
    #[arg(long, env = "SAFE_TERMINATION_CERT_CHECK_INTERVAL_SECONDS", default_value_t = 60, allow_negative_numbers = true, value_parser = whole_in(1u64, 86_400, "a whole number of seconds"))]
    pub cert_check_interval_seconds: u64,
}

/// Runs the operator until a shutdown signal. Call inside a Tokio runtime.
pub async fn run(args: &RunArgs) -> Result<(), Error> {
    let shutdown = Shutdown::new();
    shutdown.listen_for_signals().map_err(|e| Error::Io(format!("cannot install signal handlers: {e}")))?;
    let listeners = Listeners::bind(&args.serving).await?;
    run_with(args, listeners, shutdown).await
}

/// The operator on already-bound listeners (the testable core of [`run`]).
pub async fn run_with(args: &RunArgs, listeners: Listeners, shutdown: Shutdown) -> Result<(), Error> {
    let default_ref = args.default_policy.as_deref().map(DefaultPolicyRef::parse).transpose().map_err(|e| Error::Usage(e.to_string()))?;
    let window = args.window_seconds as f64;
    let files_store = match args.source {
        SourceKind::Files => Some(crate::sources::store_from_files(&args.metrics_files, window).map_err(|e| Error::Usage(e.to_string()))?),
        _ => None,
    };
    if args.source == SourceKind::Prometheus && args.prometheus_url.is_none() {
        return Err(Error::Usage("--source prometheus needs --prometheus-url".into()));
    }
    let static_targets = parse_static_targets(&args.kube_proxy_targets).map_err(|e| Error::Usage(e.to_string()))?;
    let client = Client::try_default().await.map_err(|e| Error::Io(format!("cannot build a Kubernetes client: {e}")))?;

    let telemetry = Telemetry::new();
    let kube_proxy_metrics = KubeProxyMetrics::default();
    let controller_metrics = ControllerMetrics::default();
    let scrape_metrics = ScrapeMetrics::default();
    let _ = telemetry.register("kube_proxy", |r| kube_proxy_metrics.register(r));
    let _ = telemetry.register("controller", |r| controller_metrics.register(r));
    let _ = telemetry.register("scrape", |r| scrape_metrics.register(r));
    let readiness = Readiness::new();

    let plans = PlanHandle::new();
    let cluster = Arc::new(ClusterIndex::default());
    let store = Arc::new(Mutex::new(files_store.unwrap_or_else(|| MeasurementStore::new(window))));
    let (generation_tx, generation_rx) = watch::channel(0u64);
    let (native_tx, native_rx) = watch::channel(false);
    let stop = shutdown.token();
    let mut tasks: JoinSet<&'static str> = JoinSet::new();

    // leader election
    let (leader_rx, lease_task) = if args.no_leader_election {
        let (tx, rx) = watch::channel(true);
        std::mem::forget(tx); // stays leader for the process's life
        (rx, None)
    } else {
        let identity = args.identity.clone().unwrap_or_else(|| {
            std::env::var("HOSTNAME").unwrap_or_else(|_| format!("safe-termination-{}", std::process::id()))
        });
        let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.lease_name)
            .with_namespace(&args.namespace)
            .with_identity(identity)
            .with_field_manager("safe-termination-lease")
            .build()
            .await
            .map_err(|e| Error::Io(format!("leader election: {e}")))?;
        let (rx, handle) = manager.watch().await;
        (rx, Some(handle))
    };
    if let Some(handle) = lease_task {
        let stop = stop.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                r = handle => tracing::error!(result = ?r.map(|r| r.map(|_| ())), "the lease task ended"),
            }
            "lease"
        });
    }

    {
        let (client, cluster, stop) = (client.clone(), cluster.clone(), stop.clone());
        tasks.spawn(async move {
            cluster.run(client, stop).await;
            "service index"
        });
    }
    {
        let (client, plans, stop) = (client.clone(), plans.clone(), stop.clone());
        tasks.spawn(async move {
            tasks::publish_plans(client, plans, native_rx, default_ref, stop).await;
            "plan publisher"
        });
    }
    {
        let (client, ns, stop) = (client.clone(), args.namespace.clone(), stop.clone());
        let interval = Duration::from_secs(args.probe_interval_seconds);
        tasks.spawn(async move {
            tasks::probe_capabilities(client, ns, native_tx, interval, stop).await;
            "capability probe"
        });
    }

    // operator-managed webhook certificates (leader writes; --write-cert-files: every replica copies)
    if let Some(secret) = &args.cert_secret {
        let mut cfg = crate::webhook::certs::CertConfig::new(secret, &args.namespace, &args.webhook_service);
        cfg.extra_sans = args.cert_extra_sans.clone();
        cfg.webhook_configuration = args.webhook_configuration.clone();
        cfg.files = args.write_cert_files.then(|| (args.serving.tls_cert_file.clone(), args.serving.tls_key_file.clone()));
        cfg.interval = Duration::from_secs(args.cert_check_interval_seconds.max(1));
        let (client, leader, stop) = (client.clone(), leader_rx.clone(), stop.clone());
        tasks.spawn(async move {
            crate::webhook::certs::run(client, cfg, leader, stop).await;
            "certificates"
        });
    }

    // measurement (leader only)
    let proxy_config = Arc::new(RwLock::new(Default::default()));
    if args.source != SourceKind::Files {
        let (args2, client2, store2, gen2, proxy2, metrics2) =
            (args.clone(), client.clone(), store.clone(), generation_tx.clone(), proxy_config.clone(), scrape_metrics.clone());
        let static_targets = static_targets.clone();
        let start = move |token: tokio_util::sync::CancellationToken| -> futures::future::BoxFuture<'static, ()> {
            match args2.source {
                SourceKind::Prometheus => {
                    let url = args2.prometheus_url.clone().unwrap_or_default();
                    match PrometheusSource::new(&url, Duration::from_secs(args2.window_seconds), Duration::from_secs(args2.scrape_timeout_seconds)) {
                        Ok(src) => PrometheusLoop::new(src, store2.clone(), gen2.clone())
                            .with_interval(Duration::from_secs(args2.scrape_interval_seconds))
                            // minSyncPeriod from the kube-proxy ConfigMap, every 10 rounds
                            .with_configmap(client2.clone(), &args2.kube_proxy_namespace, proxy2.clone(), 10)
                            .run(token)
                            .boxed(),
                        Err(e) => {
                            tracing::error!(error = %e, "Prometheus source");
                            futures::future::ready(()).boxed()
                        }
                    }
                }
                _ => {
                    let source = if static_targets.is_empty() {
                        TargetSource::Kube {
                            client: client2.clone(),
                            discovery: Discovery {
                                namespace: args2.kube_proxy_namespace.clone(),
                                selector: args2.kube_proxy_selector.clone(),
                                port: args2.kube_proxy_port,
                                cilium_selector: args2.cilium_selector.clone(),
                            },
                        }
                    } else {
                        TargetSource::Static(static_targets.clone())
                    };
                    ScrapeLoop::new(source, store2.clone(), gen2.clone())
                        .with_interval(Duration::from_secs(args2.scrape_interval_seconds))
                        .with_options(ScrapeOptions {
                            timeout: Duration::from_secs(args2.scrape_timeout_seconds),
                            max_in_flight: args2.scrape_max_in_flight,
                            ..Default::default()
                        })
                        .with_metrics(metrics2.clone())
                        // publishes kube-proxy's configuration straight into the controller's handle
                        .with_proxy_config(proxy2.clone())
                        .run(token)
                    .boxed()
                }
            }
        };
        let (leader, stop) = (leader_rx.clone(), stop.clone());
        tasks.spawn(async move {
            tasks::measure_while_leading(start, leader, stop).await;
            "measurement"
        });
    } else {
        generation_tx.send_modify(|g| *g += 1);
    }

    // controller
    {
        let settings = Settings {
            thresholds: Thresholds {
                sync_slow_seconds: args.sync_slow_seconds,
                iptables_services: args.iptables_services_threshold,
                ebpf_services: args.ebpf_services_threshold,
                conntrack_usage_ratio: Thresholds::default().conntrack_usage_ratio,
                stale_seconds: args.stale_seconds,
            },
            status_refresh_seconds: args.status_refresh_seconds as f64,
            mode_override: args.proxy_mode,
            min_sync_period_override: args.min_sync_period_seconds,
            no_kube_proxy_note: (args.proxy_mode == Some(ProxyMode::Ebpf))
                .then(|| "no kube-proxy (eBPF dataplane): sized from the policy default".to_string()),
            ..Settings::default()
        };
        let reporter = Reporter { controller: "safe-termination".into(), instance: args.identity.clone() };
        let recorder = Recorder::new(client.clone(), reporter);
        let (client2, store2, cluster2, proxy2, leader2, km, cm) =
            (client.clone(), store.clone(), cluster.clone(), proxy_config.clone(), leader_rx.clone(), kube_proxy_metrics.clone(), controller_metrics.clone());
        let make = move |policies| Context {
            client: client2,
            store: store2,
            cluster: cluster2,
            proxy: proxy2,
            leader: leader2,
            recorder,
            settings,
            metrics: cm,
            kube_proxy_metrics: km,
            policies,
        };
        let (client, leader, stop) = (client.clone(), leader_rx.clone(), stop.clone());
        tasks.spawn(async move {
            reconcile::run(client, make, generation_rx, leader, stop).await;
            "controller"
        });
    }

    let parts = Served { plan: plans, services: cluster.clone(), telemetry, readiness };
    let serving = serve_with(&args.serving, listeners, parts, shutdown.clone());
    let mut serving = std::pin::pin!(serving);
    let result = tokio::select! {
        r = &mut serving => r,
        Some(done) = tasks.join_next() => {
            let name = done.unwrap_or("a task");
            if stop.is_cancelled() {
                serving.await
            } else {
                tracing::error!(task = name, "a task of the operator stopped: shutting down");
                shutdown.trigger();
                let _ = serving.await;
                Err(Error::Io(format!("the {name} task stopped")))
            }
        }
    };
    stop.cancel();
    let drain = tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} });
    if drain.await.is_err() {
        tasks.abort_all();
    }
    result
}
