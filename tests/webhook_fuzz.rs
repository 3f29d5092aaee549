//! Fuzzing the admission path with proptest: every generated body goes through
//! `safe_termination::webhook::review` (what the HTTPS server calls), 100,000+ inputs per run:
//!
//! | generator | cases |
//! |---|---|
//! | random bytes | 30,000 |
//! | random JSON (some wrapped in an AdmissionReview envelope) | 20,000 |
//! | the shared AdmissionReview with fields deleted, replaced or retyped | 30,000 |
//! | generated pods (containers, lifecycles, grace, restartPolicy, opt-outs, OS) in generated reviews, under four plans | 20,000 |
//!
//! Properties: `review` never panics; the status is 200 or 400; a decodable review (review.rs's
//! documented request contract, which accepts everything kube-core's AdmissionReview v1 decodes
//! with a uid: checked on every input) gets 200, its uid echoed and `allowed: true`, and an
//! undecodable one gets 400 with a message; no internal error (fail-open) occurs; warnings
//! are at most 120 characters; a patch is base64 JSONPatch that applies cleanly to
//! `request.object`; and reviewing the patched pod again gives no patch (R11).

use base64::Engine as _;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use safe_termination::core::mutate::mutate_pod;
use safe_termination::core::plan::Plan;
use safe_termination::core::selector::{AssumeServiceBacked, Labels, ServiceIndex, StaticServiceIndex};
use safe_termination::webhook::review;
use serde_json::{Map, Value, json};
use std::sync::OnceLock;

const CASE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/admission/admissionreview-pod-create.json");

fn config(cases: u32) -> Config {
    Config { cases, failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))), ..Config::default() }
}

fn case() -> &'static Value {
    static CASE_VALUE: OnceLock<Value> = OnceLock::new();
    CASE_VALUE.get_or_init(|| serde_json::from_slice(&std::fs::read(CASE).unwrap()).unwrap())
}

/// Every JSON pointer in the shared case (the root excluded).
fn case_pointers() -> &'static [String] {
    static POINTERS: OnceLock<Vec<String>> = OnceLock::new();
    POINTERS.get_or_init(|| {
        fn walk(v: &Value, at: String, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    for (k, c) in m {
                        let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                        out.push(p.clone());
                        walk(c, p, out);
                    }
                }
                Value::Array(a) => {
                    for (i, c) in a.iter().enumerate() {
                        let p = format!("{at}/{i}");
                        out.push(p.clone());
                        walk(c, p, out);
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        walk(case(), String::new(), &mut out);
        out
    })
}

/// The fuzz targets' four plans (fuzz/checks.rs `plans`, included here): the default (native
/// sleep, 10 s); no native sleep with an exec allow-list and scope AllLongRunning; Audit; a sleep
/// above the grace cap.
#[path = "../fuzz/checks.rs"]
mod checks;
use checks::plans;

fn services() -> StaticServiceIndex {
    let mut sel = Labels::new();
    sel.insert("app".into(), "web".into());
    StaticServiceIndex { services: vec![("default".into(), sel.clone()), ("team".into(), sel)] }
}

/// kube-core's own types accept it as an AdmissionReview v1 request with a non-empty uid (and
/// the envelope names admission.k8s.io/v1 AdmissionReview).
fn kube_decodable(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    if v.get("kind")?.as_str()? != "AdmissionReview" || v.get("apiVersion")?.as_str()? != "admission.k8s.io/v1" {
        return None;
    }
    // kube-core's derived Deserialize also takes `kind`/`resource` written as an array and
    // ignores elements past the third (["CREATE","CREATE","CREATE","CREATE"] decodes): a serde
    // quirk no API server sends; the contract takes exactly three strings
    let arity_ok = |f: &str| v.get("request").and_then(|r| r.get(f)).and_then(Value::as_array).is_none_or(|a| a.len() == 3);
    if !(arity_ok("kind") && arity_ok("resource")) {
        return None;
    }
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(v).ok()?;
    let req: AdmissionRequest<DynamicObject> = review.try_into().ok()?;
    (!req.uid.is_empty()).then_some(req.uid)
}

use checks::decodable;

/// Runs one body through `review` and checks every property. Returns the patched pod when a
/// patch was sent.
fn check(body: &[u8], plan: &Plan, services: &dyn ServiceIndex) -> Result<Option<Value>, TestCaseError> {
    let out = review(body, plan, services);
    prop_assert!(!out.fail_open, "internal error (fail open) for {}", String::from_utf8_lossy(body));
    // never stricter than the Kubernetes client types: what kube-core decodes is answered 200
    if let Some(uid) = kube_decodable(body) {
        prop_assert_eq!(decodable(body), Some(uid), "kube-core decodes it, the contract does not: {}", String::from_utf8_lossy(body));
    }
    match decodable(body) {
        None => {
            prop_assert_eq!(out.status, 400, "undecodable body answered {}: {}", out.status, String::from_utf8_lossy(body));
            prop_assert!(String::from_utf8_lossy(&out.body).starts_with("bad AdmissionReview: "));
            Ok(None)
        }
        Some(uid) => {
            prop_assert_eq!(out.status, 200, "decodable review answered {}: {}", out.status, String::from_utf8_lossy(&out.body));
            let resp: Value = serde_json::from_slice(&out.body).map_err(|e| TestCaseError::fail(format!("response is not JSON: {e}")))?;
            prop_assert_eq!(resp["apiVersion"].as_str(), Some("admission.k8s.io/v1"));
            prop_assert_eq!(resp["kind"].as_str(), Some("AdmissionReview"));
            let r = &resp["response"];
            prop_assert_eq!(r["uid"].as_str(), Some(uid.as_str()));
            prop_assert_eq!(&out.uid, &uid);
            prop_assert_eq!(r["allowed"].as_bool(), Some(true));
            // the decision on the pruned parse (parse_review) is the decision on the whole pod
            let request: Value = serde_json::from_slice(body).unwrap();
            let q = &request["request"];
            let whole = (q["resource"]["group"] == ""
                && q["resource"]["version"] == "v1"
                && q["resource"]["resource"] == "pods"
                && q["operation"] == "CREATE"
                && q["subResource"].as_str().unwrap_or("").is_empty()
                && q["object"].is_object())
            .then(|| mutate_pod(&q["object"], q["namespace"].as_str().unwrap_or(""), plan, services));
            let sent: Vec<json_patch::PatchOperation> = match r.get("patch").and_then(Value::as_str) {
                Some(p) => serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(p).unwrap_or_default()).unwrap_or_default(),
                None => Vec::new(),
            };
            prop_assert_eq!(&sent, &whole.as_ref().map(|d| d.patch.0.clone()).unwrap_or_default(), "pruned and whole decisions differ");
            for w in r["warnings"].as_array().into_iter().flatten() {
                let w = w.as_str().unwrap_or("");
                prop_assert!(w.chars().count() <= 120, "warning over 120 characters: {w}");
            }
            let Some(patch) = r.get("patch") else {
                prop_assert_eq!(out.patch_ops, 0);
                return Ok(None);
            };
            prop_assert_eq!(r["patchType"].as_str(), Some("JSONPatch"));
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(patch.as_str().unwrap_or("-"))
                .map_err(|e| TestCaseError::fail(format!("patch is not base64: {e}")))?;
            let ops: json_patch::Patch = serde_json::from_slice(&bytes).map_err(|e| TestCaseError::fail(format!("patch is not a JSON Patch: {e}")))?;
            prop_assert_eq!(ops.0.len(), out.patch_ops);
            let request: Value = serde_json::from_slice(body).unwrap();
            let mut pod = request["request"]["object"].clone();
            json_patch::patch(&mut pod, &ops.0)
                .map_err(|e| TestCaseError::fail(format!("patch does not apply: {e}\npatch {ops:?}\nobject {}", request["request"]["object"])))?;
            Ok(Some(pod))
        }
    }
}

/// `check`, then R11: the patched pod reviewed again yields no patch.
fn check_idempotent(review_doc: &Value, plan: &Plan, services: &dyn ServiceIndex) -> Result<(), TestCaseError> {
    let body = serde_json::to_vec(review_doc).unwrap();
    if let Some(patched) = check(&body, plan, services)? {
        let mut again = review_doc.clone();
        again["request"]["object"] = patched;
        let body2 = serde_json::to_vec(&again).unwrap();
        let out = review(&body2, plan, services);
        prop_assert_eq!(out.status, 200);
        prop_assert_eq!(out.patch_ops, 0, "not idempotent: second review patched {}", String::from_utf8_lossy(&out.body));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// generators

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "kind", "apiVersion", "request", "uid", "object", "operation", "resource", "group", "version",
            "namespace", "name", "metadata", "spec", "containers", "lifecycle", "preStop", "sleep", "seconds",
            "terminationGracePeriodSeconds", "annotations", "labels", "image", "subResource", "userInfo", "kind",
        ]).prop_map(String::from),
        1 => "[a-zA-Z~/]{0,8}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        prop::sample::select(vec!["CREATE", "v1", "pods", "Pod", "AdmissionReview", "admission.k8s.io/v1", "", "true"]).prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// One change to the shared case.
#[derive(Debug, Clone)]
enum Mutation {
    Delete(prop::sample::Index),
    Replace(prop::sample::Index, Value),
    /// Keeps the field, changes its JSON type (string <-> number, scalar -> array/object, ...).
    Retype(prop::sample::Index, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<prop::sample::Index>().prop_map(Mutation::Delete),
        (any::<prop::sample::Index>(), json_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, t)| Mutation::Retype(i, t)),
    ]
}

fn retype(v: &Value, t: u8) -> Value {
    match (t % 6, v) {
        (0, Value::String(s)) => s.parse::<i64>().map(Value::from).unwrap_or_else(|_| json!(s.len())),
        (0, other) => Value::String(other.to_string()),
        (1, other) => json!([other]),
        (2, other) => json!({ "value": other }),
        (3, _) => Value::Null,
        (4, _) => json!(-1),
        _ => json!(""),
    }
}

fn apply_mutation(doc: &mut Value, m: &Mutation) {
    let ptrs = case_pointers();
    let (Mutation::Delete(i) | Mutation::Replace(i, _) | Mutation::Retype(i, _)) = m;
    let ptr = &ptrs[i.index(ptrs.len())];
    let (parent, last) = ptr.rsplit_once('/').unwrap();
    let last = last.replace("~1", "/").replace("~0", "~");
    match m {
        Mutation::Delete(_) => match doc.pointer_mut(parent) {
            Some(Value::Object(o)) => {
                o.remove(&last);
            }
            Some(Value::Array(a)) => {
                if let Ok(n) = last.parse::<usize>()
                    && n < a.len()
                {
                    a.remove(n);
                }
            }
            _ => {}
        },
        Mutation::Replace(_, v) => {
            if let Some(slot) = doc.pointer_mut(ptr) {
                *slot = v.clone();
            }
        }
        Mutation::Retype(_, t) => {
            if let Some(slot) = doc.pointer_mut(ptr) {
                *slot = retype(slot, *t);
            }
        }
    }
}

fn maybe<T: std::fmt::Debug + Clone + 'static>(s: impl Strategy<Value = T> + 'static) -> impl Strategy<Value = Option<T>> {
    prop::option::weighted(0.6, s)
}

fn lifecycle() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        4 => Just(None),
        1 => (0i64..120).prop_map(|s| Some(json!({"preStop": {"sleep": {"seconds": s}}}))),
        1 => Just(Some(json!({"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 5"]}}}))),
        1 => Just(Some(json!({"preStop": {"httpGet": {"path": "/drain", "port": 8080}}}))),
        1 => Just(Some(json!({"postStart": {"exec": {"command": ["true"]}}}))),
        1 => Just(Some(json!({}))),
        1 => Just(Some(json!({"preStop": {}}))),
        1 => json_value().prop_map(Some),
    ]
}

fn container() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["app", "web", "istio-proxy", "linkerd-proxy", "sidecar", "a~b/c", "x"]),
        prop::sample::select(vec![
            "nginx",
            "busybox:1.36",
            "docker.io/library/busybox",
            "gcr.io/distroless/static",
            "mcr.microsoft.com/windows/servercore:ltsc2022",
            "",
        ]),
        lifecycle(),
        maybe(prop_oneof![Just(json!("Always")), Just(json!("Never")), json_value()]),
    )
        .prop_map(|(name, image, lifecycle, restart)| {
            let mut c = json!({"name": name, "image": image});
            if let Some(l) = lifecycle {
                c["lifecycle"] = l;
            }
            if let Some(r) = restart {
                c["restartPolicy"] = r;
            }
            c
        })
}

fn grace() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(json!(0))),
        2 => (1i64..700_000).prop_map(|g| Some(json!(g))),
        1 => Just(Some(json!(-5))),
        1 => Just(Some(json!("30"))),
        1 => Just(Some(Value::Null)),
        1 => Just(Some(json!(1.5))),
    ]
}

fn pod() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(prop_oneof![20 => container(), 1 => json_value()], 0..4),
        prop::collection::vec(container(), 0..2),
        grace(),
        maybe(prop::sample::select(vec!["Always", "Never", "OnFailure", "weird"])),
        maybe(prop::sample::select(vec!["linux", "windows"])),
        prop::collection::btree_map(
            prop::sample::select(vec![
                "safetermination.io/skip",
                "safetermination.io/skip-containers",
                "kubernetes.io/config.mirror",
                "safetermination.io/prestop-seconds",
                "other",
            ]),
            prop::sample::select(vec!["true", "false", "app", "web,sidecar", "10", ""]),
            0..3,
        ),
        prop::sample::select(vec!["web", "worker", ""]),
        0u8..8,
    )
        .prop_map(|(containers, inits, grace, restart, os, annotations, app, shape)| {
            let mut spec = Map::new();
            spec.insert("containers".into(), Value::Array(containers));
            if !inits.is_empty() {
                spec.insert("initContainers".into(), Value::Array(inits));
            }
            if let Some(g) = grace {
                spec.insert("terminationGracePeriodSeconds".into(), g);
            }
            if let Some(r) = restart {
                spec.insert("restartPolicy".into(), json!(r));
            }
            if let Some(os) = os {
                spec.insert("os".into(), json!({"name": os}));
            }
            let mut pod = json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": "fuzz-", "labels": {"app": app}, "annotations": annotations},
                "spec": spec,
            });
            match shape {
                0 => pod["spec"]["containers"] = json!("not a list"),
                1 => {
                    pod.as_object_mut().unwrap().remove("spec");
                }
                2 => pod["metadata"] = json!(null),
                _ => {}
            }
            pod
        })
}

fn admission(pod: Value, operation: &str, namespace: &str, resource: &str, sub: Option<&str>, uid: String) -> Value {
    let mut request = json!({
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": resource},
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "fuzz"},
        "object": pod,
        "oldObject": null,
        "dryRun": false,
    });
    if let Some(s) = sub {
        request["subResource"] = json!(s);
    }
    json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})
}

// ---------------------------------------------------------------------------------------------
// properties

proptest! {
    #![proptest_config(config(30_000))]
    #[test]
    fn random_bytes(body in prop::collection::vec(any::<u8>(), 0..256), plan in 0usize..4) {
        check(&body, &plans()[plan], &AssumeServiceBacked)?;
    }
}

proptest! {
    #![proptest_config(config(20_000))]
    #[test]
    fn random_json(v in json_value(), wrap in 0u8..3, plan in 0usize..4) {
        let doc = match wrap {
            0 => v,
            1 => json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": v}),
            _ => json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "u-1", "object": v, "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "Pod"}, "resource": {"group": "", "version": "v1", "resource": "pods"}}}),
        };
        check(&serde_json::to_vec(&doc).unwrap(), &plans()[plan], &AssumeServiceBacked)?;
    }
}

proptest! {
    #![proptest_config(config(30_000))]
    #[test]
    fn mutated_shared_case(mutations in prop::collection::vec(mutation(), 1..4), plan in 0usize..4) {
        let mut doc = case().clone();
        for m in &mutations {
            apply_mutation(&mut doc, m);
        }
        check_idempotent(&doc, &plans()[plan], &AssumeServiceBacked)?;
    }
}

proptest! {
    #![proptest_config(config(20_000))]
    #[test]
    fn generated_pods(
        pod in pod(),
        operation in prop::sample::select(vec!["CREATE", "CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT"]),
        namespace in prop::sample::select(vec!["default", "team", "kube-system", ""]),
        resource in prop::sample::select(vec!["pods", "pods", "pods", "deployments"]),
        sub in maybe(prop::sample::select(vec!["status", "ephemeralcontainers", ""])),
        uid in "[a-f0-9-]{1,36}",
        plan in 0usize..4,
        scoped in any::<bool>(),
    ) {
        let doc = admission(pod, operation, namespace, resource, sub, uid);
        let index = services();
        let services: &dyn ServiceIndex = if scoped { &index } else { &AssumeServiceBacked };
        check_idempotent(&doc, &plans()[plan], services)?;
    }
}

/// Found by the fuzzer (seed cc 5bfbd02c...): a `resource` of four strings. kube-core decodes
/// it (serde takes a struct as an array and ignores the extra element); the contract does not,
/// and the webhook answers 400 naming it (the API server then fails open), which the oracle
/// accepts.
#[test]
fn a_resource_array_of_four_strings_is_a_bad_request() {
    let mut doc = case().clone();
    doc["request"]["resource"] = json!(["CREATE", "CREATE", "CREATE", "CREATE"]);
    let body = serde_json::to_vec(&doc).unwrap();
    let kube: Result<AdmissionReview<DynamicObject>, _> = serde_json::from_value(doc.clone());
    assert!(
        kube.is_ok_and(|r| TryInto::<AdmissionRequest<DynamicObject>>::try_into(r).is_ok()),
        "kube-core no longer takes it: drop the arity rule in kube_decodable"
    );
    assert_eq!(kube_decodable(&body), None);
    assert_eq!(decodable(&body), None);
    let out = review(&body, &plans()[0], &AssumeServiceBacked);
    assert_eq!(out.status, 400, "{}", String::from_utf8_lossy(&out.body));
    check(&body, &plans()[0], &AssumeServiceBacked).unwrap();
}

#[test]
fn the_shared_case_itself_is_mutated() {
    let body = serde_json::to_vec(case()).unwrap();
    let out = review(&body, &plans()[0], &AssumeServiceBacked);
    assert_eq!((out.status, out.decision), (200, "mutated"));
    check_idempotent(case(), &plans()[0], &AssumeServiceBacked).unwrap();
}

/// The case the fuzzer found: `spec.containers: [null]`. The engine proposes an `add` under the
/// null element; `review` must not send a patch that cannot apply: it answers 200, allowed,
/// without it (fail open), and any patch it does send applies.
#[test]
fn a_null_container_never_gets_a_patch_that_cannot_apply() {
    let mut doc = case().clone();
    doc["request"]["object"]["spec"]["containers"] = json!([null]);
    let body = serde_json::to_vec(&doc).unwrap();
    let out = review(&body, &plans()[0], &AssumeServiceBacked);
    assert_eq!(out.status, 200);
    let resp: Value = serde_json::from_slice(&out.body).unwrap();
    assert_eq!(resp["response"]["allowed"], true);
    assert_eq!(resp["response"]["uid"], "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4");
    check(&body, &plans()[0], &AssumeServiceBacked).unwrap();
}
