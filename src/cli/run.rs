//! `safe-termination run`: the operator process. Wires the measurement source, the
//! TerminationPolicy controller, the plan publisher, the capability probe, the Service index,
//! leader election, the HTTPS webhook and the admin port under one shutdown signal.
//!
//! Every replica serves the webhook from the plan its own watch builds out of the policies'
//! status; only the lease holder measures and writes status. The process exits non-zero when
//! any task dies (a dead lease task included) and drains gracefully on SIGTERM (a second
//! signal aborts).

use crate::certs::{self, CertConfig};
use crate::cli::webhook::{Listeners, Served, ServingArgs, serve_with};
use crate::cli::{Error, number_in, parse_proxy_mode, whole_in};
use crate::controller::admission::{AdmissionMetrics, cluster_role_owner, serves_policy_v1};
use crate::controller::{
    self,
    metrics::{ControllerMetrics, KubeProxyMetrics},
    planner::DefaultPolicyRef,
    reconcile::ControllerSettings,
};
use crate::core::admission::policy::{PolicyObjects, default_namespace_selector};
use crate::core::admission::{ActiveBackend, BackendSetting};
use crate::core::advisor::Thresholds;
use crate::core::measure::MeasurementStore;
use crate::core::model::ProxyMode;
use crate::runtime::{self, Leadership, Shared, Tasks};
use crate::shutdown::Shutdown;
use crate::sources::agent_client::AgentClientFiles;
use crate::sources::scrape::{ScrapeMetrics, ScrapeOptions};
use crate::sources::spawn::Auto;
use crate::sources::targets::{Discovery, parse_static_targets};
use crate::sources::{self, Measurement, SourceError, store_from_files};
use crate::telemetry::{Readiness, Telemetry};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Client;
use std::time::Duration;

/// Where measurements come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SourceKind {
    /// Per node: kube-proxy's `/metrics` directly, else through the node's agent, else
    /// Prometheus when `--prometheus-url` is set (`sources::auto`).
    Auto,
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
    #[arg(long, value_enum, env = "SAFE_TERMINATION_SOURCE", default_value_t = SourceKind::Auto)]
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
    /// Namespace of the node agent pods and of --agent-cert-secret (default: --namespace; their
    /// hostNetwork needs the privileged Pod Security level, which a restricted operator
    /// namespace refuses).
    #[arg(long, env = "SAFE_TERMINATION_AGENT_NAMESPACE")]
    pub agent_namespace: Option<String>,
    /// Label selector of the node agent pods (in --agent-namespace), for `--source auto`.
    #[arg(long, env = "SAFE_TERMINATION_AGENT_SELECTOR", default_value = crate::sources::agent_client::DEFAULT_AGENT_SELECTOR)]
    pub agent_selector: String,
    /// The node agents' mutual-TLS port.
    #[arg(long, env = "SAFE_TERMINATION_AGENT_PORT", default_value_t = crate::agent_contract::protocol::DEFAULT_PORT)]
    pub agent_port: u16,
    /// Fixed agent targets `NODE=https://IP:PORT` instead of the agent pods (comma-separated or
    /// repeated).
    #[arg(long = "agent-target", env = "SAFE_TERMINATION_AGENT_TARGETS", value_delimiter = ',')]
    pub agent_targets: Vec<String>,
    /// CA bundle the agents' certificate chains to, PEM (re-read every cycle).
    #[arg(long, value_name = "FILE", env = "SAFE_TERMINATION_AGENT_CA_FILE", default_value = "/etc/safe-termination/tls/ca.crt")]
    pub agent_ca_file: std::path::PathBuf,
    /// The operator's client certificate for the agents, PEM.
    #[arg(long, value_name = "FILE", env = "SAFE_TERMINATION_AGENT_CLIENT_CERT_FILE", default_value = "/etc/safe-termination/tls/client.crt")]
    pub agent_client_cert_file: std::path::PathBuf,
    /// Its private key, PEM.
    #[arg(long, value_name = "FILE", env = "SAFE_TERMINATION_AGENT_CLIENT_KEY_FILE", default_value = "/etc/safe-termination/tls/client.key")]
    pub agent_client_key_file: std::path::PathBuf,
    /// With --cert-secret: the Secret (in --agent-namespace, default --namespace) where the
    /// leader also keeps the node agents' certificate (ca.crt, tls.crt, tls.key; no CA or
    /// client key).
    #[arg(long, env = "SAFE_TERMINATION_AGENT_CERT_SECRET")]
    pub agent_cert_secret: Option<String>,
    /// Observe every removal through the node agents (`--agent-target`s, else the agent pods):
    /// each pod deletion's endpoint is watched on every node until its data plane drops it,
    /// and W covers the p99 of what was observed (docs/architecture.md "The observer").
    #[arg(long, env = "SAFE_TERMINATION_OBSERVE_REMOVALS")]
    pub observe_removals: bool,
    /// HTTPS address of the preStop waiter endpoint (`GET /wait/v1`), on its own socket and
    /// connection cap: a rollout's long polls never take the admission webhook's connections.
    #[arg(long, default_value = "0.0.0.0:8444", env = "SAFE_TERMINATION_WAIT_LISTEN")]
    pub wait_listen: std::net::SocketAddr,
    /// The image whose `/usr/local/bin/safe-termination-wait` the init container of `Wait`
    /// policies' pods copies (the chart: the operator's own image, by digest when given one).
    #[arg(long, env = "SAFE_TERMINATION_WAIT_IMAGE")]
    pub wait_image: Option<String>,
    /// The serving CA the waiter checks the operator's certificate with, PEM (written on each
    /// `Wait` pod and in each namespace's ConfigMap; re-read every 30 s).
    #[arg(long, value_name = "FILE", env = "SAFE_TERMINATION_WAIT_CA_FILE", default_value = "/etc/safe-termination/tls/ca.crt")]
    pub wait_ca_file: std::path::PathBuf,
    /// Prometheus base URL for `--source prometheus`, and the last fallback of `--source auto`.
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
    /// Which backend mutates pods: `webhook`, `policy` (a MutatingAdmissionPolicy the leader
    /// keeps at the measured values; needs Kubernetes 1.36+) or `auto` (the policy where the API
    /// server serves MutatingAdmissionPolicy v1, else the webhook).
    #[arg(long, value_enum, env = "SAFE_TERMINATION_ADMISSION_BACKEND", default_value_t = BackendSetting::Auto)]
    pub admission_backend: BackendSetting,
    /// Name of the MutatingAdmissionPolicy, its binding and its TerminationParameters object
    /// (in --namespace).
    #[arg(long, env = "SAFE_TERMINATION_ADMISSION_POLICY_NAME", default_value = crate::core::admission::policy::DEFAULT_NAME)]
    pub admission_policy_name: String,
    /// The policy binding's namespaceSelector, a LabelSelector as JSON (default: every namespace
    /// but kube-system, --namespace and those labelled safetermination.io/ignore=true, as the
    /// chart's webhook configuration).
    #[arg(long, env = "SAFE_TERMINATION_ADMISSION_NAMESPACE_SELECTOR")]
    pub admission_namespace_selector: Option<String>,
    /// ClusterRole that owns the policy, binding and parameters (the chart's), so uninstalling
    /// deletes them (unset: no owner).
    #[arg(long, env = "SAFE_TERMINATION_ADMISSION_OWNER_CLUSTER_ROLE")]
    pub admission_owner_cluster_role: Option<String>,
}

impl RunArgs {
    /// The measurement source of `--source`, checked. Errors: usage (exit 2) for a
    /// `--metrics-file` not written `NODE=FILE`, a `--kube-proxy-target` that cannot be used,
    /// `--source prometheus` without a URL; input (exit 1) for a `--metrics-file` that cannot be
    /// read or is not a scrape.
    fn measurement(&self, scrape_metrics: &ScrapeMetrics) -> Result<(Measurement, MeasurementStore), Error> {
        let usage = |e: SourceError| Error::Usage(e.to_string());
        let window = self.window_seconds as f64;
        let files = match self.source {
            SourceKind::Files => Some(store_from_files(&self.metrics_files, window).map_err(|e| match e {
                SourceError::MetricsFileSpec(_) => usage(e),
                e => Error::Input(e.to_string()),
            })?),
            _ => None,
        };
        let prometheus_url = match (self.source, &self.prometheus_url) {
            (SourceKind::Prometheus, None) => return Err(Error::Usage("--source prometheus needs --prometheus-url".into())),
            (_, url) => url.clone().unwrap_or_default(),
        };
        let static_targets = parse_static_targets(&self.kube_proxy_targets).map_err(usage)?;
        let agent_targets = parse_static_targets(&self.agent_targets).map_err(usage)?;
        let auto = (self.source == SourceKind::Auto).then(|| {
            Box::new(Auto {
                agent_targets,
                agent_namespace: self.agent_namespace.clone().unwrap_or_else(|| self.namespace.clone()),
                agent_selector: self.agent_selector.clone(),
                agent_port: self.agent_port,
                client_files: AgentClientFiles {
                    ca: self.agent_ca_file.clone(),
                    cert: self.agent_client_cert_file.clone(),
                    key: self.agent_client_key_file.clone(),
                },
                prometheus_url: self.prometheus_url.clone(),
                window: Duration::from_secs(self.window_seconds),
            })
        });
        let measurement = match self.source {
            SourceKind::Files => return Ok((Measurement::Files, files.unwrap_or_else(|| MeasurementStore::new(window)))),
            SourceKind::Prometheus => Measurement::Prometheus {
                url: prometheus_url,
                window: Duration::from_secs(self.window_seconds),
                timeout: Duration::from_secs(self.scrape_timeout_seconds),
                interval: Duration::from_secs(self.scrape_interval_seconds),
                kube_proxy_namespace: self.kube_proxy_namespace.clone(),
            },
            SourceKind::KubeProxy | SourceKind::Auto => Measurement::KubeProxy {
                static_targets,
                discovery: Discovery {
                    namespace: self.kube_proxy_namespace.clone(),
                    selector: self.kube_proxy_selector.clone(),
                    port: self.kube_proxy_port,
                    cilium_selector: self.cilium_selector.clone(),
                },
                options: ScrapeOptions {
                    timeout: Duration::from_secs(self.scrape_timeout_seconds),
                    max_in_flight: self.scrape_max_in_flight,
                    ..Default::default()
                },
                interval: Duration::from_secs(self.scrape_interval_seconds),
                metrics: scrape_metrics.clone(),
                auto,
            },
        };
        Ok((measurement, MeasurementStore::new(window)))
    }

    /// The controller's configuration. Errors (usage): a `--default-policy` that is not
    /// `NAMESPACE/NAME`.
    fn controller(&self, metrics: &ControllerMetrics, kube_proxy_metrics: &KubeProxyMetrics) -> Result<controller::Config, Error> {
        let default_policy = self.default_policy.as_deref().map(DefaultPolicyRef::parse).transpose().map_err(|e| Error::Usage(e.to_string()))?;
        let settings = ControllerSettings {
            thresholds: Thresholds {
                sync_slow_seconds: self.sync_slow_seconds,
                iptables_services: self.iptables_services_threshold,
                ebpf_services: self.ebpf_services_threshold,
                conntrack_usage_ratio: Thresholds::default().conntrack_usage_ratio,
                stale_seconds: self.stale_seconds,
            },
            status_refresh_seconds: self.status_refresh_seconds as f64,
            mode_override: self.proxy_mode,
            min_sync_period_override: self.min_sync_period_seconds,
            no_kube_proxy_note: (self.proxy_mode == Some(ProxyMode::Ebpf)).then(|| "no kube-proxy (eBPF dataplane): sized from the policy default".to_string()),
            ..ControllerSettings::default()
        };
        Ok(controller::Config {
            settings,
            namespace: self.namespace.clone(),
            identity: self.identity.clone(),
            probe_interval: Duration::from_secs(self.probe_interval_seconds),
            default_policy,
            admission: None,
            metrics: metrics.clone(),
            kube_proxy_metrics: kube_proxy_metrics.clone(),
            wait: Some(self.wait_settings()),
        })
    }

    /// Where `Wait` policies' pods find the waiter: the image, the URL of the webhook Service
    /// (`https://<service>.<namespace>.svc:443/wait/v1`, the name its certificate holds) and the
    /// CA file.
    fn wait_settings(&self) -> controller::wait::WaitSettings {
        let base = crate::core::wait::WaitInjection {
            image: self.wait_image.clone().unwrap_or_else(|| crate::core::wait::WaitInjection::default().image),
            url: format!("https://{}.{}.svc:{}/wait/v1", self.webhook_service, self.namespace, self.wait_listen.port()),
            address: None,
            ca_pem: String::new(),
        };
        controller::wait::WaitSettings { base, ca_file: self.wait_ca_file.clone(), namespace: self.namespace.clone(), service: self.webhook_service.clone() }
    }

    /// The admission backend, resolved: `auto` by discovery, and the policy's objects. Errors:
    /// a bad `--admission-namespace-selector` or `--admission-backend policy` on an API server
    /// without MutatingAdmissionPolicy v1 (usage); discovery or the owner look-up failed (I/O).
    async fn admission(&self, client: &Client, metrics: AdmissionMetrics) -> Result<controller::AdmissionConfig, Error> {
        let namespace_selector = match &self.admission_namespace_selector {
            None => default_namespace_selector(&self.namespace),
            Some(s) => {
                let bad = |e: serde_json::Error| Error::Usage(format!("--admission-namespace-selector {s:?} is not a LabelSelector in JSON: {e}"));
                let v: serde_json::Value = serde_json::from_str(s).map_err(bad)?;
                serde_json::from_value::<LabelSelector>(v.clone()).map_err(bad)?;
                v
            }
        };
        // discovery only where the setting needs its answer
        let serves = match self.admission_backend {
            BackendSetting::Webhook => None,
            BackendSetting::Policy | BackendSetting::Auto => Some(
                serves_policy_v1(client)
                    .await
                    .map_err(|e| Error::Io(format!("cannot discover whether the API server serves MutatingAdmissionPolicy v1: {e}")))?,
            ),
        };
        let active = crate::core::admission::backend::resolve(self.admission_backend, serves == Some(true)).map_err(|e| Error::Usage(e.to_string()))?;
        let owner = match (&self.admission_owner_cluster_role, active) {
            (Some(role), ActiveBackend::Policy) => {
                Some(cluster_role_owner(client, role).await.map_err(|e| Error::Io(format!("--admission-owner-cluster-role {role}: cannot read it: {e}")))?)
            }
            _ => None,
        };
        tracing::info!(
            backend = active.as_str(),
            setting = ?self.admission_backend,
            mutating_admission_policy_v1 = crate::core::admission::backend::discovery_note(serves),
            "admission backend"
        );
        let objects = PolicyObjects { name: self.admission_policy_name.clone(), params_namespace: self.namespace.clone(), namespace_selector, owner };
        Ok(controller::AdmissionConfig { active, objects: std::sync::Arc::new(objects), metrics })
    }

    /// The operator-managed certificates' configuration, when `--cert-secret` is set.
    fn certificates(&self) -> Option<CertConfig> {
        let secret = self.cert_secret.as_deref()?;
        let mut cfg = CertConfig::new(secret, &self.namespace, &self.webhook_service);
        cfg.extra_sans = self.cert_extra_sans.clone();
        cfg.webhook_configuration = self.webhook_configuration.clone();
        cfg.files = self.write_cert_files.then(|| (self.serving.tls_cert_file.clone(), self.serving.tls_key_file.clone()));
        cfg.interval = Duration::from_secs(self.cert_check_interval_seconds.max(1));
        cfg.agent_secret = self.agent_cert_secret.clone();
        cfg.agent_namespace = self.agent_namespace.clone();
        Some(cfg)
    }

    /// The node agents as the observer asks them: the `--agent-target`s, else the agent pods.
    fn agent_source(&self, client: &Client) -> Result<crate::sources::agent_client::AgentSource, Error> {
        use crate::sources::agent_client::{AgentSource, AgentTargets};
        let targets = parse_static_targets(&self.agent_targets).map_err(|e| Error::Usage(e.to_string()))?;
        let targets = if targets.is_empty() {
            AgentTargets::Kube {
                client: client.clone(),
                namespace: self.agent_namespace.clone().unwrap_or_else(|| self.namespace.clone()),
                selector: self.agent_selector.clone(),
                port: self.agent_port,
            }
        } else {
            AgentTargets::Static(targets)
        };
        let files = AgentClientFiles { ca: self.agent_ca_file.clone(), cert: self.agent_client_cert_file.clone(), key: self.agent_client_key_file.clone() };
        Ok(AgentSource::new(targets, files, Duration::from_secs(self.scrape_timeout_seconds)))
    }

    /// This replica's name in the lease: `--identity`, else the host name.
    fn lease_identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| std::env::var("HOSTNAME").unwrap_or_else(|_| format!("safe-termination-{}", std::process::id())))
    }
}

/// Runs the operator until a shutdown signal. Call inside a Tokio runtime.
pub async fn run(args: &RunArgs) -> Result<(), Error> {
    let shutdown = Shutdown::new();
    shutdown.listen_for_signals().map_err(|e| Error::Io(format!("cannot install signal handlers: {e}")))?;
    let listeners = Listeners::bind(&args.serving).await?;
    let wait = std::net::TcpListener::bind(args.wait_listen).map_err(|e| Error::Io(format!("cannot listen on {} (--wait-listen): {e}", args.wait_listen)))?;
    run_with(args, listeners, Some(wait), shutdown).await
}

/// The operator on already-bound listeners (the testable core of [`run`]): one [`Shared`]
/// context, then the measurement source, the controller and the certificates spawned into one
/// task set, and the webhook served until shutdown or until any task ends.
pub async fn run_with(args: &RunArgs, listeners: Listeners, wait_listener: Option<std::net::TcpListener>, shutdown: Shutdown) -> Result<(), Error> {
    let telemetry = Telemetry::new();
    let (kube_proxy_metrics, controller_metrics, scrape_metrics) = (KubeProxyMetrics::default(), ControllerMetrics::default(), ScrapeMetrics::default());
    let _ = telemetry.register("kube_proxy", |r| kube_proxy_metrics.register(r));
    let _ = telemetry.register("controller", |r| controller_metrics.register(r));
    let _ = telemetry.register("scrape", |r| scrape_metrics.register(r));
    let admission_metrics = AdmissionMetrics::default();
    let _ = telemetry.register("admission", |r| admission_metrics.register(r));
    let mut controller_config = args.controller(&controller_metrics, &kube_proxy_metrics)?;
    let (measurement, store) = args.measurement(&scrape_metrics)?;
    let client = Client::try_default().await.map_err(|e| Error::Io(format!("cannot build a Kubernetes client: {e}")))?;
    let admission = args.admission(&client, admission_metrics).await?;
    controller_config.settings.admission_backend = Some(admission.active);
    controller_config.admission = Some(admission);

    let stop = shutdown.token();
    let mut tasks = Tasks::new(stop.clone());
    let leadership = if args.no_leader_election {
        Leadership::always()
    } else {
        // in a pod (the chart sets POD_NAME), the lease is released as soon as the pod is deleted
        let own_pod = std::env::var("POD_NAME").ok().filter(|p| !p.is_empty());
        runtime::elect(client.clone(), &args.namespace, &args.lease_name, args.lease_identity(), own_pod, &mut tasks)
            .await
            .map_err(|e| Error::Io(format!("leader election: {e}")))?
    };
    let shared = Shared::new(client, stop.clone(), leadership, store);
    if let Some(cfg) = args.certificates() {
        certs::spawn(&shared, &mut tasks, cfg);
    }
    sources::spawn(&shared, &mut tasks, measurement);
    let published = controller::spawn(&shared, &mut tasks, controller_config);
    if args.observe_removals {
        let agents = args.agent_source(&shared.client)?;
        tasks.spawn("removal observer", controller::observer::run(published.cluster.clone(), agents, shared.clone()));
    }

    let wait_metrics = crate::webhook::wait::WaitMetrics::new();
    let _ = telemetry.register("wait", |r| wait_metrics.register(r));
    let wait = crate::webhook::wait::WaitEndpoint::new(
        std::sync::Arc::new(controller::wait::KubeTokenReviewer::new(shared.client.clone())),
        std::sync::Arc::new(controller::wait::IndexWaitSource::new(published.cluster.clone(), shared.leader.clone())),
        published.plans.clone(),
        wait_metrics,
    );
    let parts =
        Served { plan: published.plans, services: published.cluster, telemetry, readiness: Readiness::new(), wait: wait_listener.map(|l| (l, wait.router())) };
    let mut serving = std::pin::pin!(serve_with(&args.serving, listeners, parts, shutdown.clone()));
    let result = tokio::select! {
        r = &mut serving => r,
        Some(name) = tasks.next_ended() => {
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
    tasks.stop(Duration::from_secs(10)).await;
    drop(shared); // the leadership channel stays open until every task has stopped
    result
}
