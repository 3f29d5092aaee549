//! The TerminationPolicy controller against a mocked API server (tower-test): what it writes,
//! when, and what it never writes.

use http::{Request, Response};
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use kube::Client;
use safe_termination::crd::{TerminationPolicy, TerminationPolicySpec};
use safe_termination::exposition::parse_kube_proxy_metrics;
use safe_termination::controller::cluster::ClusterIndex;
use safe_termination::controller::reconcile::{Context, Settings, reconcile};
use safe_termination::sources::proxyconfig::ResolvedProxyConfig;
use safe_termination::measure::{MeasurementStore, Sample};
use safe_termination::controller::metrics::{ControllerMetrics, KubeProxyMetrics};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::watch;

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    body: Value,
}

/// A fake API server: answers every request plausibly and records it.
fn fake_api() -> (Client, Arc<Mutex<Vec<Seen>>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            log.lock().unwrap().push(Seen { method: method.clone(), path: path.clone(), body: body.clone() });
            let answer = if path.ends_with("/pods") {
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []})
            } else if path.ends_with("/status") {
                let mut p = body.clone();
                p["metadata"] = json!({"name": "p", "namespace": "team-a"});
                p["spec"] = json!({});
                p
            } else {
                body.clone()
            };
            let status = if method == "POST" { 201 } else { 200 };
            send.send_response(Response::builder().status(status).body(Body::from(serde_json::to_vec(&answer).unwrap())).unwrap());
        }
    });
    (Client::new(svc, "default"), seen)
}

fn policy(name: &str, status: Option<Value>) -> TerminationPolicy {
    let mut p = TerminationPolicy::new(name, TerminationPolicySpec::default());
    p.metadata.namespace = Some("team-a".into());
    p.metadata.generation = Some(1);
    p.metadata.uid = Some(format!("uid-{name}"));
    if let Some(s) = status {
        p.status = Some(serde_json::from_value(s).unwrap());
    }
    p
}

fn slow_node_store() -> Arc<Mutex<MeasurementStore>> {
    let text = "\
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"1.024\"} 0
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"2.048\"} 100
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 100
kubeproxy_sync_proxy_rules_iptables_total{table=\"nat\"} 100
";
    let mut store = MeasurementStore::new(600.0);
    store.record("node-a", Sample { at_unix_seconds: 1_800_000_000.0, scrape: parse_kube_proxy_metrics(text).unwrap(), proxy_mode: None });
    Arc::new(Mutex::new(store))
}

fn context(client: Client, leader: bool, others: &[TerminationPolicy]) -> (Arc<Context>, watch::Sender<bool>) {
    let (tx, rx) = watch::channel(leader);
    let mut writer: Writer<TerminationPolicy> = Writer::default();
    for p in others {
        writer.apply_watcher_event(&watcher::Event::Apply(p.clone()));
    }
    let ctx = Context {
        client: client.clone(),
        store: slow_node_store(),
        cluster: Arc::new(ClusterIndex::default()),
        proxy: Arc::new(RwLock::new(ResolvedProxyConfig::default())),
        leader: rx,
        recorder: Recorder::new(client, Reporter { controller: "safe-termination".into(), instance: Some("test".into()) }),
        settings: Settings::default(),
        metrics: ControllerMetrics::default(),
        kube_proxy_metrics: KubeProxyMetrics::default(),
        policies: writer.as_reader(),
        analyses: Default::default(),
    };
    (Arc::new(ctx), tx)
}

fn status_patches(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter().filter(|s| s.method == "PATCH" && s.path.ends_with("/terminationpolicies/p/status")).collect()
}

fn events(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter().filter(|s| s.path.contains("/events")).collect()
}

#[tokio::test]
async fn a_new_policy_gets_its_status_written_once_with_events_for_problems() {
    let (client, seen) = fake_api();
    let p = policy("p", None);
    let (ctx, _tx) = context(client, true, std::slice::from_ref(&p));
    reconcile(Arc::new(p), ctx).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let patches = status_patches(&seen);
    assert_eq!(patches.len(), 1, "one status write: {seen:#?}");
    let status = &patches[0].body["status"];
    // 1 s minSyncPeriod + 2 x p99 (1.024 + 1.024 x 0.99 = 2.03776) = 5.07552 s; x 1.5 = 7.61 -> 8 s
    assert_eq!(status["recommendation"]["preStopSeconds"], 8);
    assert_eq!(status["recommendation"]["terminationGracePeriodSeconds"], 38);
    assert_eq!(status["measurement"]["worstNode"], "node-a");
    assert_eq!(status["measurement"]["syncP99Seconds"], 2.038);
    assert_eq!(status["observedGeneration"], 1);
    let cond = |t: &str| status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == t).cloned().unwrap();
    assert_eq!(cond("ProxySyncSlow")["status"], "True");
    assert_eq!(cond("Ready")["status"], "True");
    assert_eq!(cond("Conflict")["status"], "False");
    // events: Ready (Normal) and ProxySyncSlow (Warning), nothing for False conditions
    let ev = events(&seen);
    let reasons: Vec<&str> = ev.iter().map(|e| e.body["reason"].as_str().unwrap_or("")).collect();
    assert!(reasons.contains(&"ProxySyncSlow"), "{reasons:?}");
    assert!(reasons.contains(&"Ready"), "{reasons:?}");
    assert_eq!(reasons.len(), 2, "{reasons:?}");
}

#[tokio::test]
async fn an_unchanged_status_is_not_written_again_and_emits_no_event() {
    let (client, seen) = fake_api();
    let first = policy("p", None);
    let (ctx, _tx) = context(client.clone(), true, std::slice::from_ref(&first));
    reconcile(Arc::new(first), ctx.clone()).await.unwrap();
    let written = status_patches(&seen.lock().unwrap())[0].body["status"].clone();
    seen.lock().unwrap().clear();
    // the watch brings the written status back; reconcile again
    let second = policy("p", Some(written));
    reconcile(Arc::new(second), ctx).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(status_patches(&seen).is_empty(), "no second write: {seen:#?}");
    assert!(events(&seen).is_empty());
}

#[tokio::test]
async fn without_the_lease_nothing_is_written() {
    let (client, seen) = fake_api();
    let p = policy("p", None);
    let (ctx, _tx) = context(client, false, std::slice::from_ref(&p));
    reconcile(Arc::new(p), ctx).await.unwrap();
    assert!(seen.lock().unwrap().is_empty(), "a follower sends no request at all");
}

#[tokio::test]
async fn policies_with_the_same_selector_are_reported_as_a_conflict() {
    let (client, seen) = fake_api();
    let p = policy("p", None);
    let other = policy("a-first", None);
    let (ctx, _tx) = context(client, true, &[p.clone(), other]);
    reconcile(Arc::new(p), ctx).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let status = &status_patches(&seen)[0].body["status"];
    let c = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Conflict").unwrap();
    assert_eq!(c["status"], "True");
    assert!(c["message"].as_str().unwrap().contains("a-first wins"), "{c}");
}
