//! The node agent on loopback, no cluster: a fake kube-proxy (axum on 127.0.0.1:0 serving the
//! real v1.13 scrape of tests/data/metrics, `/proxyMode` and a `/configz`), the real agent
//! (`cli::agent::serve`) with real mutual TLS from certificates made by the operator's own
//! certificate code (`certs`), and the operator's agent client (`sources::agent_client`) and
//! `--source auto` scrape loop.

mod support;
use safe_termination::agent::observer::NftablesVia;
use safe_termination::certs::{self, AGENT_CERT, AGENT_KEY, Action, CA_CERT, CLIENT_CERT, CLIENT_KEY, TLS_CERT, TLS_KEY};
use safe_termination::cli::agent::{AgentArgs, DataPlaneArg, serve};
use safe_termination::core::exposition::{parse_kube_proxy_metrics, read_families};
use safe_termination::core::measure::{MeasurementStore, NodeSource, reason};
use safe_termination::core::model::ProxyMode;
use safe_termination::core::proxyconfig::parse_configz;
use safe_termination::shutdown::Shutdown;
use safe_termination::sources::agent_client::{AgentClientFiles, AgentSource, AgentTargets, scrape_agent};
use safe_termination::sources::auto::NO_AGENT_FIX;
use safe_termination::sources::proxy_config::fetch_configz;
use safe_termination::sources::scrape::ScrapeOptions;
use safe_termination::sources::scrape_loop::{Fallbacks, ScrapeLoop};
use safe_termination::sources::targets::{Target, TargetSource};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::fake_kube_proxy::FakeKubeProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const V1_13: &str = include_str!("data/metrics/kube-proxy-v1.13-legacy-microseconds.txt");
const CONFIGZ: &str = r#"{"kubeproxy.config.k8s.io":{"ClientConnection":{"Kubeconfig":"/var/lib/kube-proxy/kubeconfig.conf"},"HostnameOverride":"node-a","MetricsBindAddress":"127.0.0.1:10249","Mode":"iptables","IPTables":{"MasqueradeBit":14},"SyncPeriod":"30s","MinSyncPeriod":"2s"}}"#;

/// A CA with every leaf the operator makes (webhook, agent, operator client), as the leader's
/// certificate Secret holds them.
fn secret() -> BTreeMap<String, Vec<u8>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let names = certs::subject_alt_names("safe-termination", "ops", &[]);
    certs::renewed(&BTreeMap::new(), &Action::RenewCa("test".into()), &names, certs::unix_now(), certs::CA_VALIDITY, certs::SERVING_VALIDITY).unwrap()
}

fn write(dir: &Path, name: &str, content: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

/// A fake kube-proxy on 127.0.0.1 serving the real v1.13 scrape, `iptables` and [`CONFIGZ`].
async fn kube_proxy() -> SocketAddr {
    FakeKubeProxy::text(V1_13).with_configz(CONFIGZ).start().await
}

/// A running agent: its addresses, and the shutdown that stops it.
struct Agent {
    addr: SocketAddr,
    health: SocketAddr,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<Result<(), safe_termination::cli::Error>>,
}

impl Agent {
    /// The real agent on 127.0.0.1:0 in front of `kube_proxy`, serving `cert`/`key` and trusting
    /// client certificates of `ca`.
    async fn start(dir: &Path, kube_proxy: &str, ca: &[u8], cert: &[u8], key: &[u8]) -> Self {
        Self::start_with(dir, kube_proxy, ca, cert, key, |_| {}).await
    }

    /// [`Agent::start`] with its flags changed by `change` first.
    async fn start_with(dir: &Path, kube_proxy: &str, ca: &[u8], cert: &[u8], key: &[u8], change: impl FnOnce(&mut AgentArgs)) -> Self {
        let mut args = AgentArgs {
            listen: "127.0.0.1:0".parse().unwrap(),
            health_listen: "127.0.0.1:0".parse().unwrap(),
            kube_proxy_url: kube_proxy.to_string(),
            tls_ca_file: write(dir, "agent-ca.crt", ca),
            tls_cert_file: write(dir, "agent.crt", cert),
            tls_key_file: write(dir, "agent.key", key),
            cert_reload_interval_seconds: 5,
            kube_proxy_timeout_seconds: 2,
            max_body_bytes: 1 << 20,
            drain_seconds: 1,
            idle_timeout_seconds: 5,
            data_plane: DataPlaneArg::Nftables,
            // the nft program's reader, run on a fake nft here (the netlink reader is tested
            // against a scripted kernel in its unit tests, and on the real nodes by e2e_window)
            nftables_reader: NftablesVia::Nft,
            nft_binary: write_fake_nft(dir).display().to_string(),
            iptables_nft_binary: "iptables-nft".into(),
            iptables_legacy_binary: "iptables-legacy".into(),
            cilium_bpf_root: "/sys/fs/bpf".into(),
            node_name: Some("node-a".into()),
        };
        change(&mut args);
        let listener = std::net::TcpListener::bind(args.listen).unwrap();
        listener.set_nonblocking(true).unwrap();
        let health = tokio::net::TcpListener::bind(args.health_listen).await.unwrap();
        let (addr, health_addr) = (listener.local_addr().unwrap(), health.local_addr().unwrap());
        let shutdown = Shutdown::new();
        let s = shutdown.clone();
        let task = tokio::spawn(async move { serve(&args, listener, health, s).await });
        Self { addr, health: health_addr, shutdown, task }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    async fn stop(self) {
        self.shutdown.trigger();
        self.task.await.unwrap().unwrap();
    }
}

/// Service port `e2e-window/web:http` (10.96.7.7:80/TCP), the one of the captured listings.
fn web_port() -> safe_termination::core::removals::ServicePort {
    safe_termination::core::removals::ServicePort {
        namespace: "e2e-window".into(),
        name: "web".into(),
        port_name: "http".into(),
        protocol: "TCP".into(),
        cluster_ip: "10.96.7.7".parse().unwrap(),
        port: 80,
    }
}

/// A fake `nft` in `dir` that prints `dir/nft-listing` (what the test writes there: the real
/// 1.37.2 listing of tests/data/rules, then the same chain without one endpoint) and fails while
/// that file is missing, as `nft` fails on a chain that is not there.
fn write_fake_nft(dir: &Path) -> PathBuf {
    let listing = dir.join("nft-listing");
    let script = format!("#!/bin/sh\nexec cat '{}'\n", listing.display());
    let p = write(dir, "nft", script.as_bytes());
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p
}

/// The real agent in front of a fake kube-proxy (files in `dir`), the operator's mutual-TLS
/// client for it, and its target `node-a`.
async fn agent_and_client(dir: &Path) -> (Agent, reqwest::Client, Target) {
    let data = secret();
    let kp = kube_proxy().await;
    let agent = Agent::start(dir, &format!("http://{kp}"), &data[CA_CERT], &data[AGENT_CERT], &data[AGENT_KEY]).await;
    let source = AgentSource::new(AgentTargets::Static(vec![]), client_files(dir, &data), Duration::from_secs(3));
    let client = source.client().unwrap();
    let target = Target::new("node-a", &agent.url());
    (agent, client, target)
}

/// The operator's client files in `dir`.
fn client_files(dir: &Path, data: &BTreeMap<String, Vec<u8>>) -> AgentClientFiles {
    AgentClientFiles {
        ca: write(dir, "ca.crt", &data[CA_CERT]),
        cert: write(dir, "client.crt", &data[CLIENT_CERT]),
        key: write(dir, "client.key", &data[CLIENT_KEY]),
    }
}

fn opts() -> ScrapeOptions {
    ScrapeOptions { timeout: Duration::from_secs(3), ..Default::default() }
}

#[tokio::test]
async fn the_operator_reads_the_filtered_scrape_mode_and_configuration_through_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, client, target) = agent_and_client(dir.path()).await;

    // the scrape parses to what the full scrape gives, with the mode
    let o = scrape_agent(&client, &target, &opts()).await;
    assert_eq!(o.source, NodeSource::Agent);
    let sample = o.result.unwrap();
    assert_eq!(sample.scrape, parse_kube_proxy_metrics(V1_13).unwrap());
    assert_eq!(sample.proxy_mode, Some(ProxyMode::Iptables));

    // the proxy mode comes with /metrics, so the operator makes one request per node and cycle
    let resp = client.get(format!("{}/metrics", agent.url())).send().await.unwrap();
    assert_eq!(resp.headers().get(safe_termination::agent_contract::protocol::PROXY_MODE_HEADER).map(|v| v.to_str().unwrap()), Some("iptables"));

    // only the families the operator reads leave the node
    let body = resp.text().await.unwrap();
    let allowed: Vec<&str> = read_families().collect();
    for line in body.lines() {
        let name: String =
            line.trim_start_matches("# HELP ").trim_start_matches("# TYPE ").chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        assert!(allowed.iter().any(|f| name.starts_with(f)), "{line:?}");
    }
    assert!(!body.contains("go_goroutines") && !body.contains("process_") && !body.contains("rest_client"), "{body}");

    // /configz, reduced: read as the whole one, without the kubeconfig path or host name
    let config = fetch_configz(&client, &target, Duration::from_secs(3)).await.unwrap();
    assert_eq!(config, parse_configz(CONFIGZ).unwrap());
    let configz = client.get(format!("{}/configz", agent.url())).send().await.unwrap().text().await.unwrap();
    assert!(!configz.contains("kubeconfig") && !configz.contains("node-a"), "{configz}");

    // nothing else is served; the health port answers without TLS and without data
    let other = client.get(format!("{}/debug/pprof", agent.url())).send().await.unwrap();
    assert_eq!(other.status(), 404);
    let health = reqwest::get(format!("http://{}/healthz", agent.health)).await.unwrap();
    assert_eq!((health.status().as_u16(), health.text().await.unwrap()), (200, "ok\n".to_string()));
    agent.stop().await;
}

/// Sends a GET over a TLS connection made with `config` (to the name safe-termination-agent)
/// and returns what came back: the HTTP answer, or the error that ended the connection.
async fn raw_get(addr: SocketAddr, config: rustls::ClientConfig) -> Result<String, String> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("safe-termination-agent").unwrap();
    let mut tls = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
    // TLS 1.3: the server checks the client's certificate after the client's handshake ends,
    // so a refusal shows on the first read
    tls.write_all(b"GET /metrics HTTP/1.1\r\nhost: agent\r\nconnection: close\r\n\r\n").await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out).await {
        Ok(_) if out.is_empty() => Err("closed without an answer".into()),
        Ok(_) => Ok(String::from_utf8_lossy(&out).into_owned()),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test]
async fn clients_without_the_operators_certificate_are_refused_during_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let data = secret();
    let other = secret();
    let kp = kube_proxy().await;
    let agent = Agent::start(dir.path(), &format!("http://{kp}"), &data[CA_CERT], &data[AGENT_CERT], &data[AGENT_KEY]).await;

    // the operator's own certificate: an HTTP answer
    let ok = raw_get(agent.addr, support::tls::client_config(&data[CA_CERT], Some((&data[CLIENT_CERT], &data[CLIENT_KEY])), &[])).await.unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");

    // a same-CA leaf for another name, made for client authentication
    let names = ["someone-else".to_string()];
    let ca_not_after = certs::bundle_info(&data[CA_CERT]).unwrap()[0].not_after;
    let (cert, key) = certs::generate_leaf(
        std::str::from_utf8(&data[CA_CERT]).unwrap(),
        std::str::from_utf8(&data[certs::CA_KEY]).unwrap(),
        &names,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        certs::unix_now(),
        Duration::from_secs(3600),
        ca_not_after,
    )
    .unwrap();
    for (what, identity) in [
        ("no client certificate", None),
        ("the client certificate of another CA", Some((&other[CLIENT_CERT][..], &other[CLIENT_KEY][..]))),
        ("the webhook's serving certificate (server authentication only)", Some((&data[TLS_CERT][..], &data[TLS_KEY][..]))),
        ("a client certificate of the CA for another name", Some((cert.as_bytes(), key.as_bytes()))),
    ] {
        let refused = raw_get(agent.addr, support::tls::client_config(&data[CA_CERT], identity, &[])).await;
        let e = refused.expect_err(what);
        assert!(!e.contains("HTTP/1.1"), "{what}: {e}");
        assert!(e.to_ascii_lowercase().contains("alert") || e.contains("closed") || e.contains("reset"), "{what}: {e}");
    }
    agent.stop().await;
}

#[tokio::test]
async fn an_agent_with_a_certificate_for_another_name_is_refused_by_the_operator() {
    let dir = tempfile::tempdir().unwrap();
    let data = secret();
    let kp = kube_proxy().await;
    // the same CA, but the webhook's serving certificate (safe-termination.ops.svc, ...)
    let agent = Agent::start(dir.path(), &format!("http://{kp}"), &data[CA_CERT], &data[TLS_CERT], &data[TLS_KEY]).await;
    let source = AgentSource::new(AgentTargets::Static(vec![]), client_files(dir.path(), &data), Duration::from_secs(3));
    let o = scrape_agent(&source.client().unwrap(), &Target::new("node-a", &agent.url()), &opts()).await;
    let f = o.result.unwrap_err();
    assert_eq!(f.reason, reason::OTHER);
    assert!(f.message.contains("mutual TLS failed") && f.message.contains("safe-termination-agent"), "{}", f.message);
    assert!(f.message.to_ascii_lowercase().contains("certificate"), "{}", f.message);
    agent.stop().await;
}

#[tokio::test]
async fn auto_measures_through_the_agent_and_reports_a_stopped_agent() {
    let dir = tempfile::tempdir().unwrap();
    let data = secret();
    let kp = kube_proxy().await;
    let agent = Agent::start(dir.path(), &format!("http://{kp}"), &data[CA_CERT], &data[AGENT_CERT], &data[AGENT_KEY]).await;
    let refused = support::closed_port();
    // node-a: kube-proxy on loopback only (refused directly), an agent; node-b: reachable
    // directly; node-c: refused, no agent
    let targets = vec![
        Target::new("node-a", &format!("http://127.0.0.1:{refused}")),
        Target::new("node-b", &format!("http://{kp}")),
        Target::new("node-c", &format!("http://127.0.0.1:{refused}")),
    ];
    let agents = AgentSource::new(AgentTargets::Static(vec![Target::new("node-a", &agent.url())]), client_files(dir.path(), &data), Duration::from_secs(3));
    let store = Arc::new(Mutex::new(MeasurementStore::new(600.0)));
    let (tx, _rx) = tokio::sync::watch::channel(0u64);
    let mut scrape = ScrapeLoop::new(TargetSource::Static(targets), store.clone(), tx)
        .with_options(opts())
        .with_config_refresh(1)
        .with_fallbacks(Fallbacks { agents: Some(agents), prometheus: None });
    let proxy_config = scrape.proxy_config();

    let summary = scrape.run_cycle().await;
    assert_eq!((summary.scraped, summary.failed), (2, 1));
    {
        let s = store.lock().unwrap();
        let sources: Vec<(String, NodeSource)> = s.node_sources().map(|(n, s)| (n.to_string(), s)).collect();
        assert_eq!(sources, [("node-a".to_string(), NodeSource::Agent), ("node-b".to_string(), NodeSource::KubeProxy)]);
        let c = &s.failures()["node-c"];
        assert_eq!(c.reason, reason::CONNECTION_REFUSED);
        assert!(c.message.starts_with("kube-proxy: error sending request for url (http://127.0.0.1:"), "{}", c.message);
        // (a random port: no metricsBindAddress hint, which is for kube-proxy's port 10249 only)
        assert!(c.message.contains("Connection refused") && c.message.contains("agent: no --agent-target for this node"), "{}", c.message);
        assert!(c.message.ends_with(NO_AGENT_FIX), "{}", c.message);
    }
    // node-b answered directly: its /configz is read directly
    assert_eq!(proxy_config.read().unwrap().source, "configz node-b");

    // the agent stops: node-a is failed, with what was tried
    agent.stop().await;
    let summary = scrape.run_cycle().await;
    assert_eq!((summary.scraped, summary.failed), (1, 2));
    let s = store.lock().unwrap();
    let a = &s.failures()["node-a"];
    assert_eq!(a.reason, reason::CONNECTION_REFUSED);
    assert!(a.message.starts_with("kube-proxy: error sending request for url (http://127.0.0.1:"), "{}", a.message);
    assert!(a.message.contains("; agent: https://127.0.0.1:") && a.message.contains("is the safe-termination agent running on this node?"), "{}", a.message);
    assert!(!a.message.contains(NO_AGENT_FIX), "an agent is configured for node-a: {}", a.message);
}

#[tokio::test]
async fn kube_proxy_down_behind_a_running_agent_is_reported_with_kube_proxys_failure() {
    let dir = tempfile::tempdir().unwrap();
    let data = secret();
    let gone = support::closed_port();
    let agent = Agent::start(dir.path(), &format!("http://127.0.0.1:{gone}"), &data[CA_CERT], &data[AGENT_CERT], &data[AGENT_KEY]).await;
    let source = AgentSource::new(AgentTargets::Static(vec![]), client_files(dir.path(), &data), Duration::from_secs(3));
    let o = scrape_agent(&source.client().unwrap(), &Target::new("node-a", &agent.url()), &opts()).await;
    let f = o.result.unwrap_err();
    assert_eq!(f.reason, reason::CONNECTION_REFUSED, "the agent passes kube-proxy's reason on");
    assert!(f.message.contains("HTTP 502 Bad Gateway: kube-proxy at http://127.0.0.1:"), "{}", f.message);
    assert!(f.message.contains("is kube-proxy running"), "{}", f.message);
    agent.stop().await;
}

#[tokio::test]
async fn the_only_agent_of_a_refused_node_through_auto_without_a_client_certificate_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let refused = support::closed_port();
    let targets = vec![Target::new("node-a", &format!("http://127.0.0.1:{refused}"))];
    let missing = AgentClientFiles { ca: dir.path().join("none/ca.crt"), cert: dir.path().join("none/client.crt"), key: dir.path().join("none/client.key") };
    let agents = AgentSource::new(AgentTargets::Static(vec![Target::new("node-a", "https://127.0.0.1:1")]), missing, Duration::from_secs(1));
    let direct = safe_termination::sources::scrape::scrape_all(&safe_termination::sources::http_client(Duration::from_secs(1)), &targets, &opts()).await;
    let applied = Fallbacks { agents: Some(agents), prometheus: None }.apply(&targets, direct, &opts()).await;
    let f = applied.outcomes[0].result.as_ref().unwrap_err();
    assert!(f.message.contains("agent: an agent runs on this node, but the operator has no usable client certificate for it: cannot read"), "{}", f.message);
}

// ---------------------------------------------------------------------------------------------
// kube-proxy 1.37's protobuf exposition through the agent

use safe_termination::core::exposition::format::{ACCEPT_PROTOBUF_FIRST, ACCEPT_TEXT, PROTOBUF_CONTENT_TYPE};
use safe_termination::core::exposition::{filter_kube_proxy_metrics, filter_kube_proxy_protobuf};
use support::fake_kube_proxy::{A_PB, A_TXT, Answer, ipv4_only};

/// An agent in front of a fake kube-proxy answering `answer`, and the operator's client for it.
async fn agent_before(dir: &Path, answer: Answer) -> (Agent, FakeKubeProxy, reqwest::Client) {
    let data = secret();
    let (kp, seen) = support::fake_kube_proxy::kube_proxy(answer).await;
    let agent = Agent::start(dir, &format!("http://{kp}"), &data[CA_CERT], &data[AGENT_CERT], &data[AGENT_KEY]).await;
    let source = AgentSource::new(AgentTargets::Static(vec![]), client_files(dir, &data), Duration::from_secs(3));
    (agent, seen, source.client().unwrap())
}

#[tokio::test]
async fn the_agent_asks_kube_proxy_for_protobuf_and_passes_the_native_histogram_on() {
    let dir = tempfile::tempdir().unwrap();
    let pb = ipv4_only(A_PB);
    let (agent, seen, client) = agent_before(dir.path(), Answer::Negotiate { pb: pb.clone(), text: A_TXT.into() }).await;

    // the operator's scrape through the agent: one kube-proxy request, protobuf first
    let sample = scrape_agent(&client, &Target::new("node-a", &agent.url()), &opts()).await.result.unwrap();
    assert_eq!(seen.accepts(), [Some(ACCEPT_PROTOBUF_FIRST.to_string())]);
    let native = sample.scrape.sync_native.as_ref().expect("the native histogram came through the agent");
    assert_eq!((native.schema(), native.count()), (3, 2.0));
    assert_eq!(sample.proxy_mode, Some(ProxyMode::Iptables));

    // the agent serves the kept messages unchanged, as protobuf
    let resp = client.get(format!("{}/metrics", agent.url())).header("accept", ACCEPT_PROTOBUF_FIRST).send().await.unwrap();
    assert_eq!(resp.headers()["content-type"], PROTOBUF_CONTENT_TYPE);
    let body = resp.bytes().await.unwrap();
    assert_eq!(&body[..], &filter_kube_proxy_protobuf(&pb)[..]);
    assert!(body.len() * 5 < pb.len(), "{} of {} bytes", body.len(), pb.len());

    // a client whose Accept names no protobuf gets text, kube-proxy asked for text only
    let resp = client.get(format!("{}/metrics", agent.url())).send().await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    assert_eq!(resp.text().await.unwrap(), filter_kube_proxy_metrics(A_TXT));
    assert_eq!(seen.accepts().last().cloned().flatten().as_deref(), Some(ACCEPT_TEXT));
    agent.stop().await;
}

#[tokio::test]
async fn the_agent_serves_text_when_kube_proxy_answers_text_to_protobuf_first() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, seen, client) = agent_before(dir.path(), Answer::TextOnly(A_TXT.into())).await;
    let sample = scrape_agent(&client, &Target::new("node-a", &agent.url()), &opts()).await.result.unwrap();
    assert_eq!(seen.accepts(), [Some(ACCEPT_PROTOBUF_FIRST.to_string())]);
    assert_eq!(sample.scrape, parse_kube_proxy_metrics(A_TXT).unwrap());
    agent.stop().await;

    // a cut protobuf answer is the agent's 502 naming the message, passed on as a parse failure
    let pb = ipv4_only(A_PB);
    let (agent, _, client) = agent_before(dir.path(), Answer::Negotiate { pb: pb[..pb.len() / 2].to_vec(), text: String::new() }).await;
    let f = scrape_agent(&client, &Target::new("node-a", &agent.url()), &opts()).await.result.unwrap_err();
    assert_eq!(f.reason, reason::PARSE);
    assert!(f.message.contains("HTTP 502") && f.message.contains("protobuf message") && f.message.contains("cut off"), "{}", f.message);
    agent.stop().await;
}

#[tokio::test]
async fn both_ip_families_through_the_agent_are_summed_needs_native_add() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _, client) = agent_before(dir.path(), Answer::Negotiate { pb: A_PB.to_vec(), text: A_TXT.into() }).await;
    let sample = scrape_agent(&client, &Target::new("node-a", &agent.url()), &opts()).await.result.unwrap();
    assert_eq!(sample.scrape.sync_native.as_ref().map(|n| n.count()), Some(3.0));
    agent.stop().await;
}

/// The observer end to end on loopback: the operator's request over mutual TLS, the agent
/// reading its (fake) `nft` while the watch is open, and the record's read bounds around the
/// moment the listing lost the endpoint. The listings are real 1.37.2 ones
/// (tests/data/rules/nft-1.37.2-service-chain-4-endpoints.txt, and it less one map entry).
#[tokio::test]
async fn the_agent_observes_an_endpoint_leave_its_nodes_rules() {
    use safe_termination::agent_contract::observer::{AnswerMark, ObserveRequest, WatchRequest, WatchState};
    use safe_termination::sources::agent_client::observe_agent;
    let dir = tempfile::tempdir().unwrap();
    let (agent, client, target) = agent_and_client(dir.path()).await;
    let before = include_str!("data/rules/nft-1.37.2-service-chain-4-endpoints.txt");
    let after = before.replace(
        "mod 4 map { 0 : 10.244.1.4 . 8080, 1 : 10.244.1.5 . 8080, 2 : 10.244.2.4 . 8080, 3 : 10.244.2.5 . 8080 }",
        "mod 3 map { 0 : 10.244.1.4 . 8080, 1 : 10.244.2.4 . 8080, 2 : 10.244.2.5 . 8080 }",
    );
    assert_ne!(before, after);
    std::fs::write(dir.path().join("nft-listing"), before).unwrap();
    let service = web_port();
    let watch = |ip: &str| WatchRequest { service: service.clone(), endpoint: ip.parse().unwrap(), remaining_seconds: 30.0, deletion_age_seconds: Some(0.25) };
    let request = ObserveRequest { watches: vec![watch("10.244.1.5"), watch("10.244.2.4")], set_id: Some(11), same_set: false };
    let first = observe_agent(&client, &target, &request).await.unwrap();
    assert_eq!(first.response.records.len(), 2);
    assert!(first.response.records.iter().all(|r| r.state == WatchState::Held));
    assert!(first.sent_unix_seconds <= first.received_unix_seconds);
    // let the agent read the endpoint in the rules, then take it out
    let mut seen_with = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let o = observe_agent(&client, &target, &request).await.unwrap();
        if o.response.records[0].reads >= 2 {
            seen_with = Some(o);
            break;
        }
    }
    let seen_with = seen_with.expect("the agent read the rules while the watch was open");
    assert_eq!(seen_with.response.data_plane.as_deref(), Some("nftables"));
    let switched = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    std::fs::write(dir.path().join("nft-listing.tmp"), &after).unwrap();
    std::fs::rename(dir.path().join("nft-listing.tmp"), dir.path().join("nft-listing")).unwrap();
    let mut last = None;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let o = observe_agent(&client, &target, &request).await.unwrap();
        if o.response.records[0].state == WatchState::Removed {
            last = Some(o);
            break;
        }
    }
    let o = last.expect("the removal observed within 4 s");
    let (gone, kept) = (&o.response.records[0], &o.response.records[1]);
    assert_eq!(gone.endpoint.to_string(), "10.244.1.5");
    // one clock (the agent runs here): the removal lies within the record's read bounds
    let (lw, fw) = (gone.last_with_unix_seconds.unwrap(), gone.first_without_unix_seconds.unwrap());
    assert!(lw <= switched && switched <= fw, "last with {lw}, switched {switched}, first without {fw}");
    assert!(fw - switched < 2.0, "read within a round or two: {}", fw - switched);
    assert_eq!((kept.state, kept.first_without_unix_seconds), (WatchState::Held, None), "the other endpoint is still held");
    // the health port's /metrics: one removal in the deletion-to-removed histogram, its deletion
    // the first request's receipt less its age (0.25 s), all on this one clock
    let text = reqwest::get(format!("http://{}/metrics", agent.health)).await.unwrap().text().await.unwrap();
    let value = |series: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("{series} in\n{text}"));
        line.rsplit_once(' ').unwrap().1.parse().unwrap()
    };
    assert_eq!(value("safe_termination_agent_deletion_to_removed_seconds_count{node=\"node-a\"}"), 1.0);
    let window = value("safe_termination_agent_deletion_to_removed_seconds_sum{node=\"node-a\"}");
    let (earliest, latest) = (fw - first.received_unix_seconds + 0.25, fw - first.sent_unix_seconds + 0.25);
    assert!(earliest - 1e-6 <= window && window <= latest + 1e-6, "window {window} within [{earliest}, {latest}]");
    assert_eq!(value("safe_termination_agent_removals_censored_total{node=\"node-a\"}"), 0.0);
    assert!(value("safe_termination_agent_data_plane_reads_total{node=\"node-a\",result=\"ok\"}") >= 3.0);
    assert_eq!((o.response.protocol, o.response.set_id, o.response.complete), (3, Some(11), true));
    // protocol 3: the set kept by its id, and only what changed since the last answer's mark
    use safe_termination::sources::agent_client::observe_agent_body;
    let keep = |id: u64| bytes::Bytes::from(format!(r#"{{"watches":[],"setId":{id},"sameSet":true}}"#));
    let mark = o.response.mark.expect("a mark");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let quiet = observe_agent_body(&client, &target, keep(11), Some(mark)).await.unwrap().response;
    assert_eq!((quiet.records.len(), quiet.complete, quiet.set_id), (0, false, Some(11)), "nothing changed since the mark (reads go on): {quiet:?}");
    let other_epoch = AnswerMark { epoch: mark.epoch ^ 1, generation: mark.generation };
    let full = observe_agent_body(&client, &target, keep(11), Some(other_epoch)).await.unwrap().response;
    assert_eq!((full.records.len(), full.complete), (2, true), "a mark of another epoch (a restarted agent's) is answered in full");
    let unknown = observe_agent_body(&client, &target, keep(12), None).await.unwrap().response;
    assert_eq!((unknown.set_id, unknown.records.len()), (Some(11), 2), "a set not held changes nothing, and the answer says which is held");
    let bad_since = client.post(format!("{}/removals?since=1.x", agent.url())).body(keep(11)).send().await.unwrap();
    assert_eq!(bad_since.status(), 400);
    assert!(bad_since.text().await.unwrap().contains("since=1.x"));
    // a request the agent refuses, by name
    let bad = client.post(format!("{}/removals", agent.url())).body("{\"watches\": 1}").send().await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("not an observe request"));
    let too_many =
        ObserveRequest { watches: vec![watch("10.244.9.9"); safe_termination::agent_contract::observer::MAX_WATCHES + 1], set_id: None, same_set: false };
    let refused = observe_agent(&client, &target, &too_many).await.unwrap_err();
    let safe_termination::sources::agent_client::ObserveError::Status { status, body, .. } = &refused else { panic!("{refused:?}") };
    assert_eq!((status.as_u16(), body.as_str()), (413, "observe request out of bounds: 10001 watches: at most 10000"), "{refused}");
    agent.stop().await;
}

/// `--data-plane cilium`, and `auto` where nothing listens on kube-proxy's address but Cilium's
/// services map is pinned: the agent reads Cilium's maps under `--cilium-bpf-root`, and says so
/// (`dataPlane: cilium`). No bpffs here (the reads on real maps are the Cilium reader's root-only
/// tests): each read fails, naming the pin, and the watch stays held, never removed.
#[tokio::test]
async fn the_agent_reads_cilium_s_maps_when_named_or_without_kube_proxy() {
    use safe_termination::agent_contract::observer::{ObserveRequest, WatchRequest, WatchState};
    use safe_termination::sources::agent_client::observe_agent;
    let data = secret();
    let service = web_port();
    let request = ObserveRequest {
        watches: vec![WatchRequest { service, endpoint: "10.244.1.5".parse().unwrap(), remaining_seconds: 30.0, deletion_age_seconds: Some(0.1) }],
        set_id: None,
        same_set: false,
    };
    // nothing listens there: kube-proxy is absent
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    for (plane, pinned) in [(DataPlaneArg::Cilium, false), (DataPlaneArg::Auto, true)] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("bpffs");
        let pin = root.join("tc/globals/cilium_lb4_services_v2");
        if pinned {
            // a file of the pin's name, which auto takes for Cilium; not a map, so every read fails
            std::fs::create_dir_all(pin.parent().unwrap()).unwrap();
            std::fs::write(&pin, b"").unwrap();
        }
        let agent = Agent::start_with(dir.path(), &format!("http://{refused}"), &data[CA_CERT], &data[AGENT_CERT], &data[AGENT_KEY], |a| {
            a.data_plane = plane;
            a.cilium_bpf_root = root.clone();
        })
        .await;
        let source = AgentSource::new(AgentTargets::Static(vec![]), client_files(dir.path(), &data), Duration::from_secs(3));
        let (client, target) = (source.client().unwrap(), Target::new("node-a", &agent.url()));
        let mut seen = None;
        for _ in 0..100 {
            let o = observe_agent(&client, &target, &request).await.unwrap();
            if o.response.records[0].failed_reads >= 2 {
                seen = Some(o);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let o = seen.unwrap_or_else(|| panic!("{plane:?}: the agent tried to read"));
        assert_eq!(o.response.data_plane.as_deref(), Some("cilium"), "{plane:?}");
        let r = &o.response.records[0];
        assert_eq!((r.state, r.reads, r.first_without_unix_seconds), (WatchState::Held, 0, None), "{plane:?}: no sample, no removal");
        let error = r.last_error.as_deref().unwrap();
        eprintln!("{plane:?}: {error}");
        assert!(error.contains(&format!("{}: ", pin.display())) && error.contains("BPF_OBJ_GET"), "{plane:?}: {error}");
        assert!(error.contains("10.96.7.7:80/TCP"), "{plane:?}: {error}");
        agent.stop().await;
    }
}
