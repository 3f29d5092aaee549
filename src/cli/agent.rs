//! `safe-termination agent`: the node agent ([`crate::agent`]). Run as a DaemonSet with
//! `hostNetwork: true` so that it reaches kube-proxy on the node's loopback.
//!
//! Two listeners: the mutual-TLS port (`--listen`: `/metrics`, `/proxyMode`, `/configz`, for the
//! operator only) and the plain-HTTP health port (`--health-listen`: `/healthz`, no data).
//! Footprint: one thread (a current-thread runtime, set up by `main`), no timer and no
//! background task while idle: kube-proxy is read only when the operator asks, and the TLS
//! files only on a handshake or health check, at most once per reload interval.
//! SIGTERM/SIGINT: stop accepting, finish in-flight requests (at most `--drain-seconds`), exit
//! 0; a second signal aborts (exit 130).

use crate::agent::observer::watch::{Observer, ReaderSource};
use crate::agent::observer::{Binaries, DataPlaneReader, NftablesVia, Plane, Processes, plane_of_mode, plane_without_kube_proxy, reader};
use crate::agent::server::{health_router, router};
use crate::agent::upstream::{DEFAULT_KUBE_PROXY_URL, KubeProxy};
use crate::agent_contract::tls::{AgentTls, AgentTlsFiles};
use crate::cli::{Error, whole_in};
use crate::shutdown::Shutdown;
use crate::webhook::server::{self, Connections};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Arguments of `agent`. Every flag can also be set by its environment variable.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// Mutual-TLS address serving /metrics, /proxyMode and /configz to the operator.
    #[arg(long, default_value = "0.0.0.0:10349", env = "SAFE_TERMINATION_AGENT_LISTEN")]
    pub listen: SocketAddr,
    /// Plain-HTTP address of /healthz (no data), for the kubelet's probes.
    #[arg(long, default_value = "0.0.0.0:10350", env = "SAFE_TERMINATION_AGENT_HEALTH_LISTEN")]
    pub health_listen: SocketAddr,
    /// kube-proxy's metrics server on this node (scheme, host and port).
    #[arg(long, default_value = DEFAULT_KUBE_PROXY_URL, env = "SAFE_TERMINATION_KUBE_PROXY_URL")]
    pub kube_proxy_url: String,
    /// CA bundle that signs the operator's client certificate, PEM.
    #[arg(long, value_name = "FILE", default_value = "/etc/safe-termination/agent/ca.crt", env = "SAFE_TERMINATION_AGENT_CA_FILE")]
    pub tls_ca_file: PathBuf,
    /// The agent's serving certificate chain (for the name safe-termination-agent), PEM.
    #[arg(long, value_name = "FILE", default_value = "/etc/safe-termination/agent/tls.crt", env = "SAFE_TERMINATION_AGENT_TLS_CERT_FILE")]
    pub tls_cert_file: PathBuf,
    /// Its private key, PEM.
    #[arg(long, value_name = "FILE", default_value = "/etc/safe-termination/agent/tls.key", env = "SAFE_TERMINATION_AGENT_TLS_KEY_FILE")]
    pub tls_key_file: PathBuf,
    /// The TLS files are re-read on use at most this often, seconds, 1 to 3600.
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = whole_in(1u64, 3600, "a whole number of seconds"), env = "SAFE_TERMINATION_CERT_RELOAD_INTERVAL_SECONDS")]
    pub cert_reload_interval_seconds: u64,
    /// Timeout of one kube-proxy read, seconds, 1 to 300 (below the operator's scrape timeout,
    /// 5 s by default, so that the operator gets the agent's 504 rather than its own timeout).
    #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = whole_in(1u64, 300, "a whole number of seconds"), env = "SAFE_TERMINATION_KUBE_PROXY_TIMEOUT_SECONDS")]
    pub kube_proxy_timeout_seconds: u64,
    /// Largest kube-proxy /metrics body read, bytes, 1024 to 268435456.
    #[arg(long, default_value_t = crate::sources::DEFAULT_MAX_BODY_BYTES, allow_negative_numbers = true, value_parser = whole_in(1024usize, 256 << 20, "a whole number of bytes"), env = "SAFE_TERMINATION_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,
    /// On shutdown, how long in-flight requests may take to finish, seconds, 0 to 3600.
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = whole_in(0u64, 3600, "a whole number of seconds"), env = "SAFE_TERMINATION_DRAIN_SECONDS")]
    pub drain_seconds: u64,
    /// The data plane the observer reads while removals are pending: `auto` (kube-proxy's
    /// `/proxyMode`, and for iptables the backend holding its chains; where nothing listens on
    /// kube-proxy's address, Cilium when its services map is pinned under --cilium-bpf-root),
    /// one named, or `none`.
    #[arg(long, value_enum, default_value_t = DataPlaneArg::Auto, env = "SAFE_TERMINATION_DATA_PLANE")]
    pub data_plane: DataPlaneArg,
    /// How kube-proxy's nftables rules are read: `netlink` (the kernel's dump of the Service
    /// port's chain alone, about 0.1 ms a read) or `nft` (`nft list chain`, which loads the whole
    /// table first: 0.5 s a read at 4,000 Services).
    #[arg(long, value_enum, default_value_t = NftablesVia::Netlink, env = "SAFE_TERMINATION_NFTABLES_READER")]
    pub nftables_reader: NftablesVia,
    /// The `nft` program of `--nftables-reader nft`.
    #[arg(long, default_value = "nft", env = "SAFE_TERMINATION_NFT_BINARY")]
    pub nft_binary: String,
    /// The `iptables` program of the nft backend.
    #[arg(long, default_value = "iptables-nft", env = "SAFE_TERMINATION_IPTABLES_NFT_BINARY")]
    pub iptables_nft_binary: String,
    /// The `iptables` program of the legacy backend.
    #[arg(long, default_value = "iptables-legacy", env = "SAFE_TERMINATION_IPTABLES_LEGACY_BINARY")]
    pub iptables_legacy_binary: String,
    /// Where the host's bpffs is mounted in the agent: Cilium pins its load-balancer maps under
    /// `<root>/tc/globals` (`--data-plane cilium`, and `auto` without kube-proxy).
    #[arg(long, value_name = "DIR", default_value = crate::agent::observer::cilium::DEFAULT_BPF_ROOT, env = "SAFE_TERMINATION_CILIUM_BPF_ROOT")]
    pub cilium_bpf_root: PathBuf,
    /// How long a connection may wait before its first request or stay idle, seconds.
    #[arg(long, default_value_t = 30, allow_negative_numbers = true, value_parser = whole_in(1u64, 3600, "a whole number of seconds"), env = "SAFE_TERMINATION_IDLE_TIMEOUT_SECONDS")]
    pub idle_timeout_seconds: u64,
    /// This node's name, the `node` label of the observer's metrics (the chart sets it from the
    /// pod's `spec.nodeName`); unlabelled when absent.
    #[arg(long, env = "SAFE_TERMINATION_NODE_NAME")]
    pub node_name: Option<String>,
}

/// `--data-plane`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DataPlaneArg {
    /// From kube-proxy's `/proxyMode` (and the iptables backend holding its chains).
    Auto,
    /// kube-proxy's nftables mode.
    Nftables,
    /// kube-proxy's iptables mode, nft backend.
    IptablesNft,
    /// kube-proxy's iptables mode, legacy backend.
    IptablesLegacy,
    /// Cilium's kube-proxy replacement: its pinned BPF load-balancer maps.
    Cilium,
    /// No reader: watches are answered held until they expire.
    None,
}

impl AgentArgs {
    /// The programs the readers run.
    pub fn binaries(&self) -> Binaries {
        Binaries { nft: self.nft_binary.clone(), iptables_nft: self.iptables_nft_binary.clone(), iptables_legacy: self.iptables_legacy_binary.clone() }
    }
    /// The TLS files.
    pub fn tls_files(&self) -> AgentTlsFiles {
        AgentTlsFiles { ca: self.tls_ca_file.clone(), cert: self.tls_cert_file.clone(), key: self.tls_key_file.clone() }
    }
}

/// Runs the agent until a shutdown signal. Call inside a Tokio runtime (a current-thread one
/// is enough).
pub async fn run(args: &AgentArgs) -> Result<(), Error> {
    let shutdown = Shutdown::new();
    shutdown.listen_for_signals().map_err(|e| Error::Io(format!("cannot install signal handlers: {e}")))?;
    let listener = std::net::TcpListener::bind(args.listen).map_err(|e| Error::Io(format!("cannot listen on {}: {e}", args.listen)))?;
    let health = tokio::net::TcpListener::bind(args.health_listen).await.map_err(|e| Error::Io(format!("cannot listen on {}: {e}", args.health_listen)))?;
    serve(args, listener, health, shutdown).await
}

/// Serves the agent on already-bound listeners until `shutdown` fires: `Ok` after a graceful
/// drain, [`Error::Aborted`] after a second trigger.
///
/// Errors: `--kube-proxy-url` is not an http(s) URL (usage), the TLS configuration cannot be
/// built or a server fails (I/O).
pub async fn serve(args: &AgentArgs, listener: std::net::TcpListener, health: tokio::net::TcpListener, shutdown: Shutdown) -> Result<(), Error> {
    let url = reqwest::Url::parse(&args.kube_proxy_url).map_err(|e| Error::Usage(format!("--kube-proxy-url {:?}: {e}", args.kube_proxy_url)))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Error::Usage(format!("--kube-proxy-url {:?}: expected http://host:port", args.kube_proxy_url)));
    }
    let tls = AgentTls::new(args.tls_files(), Duration::from_secs(args.cert_reload_interval_seconds));
    let config = tls.server_config().map_err(|e| Error::Io(format!("TLS configuration: {e}")))?;
    let kube_proxy = std::sync::Arc::new(KubeProxy::new(&args.kube_proxy_url, Duration::from_secs(args.kube_proxy_timeout_seconds), args.max_body_bytes));
    let addr = |a: std::io::Result<SocketAddr>| a.map_or_else(|e| format!("unknown ({e})"), |a| a.to_string());
    let (listen, health_listen) = (addr(listener.local_addr()), addr(health.local_addr()));

    let stop_health = CancellationToken::new();
    let idle = Duration::from_secs(args.idle_timeout_seconds);
    let observer = Observer::new(reader_source(args, kube_proxy.clone()));
    let health_router = health_router(tls.clone(), shutdown.token(), observer.clone(), args.node_name.clone());
    let health_task = tokio::spawn(crate::telemetry::serve_admin(health, health_router, stop_health.clone(), idle));
    tracing::info!(listen = %listen, health = %health_listen, kube_proxy = %args.kube_proxy_url, cert = %args.tls_cert_file.display(), "node agent serving");
    let observing = tokio::spawn(observer.clone().run(shutdown.token()));
    let serve = server::serve(
        listener,
        router(kube_proxy, observer),
        config,
        shutdown.token(),
        Duration::from_secs(args.drain_seconds),
        Connections { idle_timeout: idle, ..Default::default() },
    );
    let abort = shutdown.abort_token();
    let result = tokio::select! {
        r = serve => r.map_err(|e| Error::Io(format!("agent server: {e}"))),
        () = abort.cancelled() => Err(Error::Aborted),
    };
    stop_health.cancel();
    observing.abort();
    if !matches!(result, Err(Error::Aborted)) {
        if let Ok(Err(e)) = health_task.await {
            tracing::warn!(error = %e, "health server");
        }
        tracing::info!("node agent stopped");
    }
    result
}

/// How the observer finds its reader: the one `--data-plane` names, or (auto) the one of
/// kube-proxy's `/proxyMode`, asked when the first watch is due (from the observer's blocking
/// thread); where nothing listens on kube-proxy's address, Cilium's when its services map is
/// pinned.
fn reader_source(args: &AgentArgs, kube_proxy: std::sync::Arc<KubeProxy>) -> ReaderSource {
    let (plane, binaries, nftables_via, bpf_root) = (args.data_plane, args.binaries(), args.nftables_reader, args.cilium_bpf_root.clone());
    Box::new(move || -> Result<Box<dyn DataPlaneReader>, String> {
        let named = match plane {
            DataPlaneArg::None => return Err("--data-plane none: no reader".into()),
            DataPlaneArg::Nftables => Some(Plane::Nftables),
            DataPlaneArg::IptablesNft => Some(Plane::IptablesNft),
            DataPlaneArg::IptablesLegacy => Some(Plane::IptablesLegacy),
            DataPlaneArg::Cilium => Some(Plane::Cilium),
            DataPlaneArg::Auto => None,
        };
        let plane = match named {
            Some(p) => p,
            None => {
                let k = kube_proxy.clone();
                match tokio::runtime::Handle::current().block_on(async move { k.proxy_mode().await }) {
                    Ok(mode) => plane_of_mode(&String::from_utf8_lossy(&mode.body), &binaries, &Processes).map_err(|e| e.to_string())?,
                    Err(e) if e.reason == crate::core::measure::reason::CONNECTION_REFUSED => {
                        plane_without_kube_proxy(&e.message, &bpf_root).map_err(|e| e.to_string())?
                    }
                    Err(e) => return Err(e.message),
                }
            }
        };
        Ok(reader(plane, &binaries, nftables_via, &bpf_root))
    })
}
