//! The operator's measurement sources over real sockets on 127.0.0.1 (ephemeral ports): fake
//! kube-proxies (axum, in this process) serving the real scrapes in tests/data/metrics (copies
//! of ../shared/cases/metrics, provenance in tests/data/SOURCES.md) plus `/proxyMode` and
//! `/configz`, and a fake Prometheus answering `/api/v1/query` like the real API.
//!
//! Targets carry node names but always connect to 127.0.0.1. Analyses go through the same core
//! as the controller (`analysis::analyze` over `MeasurementStore::inputs`). Unless a test says
//! otherwise a node has one sample, so its quantiles cover the kube-proxy process lifetime; the
//! restart test records two and uses their delta.

mod support;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use safe_termination::core::advisor::{AdviceReason, ClusterFacts, Thresholds};
use safe_termination::core::analysis::{AnalysisOptions, AnalysisReport, analyze};
use safe_termination::core::crd::TerminationPolicySpec;
use safe_termination::core::measure::MeasurementStore;
use safe_termination::core::model::{Basis, Interval, ProxyMode};
use safe_termination::core::proxyconfig::{ModeOrigin, ResolvedProxyConfig};
use safe_termination::sources::fetch::http_client;
use safe_termination::sources::prometheus::{PrometheusError, PrometheusLoop, PrometheusSource, Queries};
use safe_termination::sources::proxy_config::{fetch_configz, read_proxy_configmap, resolve_proxy_config};
use safe_termination::sources::scrape::{ScrapeMetrics, ScrapeOptions, ScrapeOutcome, record_outcomes, scrape_all, scrape_once};
use safe_termination::sources::scrape_loop::ScrapeLoop;
use safe_termination::sources::targets::{Discovery, Target, TargetSource, discover};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use support::fake_kube_proxy::FakeKubeProxy;
use support::{approx, closed_port};
use tokio_util::sync::CancellationToken;

const V1_29: &str = include_str!("data/metrics/kube-proxy-v1.29-iptables-excerpt.txt");
const V1_13: &str = include_str!("data/metrics/kube-proxy-v1.13-legacy-microseconds.txt");
const WINDOWS_TRUNCATED: &str = include_str!("data/metrics/kube-proxy-windows-truncated.txt");

const SYNC: &str = "kubeproxy_sync_proxy_rules_duration_seconds";

// ---------------------------------------------------------------------------------------------
// fake kube-proxy

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// Starts a fake kube-proxy and returns its target, named `node`, on 127.0.0.1.
async fn kube_proxy(node: &str, fake: &FakeKubeProxy) -> Target {
    Target::new(node, &format!("http://{}", fake.start().await))
}

/// A server that accepts connections and never answers.
async fn silent_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    addr
}

fn opts(timeout_ms: u64) -> ScrapeOptions {
    ScrapeOptions { timeout: Duration::from_millis(timeout_ms), ..ScrapeOptions::default() }
}

fn client() -> reqwest::Client {
    http_client(Duration::from_secs(5))
}

fn analysis_options() -> AnalysisOptions {
    AnalysisOptions {
        min_sync_period_seconds: 1.0,
        min_sync_period_source: "test".into(),
        mode: None,
        configured_mode: None,
        facts: ClusterFacts::default(),
        thresholds: Thresholds::default(),
        histograms: Default::default(),
        control_plane_lag: None,
        observed: None,
        observed_by_data_plane: Vec::new(),
    }
}

fn analyze_store(store: &MeasurementStore) -> AnalysisReport {
    analyze(&store.inputs(), &analysis_options(), &TerminationPolicySpec::default())
}

fn failure(o: &ScrapeOutcome) -> &safe_termination::core::measure::NodeFailure {
    o.result.as_ref().err().unwrap_or_else(|| panic!("{}: expected a failure", o.node))
}

/// Multiplies every cumulative count of `family`'s buckets and `_count` by `k`.
fn scale_counts(text: &str, family: &str, k: u64) -> String {
    let bucket = format!("{family}_bucket{{");
    let count = format!("{family}_count ");
    text.split_inclusive('\n')
        .map(|line| {
            if line.starts_with(&bucket) || line.starts_with(&count) {
                let (head, value) = line.trim_end().rsplit_once(' ').unwrap();
                format!("{head} {}\n", value.parse::<u64>().unwrap() * k)
            } else {
                line.to_string()
            }
        })
        .collect()
}

/// A scrape whose only sync histogram has `n` syncs between 4.096 and 8.192 s (kube-proxy's
/// bucket layout), i.e. a p99 of 4.096 + 4.096 x 0.99 = 8.15104 s.
fn slow_scrape(n: u64) -> String {
    let bounds = ["0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256", "0.512", "1.024", "2.048", "4.096"];
    let mut s = format!("# HELP {SYNC} [ALPHA] SyncProxyRules latency in seconds\n# TYPE {SYNC} histogram\n");
    for le in bounds {
        s.push_str(&format!("{SYNC}_bucket{{le=\"{le}\"}} 0\n"));
    }
    for le in ["8.192", "16.384", "+Inf"] {
        s.push_str(&format!("{SYNC}_bucket{{le=\"{le}\"}} {n}\n"));
    }
    s.push_str(&format!("{SYNC}_sum {}\n{SYNC}_count {n}\n", 6.0 * n as f64));
    s
}

// ---------------------------------------------------------------------------------------------
// kube-proxy scraping

#[tokio::test]
async fn real_scrapes_are_scraped_parsed_and_analysed() {
    let a = FakeKubeProxy::text(V1_29);
    let b = FakeKubeProxy::text(V1_13).with_mode("ipvs\n");
    let targets = vec![kube_proxy("node-a", &a).await, kube_proxy("node-b", &b).await];
    let outcomes = scrape_all(&client(), &targets, &opts(2000)).await;
    assert_eq!(outcomes.len(), 2);
    for o in &outcomes {
        let s = o.result.as_ref().unwrap_or_else(|f| panic!("{}: {} {}", o.node, f.reason, f.message));
        assert!(s.at_unix_seconds > 1.7e9);
        assert!(o.elapsed < Duration::from_secs(2));
    }
    let mut store = MeasurementStore::new(600.0);
    let n = record_outcomes(&mut store, outcomes);
    assert_eq!((n.scraped, n.failed), (2, 0));
    assert!(store.last_scrape_unix_seconds().is_some());

    let r = analyze_store(&store);
    assert_eq!(r.interval, "lifetime");
    let node_a = r.nodes.iter().find(|n| n.node == "node-a").unwrap();
    // v1.29 excerpt, lifetime: sync p99 = 0.064 + 0.064 x 1.96 / 2, NP p99 = 4 + 0.98
    approx(node_a.sync_p99.unwrap().seconds, 0.12672, 1e-9);
    approx(node_a.network_programming_p99.unwrap().seconds, 4.98, 1e-9);
    assert_eq!(node_a.sync_samples, 4.0);
    assert_eq!(node_a.basis, Basis::LowSampleCount);
    assert_eq!((node_a.mode, node_a.mode_source), (ProxyMode::Iptables, "proxyMode endpoint"));
    assert_eq!(node_a.kubernetes_version.as_deref(), Some("v1.29.0"));

    let node_b = r.nodes.iter().find(|n| n.node == "node-b").unwrap();
    // v1.13 legacy microseconds, converted: p99 = (32000 + 32000 x 108.31 / 126) us
    approx(node_b.sync_p99.unwrap().seconds, (32000.0 + 32000.0 * (2642.31 - 2534.0) / 126.0) * 1e-6, 1e-9);
    assert!(node_b.sync_from_legacy_microseconds);
    assert_eq!(node_b.basis, Basis::Measured);
    assert_eq!((node_b.mode, node_b.mode_source), (ProxyMode::Ipvs, "proxyMode endpoint"));

    // node-b is the only trusted node: it sets the window, the p99 of a removal's window with
    // these syncs and minSyncPeriod 1 s (1.041006 s from an independent implementation of
    // src/core/window_distribution.rs; found by bisection to 1e-6 s)
    assert_eq!(r.worst_node.as_deref(), Some("node-b"));
    approx(r.propagation_window_seconds.unwrap(), 1.041006, 1e-5);
}

#[tokio::test]
async fn connection_refused_names_the_metrics_bind_address_fix() {
    // kube-proxy's port on a loopback address of its own, checked free by binding it first
    drop(std::net::TcpListener::bind("127.0.0.3:10249").expect("127.0.0.3:10249 free for this test"));
    let target = Target::new("node-refused", "http://127.0.0.3:10249");
    let o = scrape_once(&client(), &target, &opts(2000)).await;
    let f = failure(&o);
    assert_eq!(f.reason, "connection_refused");
    assert!(f.message.contains("metricsBindAddress: 0.0.0.0:10249"), "{}", f.message);
    assert!(f.message.contains("--source auto or prometheus"), "{}", f.message);
    assert!(f.message.contains(&target.base_url), "{}", f.message);
    assert_eq!(o.node, "node-refused");
}

#[tokio::test]
async fn a_silent_server_times_out_within_the_per_target_timeout() {
    let addr = silent_server().await;
    let target = Target::new("node-silent", &format!("http://{addr}"));
    let start = Instant::now();
    let o = scrape_once(&client(), &target, &opts(300)).await;
    let took = start.elapsed();
    let f = failure(&o);
    assert_eq!(f.reason, "timeout");
    assert!(f.message.contains("within 0.3 s"), "{}", f.message);
    assert!(took >= Duration::from_millis(290) && took < Duration::from_secs(2), "{took:?}");
}

#[tokio::test]
async fn http_500_is_an_http_status_failure() {
    let fake = FakeKubeProxy::text("internal error");
    fake.set_status(500);
    let target = kube_proxy("node-500", &fake).await;
    let o = scrape_once(&client(), &target, &opts(2000)).await;
    let f = failure(&o);
    assert_eq!(f.reason, "http_status");
    assert!(f.message.contains("HTTP 500"), "{}", f.message);
    assert!(f.message.contains("/metrics"), "{}", f.message);
}

#[tokio::test]
async fn a_truncated_body_is_a_parse_failure_naming_family_and_line() {
    let target = kube_proxy("node-windows", &FakeKubeProxy::text(WINDOWS_TRUNCATED)).await;
    let o = scrape_once(&client(), &target, &opts(2000)).await;
    let f = failure(&o);
    assert_eq!(f.reason, "parse");
    assert!(f.message.contains(SYNC), "{}", f.message);
    assert!(f.message.contains("line 17"), "{}", f.message);

    // recorded as the node's failure; no sample, so no input
    let mut store = MeasurementStore::new(600.0);
    record_outcomes(&mut store, [o]);
    assert_eq!(store.failures()["node-windows"].reason, "parse");
    assert!(store.inputs().is_empty());
}

#[tokio::test]
async fn a_restarted_kube_proxy_is_analysed_since_its_restart() {
    let fake = FakeKubeProxy::text(&scale_counts(V1_29, SYNC, 10));
    let target = kube_proxy("node-restarted", &fake).await;
    let c = client();
    let mut store = MeasurementStore::new(600.0);
    record_outcomes(&mut store, [scrape_once(&c, &target, &opts(2000)).await]);
    fake.set_text(V1_29); // lower cumulative counts: the process restarted
    record_outcomes(&mut store, [scrape_once(&c, &target, &opts(2000)).await]);
    let inputs = store.inputs();
    assert!(inputs[0].earlier.is_some(), "two samples: an interval analysis");
    let r = analyze_store(&store);
    let n = &r.nodes[0];
    assert_eq!(n.interval, Interval::SinceRestart);
    // since the restart = the later scrape on its own
    assert_eq!(n.sync_samples, 4.0);
    approx(n.sync_p99.unwrap().seconds, 0.12672, 1e-9);
    assert_eq!(fake.hits(), 2);
}

#[tokio::test]
async fn a_stale_proxy_is_advised() {
    let last_sync = "kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.704894799332805e+09";
    let last_queued = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds 1.704894799314416e+09";
    assert!(V1_29.contains(last_sync) && V1_29.contains(last_queued));
    // a change queued 120 s before the scrape, after the last sync 130 s before it: waiting
    // 120 s when scraped (by the store's clock, stamped on the sample)
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let stale = V1_29
        .replace(last_queued, &format!("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds {}", now - 120.0))
        .replace(last_sync, &format!("kubeproxy_sync_proxy_rules_last_timestamp_seconds {}", now - 130.0));
    let target = kube_proxy("node-stale", &FakeKubeProxy::text(&stale)).await;
    let mut store = MeasurementStore::new(600.0);
    record_outcomes(&mut store, [scrape_once(&client(), &target, &opts(2000)).await]);
    let r = analyze_store(&store);
    let waited = r.nodes[0].stale_seconds.unwrap();
    assert!((120.0..125.0).contains(&waited), "waited {waited} s: 120 s plus the scrape's own time");
    let advice = r.advice.iter().find(|a| a.reason == AdviceReason::ProxyStale).expect("ProxyStale advice");
    assert_eq!(advice.node.as_deref(), Some("node-stale"));

    // the unmodified scrape is not stale
    let fresh = kube_proxy("node-fresh", &FakeKubeProxy::text(V1_29)).await;
    let mut store = MeasurementStore::new(600.0);
    record_outcomes(&mut store, [scrape_once(&client(), &fresh, &opts(2000)).await]);
    assert!(analyze_store(&store).advice.iter().all(|a| a.reason != AdviceReason::ProxyStale));
}

#[tokio::test]
async fn of_two_nodes_the_slow_one_is_the_worst_node() {
    let fast = kube_proxy("node-fast", &FakeKubeProxy::text(V1_13)).await;
    let slow = kube_proxy("node-slow", &FakeKubeProxy::text(&slow_scrape(100))).await;
    let mut store = MeasurementStore::new(600.0);
    record_outcomes(&mut store, scrape_all(&client(), &[fast, slow], &opts(2000)).await);
    let r = analyze_store(&store);
    assert!(r.nodes.iter().all(|n| n.basis == Basis::Measured));
    assert_eq!(r.worst_node.as_deref(), Some("node-slow"));
    let p99 = 4.096 + 4.096 * 0.99;
    approx(r.sync_p99_seconds.unwrap(), p99, 1e-9);
    // the window p99 of 100 syncs in (4.096, 8.192] with minSyncPeriod 1 s (an independent
    // implementation of src/core/window_distribution.rs)
    approx(r.propagation_window_seconds.unwrap(), 15.441965, 1e-5);
    assert!(r.advice.iter().any(|a| a.reason == AdviceReason::ProxySyncSlow && a.node.as_deref() == Some("node-slow")));
}

#[tokio::test]
async fn scrape_all_bounds_requests_in_flight_and_keeps_going_past_failures() {
    let fake = FakeKubeProxy::text(V1_29);
    let mut targets = Vec::new();
    for i in 0..12 {
        targets.push(kube_proxy(&format!("node-{i:02}"), &fake).await);
    }
    targets.push(Target::new("node-refused", &format!("http://127.0.0.1:{}", closed_port())));
    let outcomes = scrape_all(&client(), &targets, &ScrapeOptions { max_in_flight: 3, ..opts(2000) }).await;
    assert_eq!(outcomes.len(), 13);
    assert_eq!(outcomes.iter().filter(|o| o.result.is_ok()).count(), 12);
    assert_eq!(outcomes.iter().find(|o| o.node == "node-refused").unwrap().reason(), Some("connection_refused"));
    assert_eq!(fake.hits(), 12);
}

#[tokio::test]
async fn configz_is_read_best_effort_and_resolution_names_its_source() {
    const CONFIGZ: &str = r#"{"kubeproxy.config.k8s.io":{"Mode":"nftables","NFTables":{"MasqueradeBit":14},"MetricsBindAddress":"0.0.0.0:10249","SyncPeriod":"30s","MinSyncPeriod":"2s","ConfigSyncPeriod":"15m0s"}}"#;
    let with = kube_proxy("node-configz", &FakeKubeProxy::text(V1_29).with_configz(CONFIGZ)).await;
    let without = kube_proxy("node-plain", &FakeKubeProxy::text(V1_29)).await;
    let c = client();
    let cfg = fetch_configz(&c, &with, Duration::from_secs(2)).await.unwrap();
    assert_eq!((cfg.mode, cfg.min_sync_period_seconds), (ProxyMode::Nftables, 2.0));
    let e = fetch_configz(&c, &without, Duration::from_secs(2)).await.unwrap_err().to_string();
    assert!(e.contains("HTTP 404") && e.contains("/configz"), "{e}");

    let r = resolve_proxy_config(&c, &[without.clone(), with.clone()], None, Duration::from_secs(2)).await;
    assert_eq!(r.source, "configz node-configz");
    assert_eq!(r.min_sync_period_seconds, 2.0);
    assert_eq!(r.mode(), Some(ProxyMode::Nftables));
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);

    let r = resolve_proxy_config(&c, &[without], None, Duration::from_secs(2)).await;
    assert_eq!((r.source.as_str(), r.min_sync_period_seconds), ("default", 1.0));
    assert!(r.notes[0].starts_with("configz: "), "{:?}", r.notes);
}

#[tokio::test]
async fn the_scrape_loop_records_retains_publishes_and_stops() {
    const CONFIGZ: &str = r#"{"kubeproxy.config.k8s.io":{"Mode":"iptables","SyncPeriod":"30s","MinSyncPeriod":"3s"}}"#;
    let a = kube_proxy("node-a", &FakeKubeProxy::text(V1_29).with_configz(CONFIGZ)).await;
    let b = kube_proxy("node-b", &FakeKubeProxy::text(V1_13)).await;
    let gone = Target::new("node-gone", &format!("http://127.0.0.1:{}", closed_port()));
    let store = Arc::new(Mutex::new(MeasurementStore::new(600.0)));
    let (tx, mut rx) = tokio::sync::watch::channel(0u64);
    let metrics = ScrapeMetrics::default();
    let mut registry = prometheus_client::registry::Registry::with_prefix("safe_termination_scrape");
    metrics.register(&mut registry);

    let mut lp = ScrapeLoop::new(TargetSource::Static(vec![a.clone(), b.clone(), gone]), store.clone(), tx.clone())
        .with_options(opts(2000))
        .with_metrics(metrics.clone())
        .with_proxy_config(Arc::new(RwLock::new(ResolvedProxyConfig::default())));
    let config = lp.proxy_config();
    let s = lp.run_cycle().await;
    assert_eq!((s.targets, s.scraped, s.failed, s.generation), (3, 2, 1, 1));
    assert!(rx.has_changed().unwrap());
    assert_eq!(*rx.borrow_and_update(), 1);
    {
        let st = store.lock().unwrap();
        assert_eq!(st.nodes_with_data(), 2);
        assert_eq!(st.failures()["node-gone"].reason, "connection_refused");
    }
    assert_eq!(config.read().unwrap().source, "configz node-a");
    assert_eq!(config.read().unwrap().min_sync_period_seconds, 3.0);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("safe_termination_scrape_errors_total{reason=\"connection_refused\"} 1"), "{text}");
    assert!(text.contains("safe_termination_scrape_duration_seconds_count 3"), "{text}");
    assert!(text.contains("safe_termination_scrape_targets 3"), "{text}");

    // node-gone and node-b leave: their failure and samples are dropped
    let mut lp = ScrapeLoop::new(TargetSource::Static(vec![a.clone()]), store.clone(), tx.clone()).with_options(opts(2000));
    let s = lp.run_cycle().await;
    assert_eq!((s.targets, s.scraped, s.failed, s.generation), (1, 1, 0, 2));
    assert_eq!(*rx.borrow_and_update(), 2);
    {
        let st = store.lock().unwrap();
        assert_eq!(st.nodes_with_data(), 1);
        assert!(st.failures().is_empty());
        assert!(st.inputs()[0].earlier.is_some(), "node-a has two samples now");
    }

    // run(): a cycle at once, then cancellation ends it promptly
    let cancel = CancellationToken::new();
    let lp = ScrapeLoop::new(TargetSource::Static(vec![a]), store.clone(), tx).with_options(opts(2000)).with_interval(Duration::from_secs(3600));
    let task = tokio::spawn(lp.run(cancel.clone()));
    tokio::time::timeout(Duration::from_secs(5), rx.changed()).await.unwrap().unwrap();
    assert_eq!(*rx.borrow(), 3);
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(2), task).await.expect("the loop stops on cancel").unwrap();
}

// ---------------------------------------------------------------------------------------------
// Prometheus

/// What the fake Prometheus answers, by query.
#[derive(Clone, Default)]
struct FakeProm {
    answers: Arc<HashMap<String, (u16, String)>>,
    seen: Arc<Mutex<Vec<String>>>,
}

async fn prom_query(State(p): State<FakeProm>, uri: Uri) -> Response {
    let url = reqwest::Url::parse(&format!("http://prometheus{uri}")).unwrap();
    let query = url.query_pairs().find(|(k, _)| k == "query").map(|(_, v)| v.into_owned()).unwrap_or_default();
    p.seen.lock().unwrap().push(query.clone());
    match p.answers.get(&query) {
        Some((status, body)) => (StatusCode::from_u16(*status).unwrap(), [("content-type", "application/json")], body.clone()).into_response(),
        None => (StatusCode::BAD_REQUEST, format!(r#"{{"status":"error","errorType":"bad_data","error":"unexpected query {query:?}"}}"#)).into_response(),
    }
}

fn vector(series: &[(&[(&str, &str)], f64)]) -> String {
    let result: Vec<serde_json::Value> = series
        .iter()
        .map(|(labels, v)| {
            let metric: serde_json::Map<String, serde_json::Value> =
                labels.iter().map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string()))).collect();
            serde_json::json!({"metric": metric, "value": [1700000000.0, v.to_string()]})
        })
        .collect();
    serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}}).to_string()
}

/// Increases over the window for two instances: 10.0.0.1 (no node label) with the v1.29
/// excerpt's bucket counts, and 10.0.0.2 labelled node-b with 100 syncs in (4.096, 8.192].
fn prometheus_answers(window_seconds: f64) -> HashMap<String, (u16, String)> {
    let q = Queries::new(window_seconds);
    let a = "10.0.0.1:10249";
    let b = "10.0.0.2:10249";
    let sync_a = [("0.016", 1.0), ("0.032", 2.0), ("0.064", 2.0), ("0.128", 4.0), ("16.384", 4.0), ("+Inf", 4.0)];
    let sync_b = [("4.096", 0.0), ("8.192", 100.0), ("16.384", 100.0), ("+Inf", 100.0)];
    let mut sync: Vec<(Vec<(&str, &str)>, f64)> = Vec::new();
    for (le, v) in sync_a {
        sync.push((vec![("instance", a), ("le", le)], v));
    }
    for (le, v) in sync_b {
        sync.push((vec![("instance", b), ("node", "node-b"), ("le", le)], v));
    }
    let sync: Vec<(&[(&str, &str)], f64)> = sync.iter().map(|(l, v)| (l.as_slice(), *v)).collect();
    let np: Vec<(Vec<(&str, &str)>, f64)> = [("4", 1.0), ("5", 2.0), ("+Inf", 2.0)].into_iter().map(|(le, v)| (vec![("instance", a), ("le", le)], v)).collect();
    let np: Vec<(&[(&str, &str)], f64)> = np.iter().map(|(l, v)| (l.as_slice(), *v)).collect();
    let mut m = HashMap::new();
    m.insert(q.sync_buckets, (200, vector(&sync)));
    m.insert(q.network_programming_buckets, (200, vector(&np)));
    m.insert(q.last_sync, (200, vector(&[(&[("instance", a)], 1704894799.0), (&[("instance", b), ("node", "node-b")], 1704894700.0)])));
    m.insert(q.last_queued, (200, vector(&[(&[("instance", a)], 1704894799.0), (&[("instance", b), ("node", "node-b")], 1704894820.0)])));
    m.insert(q.iptables_rules, (200, vector(&[(&[("instance", a)], 38.0)])));
    // no native histograms on this server (native ingestion off): the native queries answer
    // an empty vector, as a real Prometheus does for a name it holds no series of
    m.insert(q.sync_native, (200, vector(&[])));
    m.insert(q.network_programming_native, (200, vector(&[])));
    m
}

async fn prometheus(answers: HashMap<String, (u16, String)>) -> (String, FakeProm) {
    let p = FakeProm { answers: Arc::new(answers), seen: Arc::default() };
    let router = Router::new().route("/api/v1/query", get(prom_query)).with_state(p.clone());
    (format!("http://{}", serve(router).await), p)
}

#[tokio::test]
async fn prometheus_source_feeds_the_same_core_maths() {
    let (url, fake) = prometheus(prometheus_answers(600.0)).await;
    let src = PrometheusSource::new(&url, Duration::from_secs(600), Duration::from_secs(5)).unwrap();
    let snap = src.fetch().await.unwrap();
    assert!(snap.failures.is_empty(), "{:?}", snap.failures);
    let keys: Vec<&str> = snap.inputs.iter().map(|i| i.node.as_str()).collect();
    assert_eq!(keys, ["10.0.0.1", "node-b"], "instance without port, or the node label");
    assert!(snap.inputs.iter().all(|i| i.earlier.is_none()));
    // every query arrived intact (URL-encoded and decoded)
    let q = Queries::new(600.0);
    let seen = fake.seen.lock().unwrap().clone();
    for expected in
        [&q.sync_buckets, &q.network_programming_buckets, &q.sync_native, &q.network_programming_native, &q.last_sync, &q.last_queued, &q.iptables_rules]
    {
        assert!(seen.contains(expected), "{expected} not in {seen:?}");
    }

    let r = analyze(&snap.inputs, &analysis_options(), &TerminationPolicySpec::default());
    let a = r.nodes.iter().find(|n| n.node == "10.0.0.1").unwrap();
    approx(a.sync_p99.unwrap().seconds, 0.12672, 1e-9); // same buckets as the v1.29 excerpt
    approx(a.network_programming_p99.unwrap().seconds, 4.98, 1e-9);
    assert_eq!(a.iptables_rules_total, Some(38.0));
    assert_eq!(a.stale_seconds, Some(0.0));
    let b = r.nodes.iter().find(|n| n.node == "node-b").unwrap();
    approx(b.sync_p99.unwrap().seconds, 4.096 + 4.096 * 0.99, 1e-9);
    // queued at 1704894820 after the last sync at 1704894700: waiting since then, to the query's time
    approx(b.stale_seconds.unwrap(), snap.at_unix_seconds - 1704894820.0, 1e-6);
    assert_eq!(r.worst_node.as_deref(), Some("node-b"));
    assert!(r.advice.iter().any(|x| x.reason == AdviceReason::ProxyStale && x.node.as_deref() == Some("node-b")));
}

#[tokio::test]
async fn prometheus_errors_are_clear_and_keep_the_last_measurement() {
    let mut answers = prometheus_answers(600.0);
    let q = Queries::new(600.0);
    answers.insert(
        q.network_programming_buckets.clone(),
        (422, r#"{"status":"error","errorType":"execution","error":"query processing would load too many samples into memory in query execution"}"#.into()),
    );
    let (url, _) = prometheus(answers).await;
    let src = PrometheusSource::new(&url, Duration::from_secs(600), Duration::from_secs(5)).unwrap();
    let e = src.fetch().await.unwrap_err();
    assert!(matches!(e, PrometheusError::Api { http_status: 422, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("Prometheus rejected the query") && msg.contains("execution: query processing would load too many samples"), "{msg}");
    assert!(msg.contains("kubeproxy_network_programming_duration_seconds_bucket"), "{msg}");

    // a non-Prometheus answer (a proxy's error page)
    let mut answers = prometheus_answers(600.0);
    answers.insert(q.sync_buckets.clone(), (503, "<html>upstream unavailable</html>".into()));
    let (url, _) = prometheus(answers).await;
    let src = PrometheusSource::new(&url, Duration::from_secs(600), Duration::from_secs(5)).unwrap();
    let e = src.fetch().await.unwrap_err().to_string();
    assert!(e.contains("HTTP 503") && e.contains("upstream unavailable"), "{e}");

    // nothing listening
    let src = PrometheusSource::new(&format!("http://127.0.0.1:{}", closed_port()), Duration::from_secs(600), Duration::from_secs(2)).unwrap();
    let e = src.fetch().await.unwrap_err();
    assert!(matches!(e, PrometheusError::Transport { .. }), "{e:?}");
    assert!(e.to_string().contains("did not answer"), "{e}");

    // the loop: a good round fills the store, a failed one keeps it and does not publish
    let (good_url, _) = prometheus(prometheus_answers(600.0)).await;
    let store = Arc::new(Mutex::new(MeasurementStore::new(600.0)));
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    let good = PrometheusLoop::new(PrometheusSource::new(&good_url, Duration::from_secs(600), Duration::from_secs(5)).unwrap(), store.clone(), tx.clone());
    assert_eq!(good.run_once().await.unwrap(), 2);
    assert_eq!(*rx.borrow(), 1);
    let bad = PrometheusLoop::new(src, store.clone(), tx);
    let last_error = bad.last_error();
    assert!(bad.run_once().await.is_err());
    assert_eq!(*rx.borrow(), 1);
    assert!(last_error.lock().unwrap().as_deref().unwrap().contains("did not answer"));
    assert_eq!(store.lock().unwrap().nodes_with_data(), 2);
}

// ---------------------------------------------------------------------------------------------
// the kube API side (a mocked API server, tower-test)

#[tokio::test]
async fn no_kube_proxy_and_a_running_cilium_agent_is_an_ebpf_dataplane() {
    let (kube_client, seen) = fake_api();
    let r = resolve_proxy_config(&client(), &[], Some((&kube_client, &Discovery::default())), Duration::from_secs(2)).await;
    let dataplane = r.dataplane.clone().expect("a Cilium dataplane");
    assert_eq!((r.mode(), r.source.as_str()), (Some(ProxyMode::Ebpf), "Cilium agent pods"));
    assert_eq!(dataplane.note, "no kube-proxy pods; 1 Cilium agent pod(s) (k8s-app=cilium in cilium): eBPF dataplane, sized from the policy default");
    assert_eq!(r.notes, ["configz: no kube-proxy target"]);
    assert_eq!(*seen.lock().unwrap(), ["/api/v1/pods?&labelSelector=k8s-app%3Dcilium&limit=100"], "only the Cilium lookup, no ConfigMap read");

    // no agent for this selector: the kube-proxy ConfigMap is read as before, no dataplane
    let other = Discovery { cilium_selector: "app=not-there".into(), ..Discovery::default() };
    let r = resolve_proxy_config(&client(), &[], Some((&kube_client, &other)), Duration::from_secs(2)).await;
    assert_eq!((r.mode(), r.source.as_str(), r.dataplane), (Some(ProxyMode::Iptables), "ConfigMap kube-system/kube-proxy-config", None));

    // an empty selector never looks
    let off = Discovery { cilium_selector: String::new(), ..Discovery::default() };
    let cilium_lookups = || seen.lock().unwrap().iter().filter(|p| p.starts_with("/api/v1/pods?")).count();
    assert_eq!(cilium_lookups(), 2);
    let r = resolve_proxy_config(&client(), &[], Some((&kube_client, &off)), Duration::from_secs(2)).await;
    assert_eq!((r.dataplane, cilium_lookups()), (None, 2));
}

/// EKS's `kube-proxy-config` ConfigMap, key `config` (as in proxyconfig's unit tests).
const EKS_CONFIG: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddress: 0.0.0.0\niptables:\n  masqueradeAll: false\n  masqueradeBit: 14\n  minSyncPeriod: 0s\n  syncPeriod: 30s\nmetricsBindAddress: 0.0.0.0:10249\nmode: \"iptables\"\n";

/// kubeadm's `kube-proxy` ConfigMap before 1.37 (`mode: ""`), key `config.conf`.
const KUBEADM_CONFIG: &str = include_str!("data/kube-proxy-config/kubeadm-1.31-config.conf");

/// A fake API server for kube-system: a kube-proxy PodList, no `kube-proxy` ConfigMap (404),
/// and EKS's `kube-proxy-config`; namespace `kubeadm-1-31` holds kubeadm's `kube-proxy`
/// ConfigMap. Records every `path?query`.
fn fake_api() -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    use http::{Request, Response};
    use kube::client::Body;
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let path = req.uri().path().to_string();
            log.lock().unwrap().push(format!("{}?{}", path, req.uri().query().unwrap_or("")));
            let pod = |name: &str, node: &str, phase: &str, ip: &str| {
                serde_json::json!({"metadata": {"name": name, "namespace": "kube-system", "labels": {"k8s-app": "kube-proxy"}},
                    "spec": {"nodeName": node, "hostNetwork": true, "containers": [{"name": "kube-proxy", "image": "registry.k8s.io/kube-proxy:v1.33.0"}]},
                    "status": {"phase": phase, "podIP": ip, "hostIP": ip}})
            };
            let (status, body) = match path.as_str() {
                "/api/v1/namespaces/kube-system/pods" => (
                    200,
                    serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": [
                        pod("kube-proxy-x1", "node-b", "Running", "10.0.0.2"),
                        pod("kube-proxy-x2", "node-a", "Running", "10.0.0.1"),
                        pod("kube-proxy-x3", "node-c", "Pending", ""),
                    ]}),
                ),
                // Cilium agents, all namespaces: one running, one being deleted; none for other selectors
                "/api/v1/pods" if req.uri().query().unwrap_or("").contains("labelSelector=k8s-app%3Dcilium") => {
                    let agent = |name: &str, deleting: bool| {
                        let mut p = serde_json::json!({"metadata": {"name": name, "namespace": "cilium", "labels": {"k8s-app": "cilium"}},
                            "spec": {"nodeName": "node-a", "containers": [{"name": "cilium-agent", "image": "quay.io/cilium/cilium:v1.18.0"}]},
                            "status": {"phase": "Running"}});
                        if deleting {
                            p["metadata"]["deletionTimestamp"] = "2026-11-29T00:00:00Z".into();
                        }
                        p
                    };
                    (
                        200,
                        serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
                        "items": [agent("cilium-abcde", false), agent("cilium-old", true)]}),
                    )
                }
                "/api/v1/pods" => (200, serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": []})),
                "/api/v1/namespaces/kubeadm-1-31/configmaps/kube-proxy" => (
                    200,
                    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "kube-proxy", "namespace": "kubeadm-1-31"}, "data": {"config.conf": KUBEADM_CONFIG}}),
                ),
                "/api/v1/namespaces/kube-system/configmaps/kube-proxy-config" => (
                    200,
                    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "kube-proxy-config", "namespace": "kube-system"}, "data": {"config": EKS_CONFIG}}),
                ),
                _ => (
                    404,
                    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("{path} not found"), "reason": "NotFound", "code": 404}),
                ),
            };
            send.send_response(Response::builder().status(status).body(Body::from(serde_json::to_vec(&body).unwrap())).unwrap());
        }
    });
    (kube::Client::new(svc, "default"), seen)
}

#[tokio::test]
async fn discovery_lists_kube_proxy_pods_by_selector() {
    let (client, seen) = fake_api();
    let targets = discover(&client, &Discovery::default()).await.unwrap();
    assert_eq!(targets, vec![Target::new("node-a", "http://10.0.0.1:10249"), Target::new("node-b", "http://10.0.0.2:10249")]);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].starts_with("/api/v1/namespaces/kube-system/pods?") && seen[0].contains("labelSelector=k8s-app%3Dkube-proxy"), "{seen:?}");

    let source = TargetSource::Kube { client, discovery: Discovery { port: 9999, ..Discovery::default() } };
    assert_eq!(source.targets().await.unwrap()[0].base_url, "http://10.0.0.1:9999");
}

/// `/configz` holds the mode kube-proxy runs, already defaulted: the ConfigMap says whether it
/// was set, when it names the same mode; otherwise the origin stays unknown, without a note.
#[tokio::test]
async fn the_configmap_says_whether_the_mode_configz_reports_was_set() {
    let (kube_client, _) = fake_api();
    const IPTABLES: &str = r#"{"kubeproxy.config.k8s.io":{"Mode":"iptables","SyncPeriod":"30s","MinSyncPeriod":"1s"}}"#;
    const NFTABLES: &str = r#"{"kubeproxy.config.k8s.io":{"Mode":"nftables","SyncPeriod":"30s","MinSyncPeriod":"1s"}}"#;
    let iptables = kube_proxy("node-a", &FakeKubeProxy::text(V1_29).with_configz(IPTABLES)).await;
    let nftables = kube_proxy("node-b", &FakeKubeProxy::text(V1_29).with_configz(NFTABLES)).await;
    let c = client();
    let resolve = |target: Target, namespace: &'static str| {
        let (c, kube_client) = (c.clone(), kube_client.clone());
        async move {
            let discovery = Discovery { namespace: namespace.into(), ..Discovery::default() };
            resolve_proxy_config(&c, &[target], Some((&kube_client, &discovery)), Duration::from_secs(2)).await
        }
    };
    let origin = |r: &ResolvedProxyConfig| (r.source.clone(), r.config.as_ref().map(|c| c.mode_origin), r.notes.clone());
    // EKS's ConfigMap sets `mode: "iptables"`; kubeadm's before 1.37 leaves it empty
    assert_eq!(origin(&resolve(iptables.clone(), "kube-system").await), ("configz node-a".into(), Some(ModeOrigin::Explicit), vec![]));
    assert_eq!(origin(&resolve(iptables.clone(), "kubeadm-1-31").await), ("configz node-a".into(), Some(ModeOrigin::Defaulted), vec![]));
    // a ConfigMap naming another mode than kube-proxy runs says nothing of it; nor does none
    assert_eq!(origin(&resolve(nftables, "kube-system").await), ("configz node-b".into(), Some(ModeOrigin::Unknown), vec![]));
    assert_eq!(origin(&resolve(iptables, "elsewhere").await), ("configz node-a".into(), Some(ModeOrigin::Unknown), vec![]));
    // without a client, /configz alone
    let alone = resolve_proxy_config(&c, &[kube_proxy("node-c", &FakeKubeProxy::text(V1_29).with_configz(IPTABLES)).await], None, Duration::from_secs(2)).await;
    assert_eq!(alone.config.map(|c| c.mode_origin), Some(ModeOrigin::Unknown));
}

#[tokio::test]
async fn the_configmap_is_the_fallback_when_configz_is_unreachable() {
    let (kube_client, seen) = fake_api();
    let (source, cfg) = read_proxy_configmap(&kube_client, "kube-system").await.unwrap();
    assert_eq!(source, "ConfigMap kube-system/kube-proxy-config");
    assert_eq!((cfg.mode, cfg.min_sync_period_seconds, cfg.min_sync_period_defaulted), (ProxyMode::Iptables, 1.0, true));
    assert_eq!(
        seen.lock().unwrap().iter().map(|p| p.split('?').next().unwrap().to_string()).collect::<Vec<_>>(),
        ["/api/v1/namespaces/kube-system/configmaps/kube-proxy", "/api/v1/namespaces/kube-system/configmaps/kube-proxy-config"]
    );
    let e = read_proxy_configmap(&kube_client, "elsewhere").await.unwrap_err().to_string();
    assert!(e.contains("no ConfigMap kube-proxy (key config.conf) or kube-proxy-config (key config) in elsewhere"), "{e}");

    // configz refused on the only target (kube-proxy's port on a loopback address of its own,
    // checked free): the ConfigMap is used and the skip is explained
    drop(std::net::TcpListener::bind("127.0.0.4:10249").expect("127.0.0.4:10249 free for this test"));
    let refused = Target::new("node-a", "http://127.0.0.4:10249");
    let r = resolve_proxy_config(&client(), &[refused], Some((&kube_client, &Discovery::default())), Duration::from_secs(2)).await;
    assert_eq!(r.dataplane, None);
    assert_eq!(r.source, "ConfigMap kube-system/kube-proxy-config");
    assert_eq!(r.min_sync_period_seconds, 1.0);
    assert!(r.notes[0].contains("configz") && r.notes[0].contains("metricsBindAddress"), "{:?}", r.notes);

    // the Prometheus loop reads the ConfigMap into a shared handle on its first round
    let (url, _) = prometheus(prometheus_answers(600.0)).await;
    let shared = Arc::new(RwLock::new(ResolvedProxyConfig::default()));
    let (tx, _rx) = tokio::sync::watch::channel(0u64);
    let lp = PrometheusLoop::new(
        PrometheusSource::new(&url, Duration::from_secs(600), Duration::from_secs(5)).unwrap(),
        Arc::new(Mutex::new(MeasurementStore::new(600.0))),
        tx,
    )
    .with_configmap(kube_client.clone(), "kube-system", shared.clone(), 10);
    lp.run_once().await.unwrap();
    assert_eq!(shared.read().unwrap().source, "ConfigMap kube-system/kube-proxy-config");
}

// ---------------------------------------------------------------------------------------------
// the command line's URL source (`analyze http://...`): bounded bodies

/// A body that never ends: 64 KiB chunks of comment lines, chunked, until the client hangs up.
fn endless_body() -> axum::body::Body {
    let chunk = axum::body::Bytes::from("# padding\n".repeat(64 * 1024 / 10));
    axum::body::Body::from_stream(futures::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone())))
}

/// `analyze`'s URL fetch stops reading at its limit: an endless `/metrics` body used to be read
/// until the timeout (gigabytes of memory), and so did an endless `/proxyMode`.
#[tokio::test]
async fn cli_url_fetch_stops_at_the_body_limit() {
    use safe_termination::core::exposition::ACCEPT_PROTOBUF_FIRST as ACCEPT;
    use safe_termination::sources::{MAX_PROXY_MODE_BYTES, fetch_url};
    let endless = serve(Router::new().route("/metrics", get(|| async { endless_body() }))).await;
    let url = format!("http://{endless}/metrics");
    let start = Instant::now();
    let err = fetch_url(&http_client(Duration::from_secs(30)), &url, 1 << 20, ACCEPT).await.unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.to_string(), format!("{url}: body larger than 1048576 bytes (--max-body-bytes): stopped reading"));
    assert!(took < Duration::from_secs(5), "{took:?}");

    // a body exactly at the limit is read; one byte less of limit refuses it
    let body = V1_29.to_string();
    let exact = serve(Router::new().route("/metrics", get(move || async move { body }))).await;
    let url = format!("http://{exact}/metrics");
    let fetched = fetch_url(&http_client(Duration::from_secs(30)), &url, V1_29.len(), ACCEPT).await.unwrap();
    assert_eq!(fetched.body, V1_29.as_bytes());
    let err = fetch_url(&http_client(Duration::from_secs(30)), &url, V1_29.len() - 1, ACCEPT).await.unwrap_err();
    assert_eq!(err.to_string(), format!("{url}: body larger than {} bytes (--max-body-bytes): stopped reading", V1_29.len() - 1));

    // an endless /proxyMode is cut at its own limit and, being best effort, leaves the mode unknown
    let router = Router::new().route("/metrics", get(|| async { V1_29 })).route("/proxyMode", get(|| async { endless_body() }));
    let addr = serve(router).await;
    let start = Instant::now();
    let fetched = fetch_url(&http_client(Duration::from_secs(30)), &format!("http://{addr}/metrics"), 1 << 20, ACCEPT).await.unwrap();
    let took = start.elapsed();
    assert_eq!((fetched.body.as_slice(), fetched.proxy_mode), (V1_29.as_bytes(), None));
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(MAX_PROXY_MODE_BYTES, 65536);
}

// ---------------------------------------------------------------------------------------------
// kube-proxy 1.37's protobuf exposition: asked for first, read with its native histograms

use safe_termination::core::exposition::{ACCEPT_PROTOBUF_FIRST, KubeProxyScrape, parse_kube_proxy_metrics};
use support::fake_kube_proxy::{A_PB, A_TXT, Answer, ipv4_only, ipv4_only_text};

#[tokio::test]
async fn the_scrape_asks_for_protobuf_first_and_reads_the_native_histogram() {
    let (addr, seen) = support::fake_kube_proxy::kube_proxy(Answer::Negotiate { pb: ipv4_only(A_PB), text: A_TXT.into() }).await;
    let o = scrape_once(&client(), &Target::new("node-a", &format!("http://{addr}")), &opts(3000)).await;
    let scrape = o.result.unwrap().scrape;
    assert_eq!(seen.accepts(), [Some(ACCEPT_PROTOBUF_FIRST.to_string())]);
    let native = scrape.sync_native.as_ref().expect("native histogram from the protobuf answer");
    assert_eq!((native.schema(), native.count()), (3, 2.0));
    // the classic part is the text capture's (its IPv4 series)
    assert_eq!(scrape.sync, parse_kube_proxy_metrics(&ipv4_only_text(A_TXT)).unwrap().sync);
    assert_eq!(scrape.kubernetes_version.as_deref(), Some("v1.37.2"));
}

#[tokio::test]
async fn the_scrape_of_both_ip_families_sums_their_native_histograms_needs_native_add() {
    let (addr, _) = support::fake_kube_proxy::kube_proxy(Answer::Negotiate { pb: A_PB.to_vec(), text: A_TXT.into() }).await;
    let o = scrape_once(&client(), &Target::new("node-a", &format!("http://{addr}")), &opts(3000)).await;
    let scrape = o.result.unwrap().scrape;
    assert_eq!(scrape.sync_native.as_ref().map(|n| n.count()), Some(3.0));
}

#[tokio::test]
async fn a_text_answer_to_the_protobuf_first_accept_is_read_as_text() {
    let (addr, seen) = support::fake_kube_proxy::kube_proxy(Answer::TextOnly(A_TXT.into())).await;
    let o = scrape_once(&client(), &Target::new("node-a", &format!("http://{addr}")), &opts(3000)).await;
    let scrape = o.result.unwrap().scrape;
    assert_eq!(seen.accepts(), [Some(ACCEPT_PROTOBUF_FIRST.to_string())]);
    assert_eq!(scrape, parse_kube_proxy_metrics(A_TXT).unwrap());
    assert!(scrape.sync_native.is_none());
    // a protobuf body cut short is a parse failure naming the message and the byte
    let pb = ipv4_only(A_PB);
    let (addr, _) = support::fake_kube_proxy::kube_proxy(Answer::Negotiate { pb: pb[..pb.len() - 10].to_vec(), text: String::new() }).await;
    let f = scrape_once(&client(), &Target::new("node-a", &format!("http://{addr}")), &opts(3000)).await.result.unwrap_err();
    assert_eq!(f.reason, "parse");
    assert!(f.message.contains("/metrics: protobuf message ") && f.message.contains("the scrape was cut off"), "{}", f.message);
}

/// `--source files` reads a saved protobuf scrape as such (its first bytes say so) and a text
/// one as text.
#[test]
fn the_files_source_detects_protobuf_scrapes() {
    let dir = tempfile::tempdir().unwrap();
    let pb = dir.path().join("node-a.pb");
    std::fs::write(&pb, ipv4_only(A_PB)).unwrap();
    let txt = dir.path().join("node-b.txt");
    std::fs::write(&txt, A_TXT).unwrap();
    let specs = [format!("node-a={}", pb.display()), format!("node-b={}", txt.display())];
    let store = safe_termination::sources::store_from_files(&specs, 600.0).unwrap();
    let inputs = store.inputs();
    let a = inputs.iter().find(|i| i.node == "node-a").unwrap();
    let b = inputs.iter().find(|i| i.node == "node-b").unwrap();
    assert_eq!(a.later.sync_native.as_ref().map(|n| n.schema()), Some(3));
    assert_eq!(a.later.sync, parse_kube_proxy_metrics(&ipv4_only_text(A_TXT)).unwrap().sync);
    // as parsed, stamped with the time the store read it
    assert!(b.later.scraped_at_unix_seconds.is_some());
    assert_eq!(b.later, KubeProxyScrape { scraped_at_unix_seconds: b.later.scraped_at_unix_seconds, ..parse_kube_proxy_metrics(A_TXT).unwrap() });
    // a cut protobuf file is an error naming the file and the message
    std::fs::write(&pb, &ipv4_only(A_PB)[..100]).unwrap();
    let e = safe_termination::sources::store_from_files(&specs[..1], 600.0).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: protobuf message ", pb.display())) && e.contains("cut off"), "{e}");
    // an empty file is a failed capture, refused here as `analyze` refuses it (one reader)
    std::fs::write(&pb, b"").unwrap();
    let e = safe_termination::sources::store_from_files(&specs[..1], 600.0).unwrap_err().to_string();
    assert_eq!(e, format!("{}: empty (0 bytes): no metrics to read; was the capture cut off?", pb.display()));
}
