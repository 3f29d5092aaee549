//! The TerminationPolicy controller as a specification: each scenario lists, in order, the API
//! calls one reconcile must make, and the mocked API server (tower-test, the kube-rs
//! controller-rs fixtures pattern) fails the test on a call out of order, an unexpected call,
//! or an expected call that never came.
//!
//! What it pins down: the status is written once per change (and not again when nothing
//! changed), Events are published on condition transitions only, nothing is written without
//! the lease (also when the lease is lost during a reconcile), and conflicts: policies with the
//! same selector are reported, and an API conflict (409) on the status write is an error with
//! no Event.

use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use safe_termination::controller::metrics::{ControllerMetrics, KubeProxyMetrics};
use safe_termination::controller::reconcile::{Context, ControllerSettings, reconcile};
use safe_termination::controller::service_index::ClusterIndex;
use safe_termination::core::crd::{TerminationPolicy, TerminationPolicySpec};
use safe_termination::core::exposition::parse_kube_proxy_metrics;
use safe_termination::core::measure::{MeasurementStore, Sample};
use safe_termination::core::proxyconfig::ResolvedProxyConfig;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

type ApiServerHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

const NS: &str = "team-a";
const PODS: &str = "/api/v1/namespaces/team-a/pods";
const STATUS: &str = "/apis/safetermination.io/v1alpha1/namespaces/team-a/terminationpolicies/p/status";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";

/// The API server side of a scenario: each method expects the next request to be one call,
/// checks it and answers it.
struct ApiServerVerifier(ApiServerHandle);

/// A request as the verifier saw it: its JSON body, and where to send the answer.
struct Call {
    body: Value,
    send: tower_test::mock::SendResponse<Response<Body>>,
}

impl ApiServerVerifier {
    /// The next request, which must be `method path`; a missing one fails after 5 s.
    async fn expect(&mut self, method: &str, path: &str) -> Call {
        let next = tokio::time::timeout(Duration::from_secs(5), self.0.next_request()).await;
        let (req, send) = match next {
            Ok(Some(r)) => r,
            Ok(None) => panic!("expected {method} {path}, but the controller made no further call"),
            Err(_) => panic!("expected {method} {path}, but no call came within 5 s"),
        };
        let (m, p) = (req.method().to_string(), req.uri().path().to_string());
        let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert_eq!((m.as_str(), p.as_str()), (method, path), "unexpected call, body {body:#}");
        Call { body, send }
    }

    /// `GET .../pods`: the policy's namespace has no pods.
    async fn list_pods(mut self) -> Self {
        let call = self.expect("GET", PODS).await;
        respond(call.send, StatusCode::OK, &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}));
        self
    }

    /// `PATCH .../terminationpolicies/p/status` (server-side apply); `check` reads the status
    /// written; the server echoes it back.
    async fn status_write(mut self, check: impl FnOnce(&Value)) -> Self {
        let call = self.expect("PATCH", STATUS).await;
        check(&call.body["status"]);
        let mut echo = call.body.clone();
        echo["metadata"] = json!({"name": "p", "namespace": NS});
        echo["spec"] = json!({});
        respond(call.send, StatusCode::OK, &echo);
        self
    }

    /// `PATCH .../status` answered with 409 Conflict.
    async fn status_write_conflict(mut self) -> Self {
        let call = self.expect("PATCH", STATUS).await;
        let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409,
            "message": "Operation cannot be fulfilled: the object has been modified"});
        respond(call.send, StatusCode::CONFLICT, &status);
        self
    }

    /// `POST .../events`: one Event of `type_` with `reason`.
    async fn event(mut self, type_: &str, reason: &str) -> Self {
        let call = self.expect("POST", EVENTS).await;
        assert_eq!((call.body["type"].as_str(), call.body["reason"].as_str()), (Some(type_), Some(reason)), "{:#}", call.body);
        let body = call.body.clone();
        respond(call.send, StatusCode::CREATED, &body);
        self
    }

    /// A leader's reconcile that writes: count the pods, write the status (`check` reads it),
    /// publish `events` (type, reason) in this order, and nothing else.
    async fn writes(self, check: impl FnOnce(&Value), events: &[(&str, &str)]) {
        let mut api = self.list_pods().await.status_write(check).await;
        for (type_, reason) in events {
            api = api.event(type_, reason).await;
        }
        api.done().await
    }

    /// No call at all until the controller lets go of its client.
    async fn done(mut self) {
        if let Ok(Some((req, _))) = tokio::time::timeout(Duration::from_secs(5), self.0.next_request()).await {
            panic!("unexpected call {} {}", req.method(), req.uri().path());
        }
    }
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, status: StatusCode, body: &Value) {
    send.send_response(Response::builder().status(status).body(Body::from(serde_json::to_vec(body).unwrap())).unwrap());
}

fn policy(name: &str, status: Option<Value>) -> TerminationPolicy {
    let mut p = TerminationPolicy::new(name, TerminationPolicySpec::default());
    p.metadata.namespace = Some(NS.into());
    p.metadata.generation = Some(1);
    p.metadata.uid = Some(format!("uid-{name}"));
    if let Some(s) = status {
        p.status = Some(serde_json::from_value(s).unwrap());
    }
    p
}

/// One node whose 100 syncs took 1.024 to 2.048 s (slow, above the 1 s threshold), or 0.064
/// to 0.128 s (fast).
fn store(slow: bool) -> MeasurementStore {
    let (lo, hi) = if slow { ("1.024", "2.048") } else { ("0.064", "0.128") };
    let text = format!(
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"{lo}\"}} 0\n\
         kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"{hi}\"}} 100\n\
         kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"+Inf\"}} 100\n\
         kubeproxy_sync_proxy_rules_iptables_total{{table=\"nat\"}} 100\n"
    );
    let mut store = MeasurementStore::new(600.0);
    store.record("node-a", Sample { at_unix_seconds: 1_800_000_000.0, scrape: parse_kube_proxy_metrics(&text).unwrap(), proxy_mode: None });
    store
}

/// A controller context on a mocked API server, leading or not, with `all` as the reflector's
/// policies; the verifier plays the API server.
fn context(leader: bool, all: &[TerminationPolicy]) -> (Arc<Context>, ApiServerVerifier, watch::Sender<bool>) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let (tx, rx) = watch::channel(leader);
    let mut writer: Writer<TerminationPolicy> = Writer::default();
    for p in all {
        writer.apply_watcher_event(&watcher::Event::Apply(p.clone()));
    }
    let ctx = Context {
        client: client.clone(),
        store: Arc::new(Mutex::new(store(true))),
        cluster: Arc::new(ClusterIndex::default()),
        proxy: Arc::new(RwLock::new(ResolvedProxyConfig::default())),
        leader: rx,
        recorder: Recorder::new(client, Reporter { controller: "safe-termination".into(), instance: Some("test".into()) }),
        settings: ControllerSettings::default(),
        metrics: ControllerMetrics::default(),
        kube_proxy_metrics: KubeProxyMetrics::default(),
        policies: writer.as_reader(),
        analyses: Default::default(),
    };
    (Arc::new(ctx), ApiServerVerifier(handle), tx)
}

/// Runs `scenario` as the API server while `policy` is reconciled once; then the controller
/// lets go of its client (`ctx` is dropped) and the scenario must have seen every call.
async fn reconcile_against(policy: TerminationPolicy, ctx: Arc<Context>, scenario: impl Future<Output = ()> + Send + 'static) -> Result<(), String> {
    let server: JoinHandle<()> = tokio::spawn(scenario);
    let result = reconcile(Arc::new(policy), ctx).await.map(|_| ()).map_err(|e| e.to_string());
    tokio::time::timeout(Duration::from_secs(10), server).await.expect("the scenario ends").expect("the scenario holds");
    result
}

fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == type_).cloned().unwrap_or(Value::Null)
}

/// The Events of a policy's first status on the slow node, in condition order: Ready
/// (Normal), then ProxySyncSlow (Warning); the conditions that start False raise none.
const FIRST_EVENTS: &[(&str, &str)] = &[("Normal", "Ready"), ("Warning", "ProxySyncSlow")];

/// The status a first reconcile writes for policy `p` (leading, slow node), for the next
/// scenario's starting point.
async fn first_status() -> Value {
    let p = policy("p", None);
    let (ctx, api, _tx) = context(true, std::slice::from_ref(&p));
    let written = Arc::new(Mutex::new(Value::Null));
    let keep = written.clone();
    let scenario = api.writes(move |s| *keep.lock().unwrap() = s.clone(), FIRST_EVENTS);
    reconcile_against(p, ctx, scenario).await.unwrap();
    written.lock().unwrap().clone()
}

#[tokio::test]
async fn a_new_policy_gets_one_status_write_then_one_event_per_condition_that_turned_true() {
    let p = policy("p", None);
    let (ctx, api, _tx) = context(true, std::slice::from_ref(&p));
    let check = |status: &Value| {
        // W = the window p99 of 100 syncs in (1.024, 2.048] with minSyncPeriod 1 s = 4.5512 s
        // (an independent implementation of the model); x 1.25 = 5.689 -> 6 s
        assert_eq!(status["recommendation"]["preStopSeconds"], 6);
        assert_eq!(status["recommendation"]["terminationGracePeriodSeconds"], 36);
        assert_eq!(status["measurement"]["propagationWindowSeconds"], 4.551);
        assert_eq!(status["measurement"]["worstNode"], "node-a");
        assert_eq!(status["measurement"]["syncP99Seconds"], 2.038);
        assert_eq!(status["observedGeneration"], 1);
        assert_eq!(condition(status, "Ready")["status"], "True");
        assert_eq!(condition(status, "ProxySyncSlow")["status"], "True");
        assert_eq!(condition(status, "Conflict")["status"], "False");
    };
    reconcile_against(p, ctx, api.writes(check, FIRST_EVENTS)).await.unwrap();
}

#[tokio::test]
async fn an_unchanged_status_is_not_written_again_and_raises_no_event() {
    let written = first_status().await;
    let p = policy("p", Some(written));
    let (ctx, api, _tx) = context(true, std::slice::from_ref(&p));
    let scenario = async move { api.list_pods().await.done().await };
    reconcile_against(p, ctx, scenario).await.unwrap();
}

#[tokio::test]
async fn a_changed_status_without_a_transition_is_written_once_with_no_event() {
    let written = first_status().await;
    let mut p = policy("p", Some(written));
    p.metadata.generation = Some(2); // a spec edit: observedGeneration changes, no condition does
    let (ctx, api, _tx) = context(true, std::slice::from_ref(&p));
    let scenario = api.writes(|s| assert_eq!(s["observedGeneration"], 2), &[]);
    reconcile_against(p, ctx, scenario).await.unwrap();
}

#[tokio::test]
async fn a_transition_is_written_once_with_one_event_for_it() {
    let written = first_status().await;
    let p = policy("p", Some(written));
    let (ctx, api, _tx) = context(true, std::slice::from_ref(&p));
    *ctx.store.lock().unwrap() = store(false); // the node got fast
    let check = |s: &Value| {
        assert_eq!(condition(s, "ProxySyncSlow")["status"], "False");
        assert_eq!(condition(s, "Ready")["status"], "True");
    };
    let scenario = api.writes(check, &[("Normal", "ProxySyncSlowResolved")]);
    reconcile_against(p, ctx, scenario).await.unwrap();
}

#[tokio::test]
async fn without_the_lease_no_call_is_made() {
    let p = policy("p", None);
    let (ctx, api, _tx) = context(false, std::slice::from_ref(&p));
    reconcile_against(p, ctx, api.done()).await.unwrap();
}

#[tokio::test]
async fn a_lease_lost_during_the_reconcile_stops_the_write() {
    let p = policy("p", None);
    let (ctx, mut api, tx) = context(true, std::slice::from_ref(&p));
    let scenario = async move {
        // the lease is lost while the pods are being counted
        let call = api.expect("GET", PODS).await;
        tx.send_replace(false);
        respond(call.send, StatusCode::OK, &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}));
        api.done().await
    };
    reconcile_against(p, ctx, scenario).await.unwrap();
}

#[tokio::test]
async fn policies_with_the_same_selector_are_reported_as_a_conflict() {
    let p = policy("p", None);
    let other = policy("a-first", None);
    let (ctx, api, _tx) = context(true, &[p.clone(), other]);
    let check = |s: &Value| {
        let c = condition(s, "Conflict");
        assert_eq!(c["status"], "True");
        assert!(c["message"].as_str().unwrap().contains("a-first wins"), "{c}");
    };
    let scenario = api.writes(check, &[("Normal", "Ready"), ("Warning", "ProxySyncSlow"), ("Warning", "Conflict")]);
    reconcile_against(p, ctx, scenario).await.unwrap();
}

#[tokio::test]
async fn a_conflict_answer_to_the_status_write_is_an_error_and_raises_no_event() {
    let p = policy("p", None);
    let (ctx, api, _tx) = context(true, std::slice::from_ref(&p));
    let scenario = async move { api.list_pods().await.status_write_conflict().await.done().await };
    let err = reconcile_against(p, ctx, scenario).await.unwrap_err();
    assert!(err.contains("409") || err.contains("modified"), "{err}");
}
