//! The operator binary (`safe-termination run`) as a child process against the e2e cluster:
//! the one runner of the cluster tests. It measures the real kube-proxies
//! (`$ST_KP_METRICS_URLS`, named by `$ST_KP_NODES`) or discovers kube-proxy pods, serves its
//! webhook and admin ports on free 127.0.0.1 ports, logs to `$ST_E2E_DIR/logs/`, and is killed
//! on drop.

use super::{free_port, state_dir, tools::kubeconfig};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The rolling analysis window (`--window-seconds`) of the operators the e2e tests start.
pub const OPERATOR_WINDOW_SECONDS: u64 = 300;

/// A running operator, killed on drop.
pub struct Operator {
    child: std::process::Child,
    /// Admin port (/readyz, /metrics).
    pub admin: u16,
    /// Webhook port (HTTPS).
    pub webhook: u16,
    /// Its serving certificate and key files (`--tls-cert-file`, `--tls-key-file`).
    pub tls: (PathBuf, PathBuf),
    log: PathBuf,
    /// Where an operator with its own identity keeps its kubeconfig and certificate files.
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How to start one: every field but `extra` has the tests' usual value in [`Launch::new`].
struct Launch<'a> {
    namespace: &'a str,
    identity: String,
    /// `--kube-proxy-target`; `None`: discovery through the API.
    targets: Option<String>,
    window_seconds: u64,
    kubeconfig: PathBuf,
    tls: (PathBuf, PathBuf),
    log: PathBuf,
    dir: Option<tempfile::TempDir>,
    extra: Vec<String>,
    /// The address its webhook listens on (127.0.0.1; the host end of a real node's veth for
    /// pods to reach it).
    listen_ip: String,
    /// Its webhook port (None: a free one).
    port: Option<u16>,
}

impl<'a> Launch<'a> {
    /// The cluster admin's kubeconfig, the cluster's webhook certificate (`pki/webhook.*`), the
    /// real kube-proxies as targets, the default window.
    fn new(namespace: &'a str, extra: &[&str]) -> Self {
        let dir = state_dir();
        Launch {
            namespace,
            identity: format!("e2e-{namespace}"),
            targets: Some(real_kube_proxy_targets()),
            window_seconds: OPERATOR_WINDOW_SECONDS,
            kubeconfig: PathBuf::from(format!("{dir}/kubeconfig")),
            tls: (PathBuf::from(format!("{dir}/pki/webhook.crt")), PathBuf::from(format!("{dir}/pki/webhook.key"))),
            log: PathBuf::from(format!("{dir}/logs/operator-{namespace}.log")),
            dir: None,
            extra: extra.iter().map(ToString::to_string).collect(),
            listen_ip: "127.0.0.1".into(),
            port: None,
        }
    }

    /// Uninstalls any release of the chart ([`super::remove_chart_releases`]: this operator is
    /// then the only one writing TerminationPolicy statuses), spawns, waits for `/readyz`.
    async fn start_alone(self) -> Operator {
        super::remove_chart_releases(&super::client().await).await;
        let op = self.spawn();
        op.wait_ready().await;
        op
    }

    fn spawn(self) -> Operator {
        let (admin, webhook) = (free_port(), self.port.unwrap_or_else(free_port));
        let mut args: Vec<String> = self.targets.map(|t| vec!["--kube-proxy-target".to_string(), t]).unwrap_or_default();
        // the tests register the webhook for their own namespace; the policy backend (`auto`'s
        // choice on 1.37) would write one cluster-wide policy: only where a test asks for it
        if !self.extra.iter().any(|a| a == "--admission-backend") {
            args.extend(["--admission-backend".to_string(), "webhook".to_string()]);
        }
        // the preStop waiter endpoint's own socket: on loopback unless a test puts it where
        // pods reach it (tests/common/wait_endpoint.rs)
        if !self.extra.iter().any(|a| a == "--wait-listen") {
            args.extend(["--wait-listen".to_string(), format!("127.0.0.1:{}", free_port())]);
        }
        let _ = std::fs::create_dir_all(self.log.parent().unwrap());
        let log = std::fs::File::create(&self.log).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_safe-termination"))
            .args(["run", "--listen", &format!("{}:{webhook}", self.listen_ip), "--admin-listen", &format!("127.0.0.1:{admin}")])
            .arg("--tls-cert-file")
            .arg(&self.tls.0)
            .arg("--tls-key-file")
            .arg(&self.tls.1)
            .args(["--namespace", self.namespace, "--identity", &self.identity])
            .args(&args)
            .args(["--scrape-interval-seconds", "2", "--window-seconds", &self.window_seconds.to_string(), "--status-refresh-seconds", "5"])
            .args(&self.extra)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info,safe_termination=debug")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the operator");
        Operator { child, admin, webhook, tls: self.tls, log: self.log, _dir: self.dir }
    }
}

/// `node=url` of each real kube-proxy: `$ST_KP_NODES` zipped with `$ST_KP_METRICS_URLS`
/// (defaults: the harness's node-a and node-b).
fn real_kube_proxy_targets() -> String {
    let nodes = std::env::var("ST_KP_NODES").unwrap_or_else(|_| "node-a node-b".into());
    let urls = std::env::var("ST_KP_METRICS_URLS").unwrap_or_else(|_| "http://10.213.0.2:10249/metrics http://10.213.1.2:10249/metrics".into());
    let targets: Vec<String> =
        urls.split_whitespace().zip(nodes.split_whitespace()).map(|(url, node)| format!("{node}={}", url.trim_end_matches("/metrics"))).collect();
    targets.join(",")
}

/// A kubeconfig in `dir` that acts as `system:serviceaccount:NS:NAME` (the admin may
/// impersonate).
fn impersonating_kubeconfig(dir: &Path, namespace: &str, sa: &str) -> PathBuf {
    let mut kc: Value = serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig()).unwrap()).unwrap();
    for u in kc["users"].as_array_mut().unwrap() {
        u["user"]["as"] = json!(format!("system:serviceaccount:{namespace}:{sa}"));
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_json::to_string(&kc).unwrap()).unwrap();
    path
}

impl Operator {
    /// The operator process's PID (for its /proc figures).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts it in `namespace` with fast scrapes and `extra` flags; waits for `/readyz`. Any
    /// release of the chart is uninstalled first ([`super::remove_chart_releases`]): this
    /// operator is then the only one writing TerminationPolicy statuses.
    pub async fn start(namespace: &str, extra: &[&str]) -> Operator {
        Self::start_windowed(namespace, OPERATOR_WINDOW_SECONDS, extra).await
    }

    /// [`Operator::start`] with a rolling analysis window of `window_seconds`.
    pub async fn start_windowed(namespace: &str, window_seconds: u64, extra: &[&str]) -> Operator {
        Launch { window_seconds, ..Launch::new(namespace, extra) }.start_alone().await
    }

    /// Like [`Operator::start_windowed`], its webhook on `listen_ip` (an address of the test
    /// cluster's own veths, reachable from pods on the real nodes) and `port`, with the serving
    /// certificate `tls` (cert, key).
    pub async fn start_listening(namespace: &str, listen_ip: &str, port: u16, tls: (PathBuf, PathBuf), window_seconds: u64, extra: &[&str]) -> Operator {
        let mut l = Launch { listen_ip: listen_ip.to_string(), tls, window_seconds, ..Launch::new(namespace, extra) };
        l.port = Some(port);
        l.start_alone().await
    }

    /// Like [`Operator::start`] but finding kube-proxy pods through the API (the default
    /// discovery) instead of the fixed targets: the e2e cluster's kube-proxies are processes,
    /// not pods, so it finds none.
    pub async fn start_discovering(namespace: &str, extra: &[&str]) -> Operator {
        Launch { targets: None, ..Launch::new(namespace, extra) }.start_alone().await
    }

    /// Starts it as the ServiceAccount `sa` of `namespace` (kubeconfig impersonation: what a
    /// chart's RBAC allows is all it may do), with identity `identity`, its own certificate
    /// files in a temporary directory (for `--write-cert-files`) and `extra` flags; logs to
    /// `operator-<log_name>.log`. Does not wait: the caller sets up what readiness needs, then
    /// calls [`Operator::wait_ready`].
    pub fn spawn_as_service_account(namespace: &str, sa: &str, identity: &str, log_name: &str, extra: &[&str]) -> Operator {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = impersonating_kubeconfig(dir.path(), namespace, sa);
        let tls = (dir.path().join("tls/tls.crt"), dir.path().join("tls/tls.key"));
        let log = PathBuf::from(format!("{}/logs/operator-{log_name}.log", state_dir()));
        Launch { identity: identity.to_string(), kubeconfig, tls, log, dir: Some(dir), ..Launch::new(namespace, extra) }.spawn()
    }

    /// Waits up to 90 s for `/readyz` to answer 2xx; fails with the operator's log.
    pub async fn wait_ready(&self) {
        let url = format!("http://127.0.0.1:{}/readyz", self.admin);
        let http = reqwest::Client::new();
        super::wait_for(&format!("the operator ready at {url} (log {})", self.log.display()), 90, async || {
            http.get(&url).send().await.ok().filter(|r| r.status().is_success()).map(|_| ())
        })
        .await;
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its /metrics text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://127.0.0.1:{}/metrics", self.admin)).await.unwrap().text().await.unwrap()
    }

    /// Admission requests answered so far (all decisions).
    pub async fn requests(&self) -> u64 {
        super::metric_sum(&self.metrics().await, "safe_termination_webhook_requests_total", &[]).unwrap_or(0.0) as u64
    }
}
