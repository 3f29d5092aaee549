//! The webhook-free admission backend on the real API server (Kubernetes 1.36+: the pinned
//! current minor of `make e2e`): the MutatingAdmissionPolicy, binding and parameters the operator
//! writes ([`safe_termination::core::admission`]) against the webhook ([`safe_termination::webhook`]),
//! pod by pod, through server-side dry-run creates.
//!
//! Namespaces, each with the same TerminationPolicies:
//! - `e2e-adm-webhook`: mutated by the webhook (no Service: scope ServiceBacked skips);
//! - `e2e-adm-webhook-alr`: the webhook with every ServiceBacked policy read as AllLongRunning;
//! - `e2e-adm-policy`: mutated by the policy.
//!
//! and `e2e-adm-default-webhook` / `e2e-adm-default-policy` without policies (the cluster
//! default policy). The policy's result must equal the webhook's with ServiceBacked read as
//! AllLongRunning on every pod, and may differ from the plain webhook's only on pods whose
//! policy is ServiceBacked: the documented difference (`safe_termination::core::admission::policy::DIFFERENCES`), asserted as exactly
//! that (the webhook left the pod unchanged). Admission warnings (the other documented
//! difference) are not part of a created pod. Any other difference fails.
//!
//! Needs a running cluster (`make cluster-up`); built only with `--features cluster-tests`.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use safe_termination::core::admission::params::{TerminationParameters, parameters};
use safe_termination::core::admission::policy::PolicyObjects;
use safe_termination::core::crd::{EnforcementMode, GraceSpec, PreStopHandler, PreStopSpec, Scope, TerminationPolicySpec};
use safe_termination::core::plan::{Capabilities, Plan, PlanPolicy};
use safe_termination::core::selector::{Labels, StaticServiceIndex};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
mod support;

const SYSTEM: &str = "e2e-adm-system";
const NS_WEBHOOK: &str = "e2e-adm-webhook";
const NS_WEBHOOK_ALR: &str = "e2e-adm-webhook-alr";
const NS_POLICY: &str = "e2e-adm-policy";
const NS_DEFAULT_WEBHOOK: &str = "e2e-adm-default-webhook";
const NS_DEFAULT_POLICY: &str = "e2e-adm-default-policy";
/// Neither backend: the pod as the API server stores it unmutated (defaults applied).
const NS_NONE: &str = "e2e-adm-none";
const NAME: &str = "e2e-adm";
/// Generated pods (the issue asks for at least 1,000).
const GENERATED: usize = 1000;

fn labels(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector { match_labels: Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()), match_expressions: None })
}

fn expr(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

/// The policies of every test namespace: each mode, handler, scope and selector operator, and
/// precedence ties (`tier` and `web` both specificity 1: `tier` wins by name).
fn policies() -> Vec<(&'static str, TerminationPolicySpec, u32)> {
    let base = TerminationPolicySpec { scope: Scope::AllLongRunning, ..TerminationPolicySpec::default() };
    vec![
        (
            "web",
            TerminationPolicySpec { pod_selector: labels(&[("app", "web")]), grace: GraceSpec { app_shutdown_seconds: 20, max_seconds: 40 }, ..base.clone() },
            7,
        ),
        ("tier", TerminationPolicySpec { pod_selector: labels(&[("tier", "fe")]), ..base.clone() }, 6),
        ("audit", TerminationPolicySpec { pod_selector: labels(&[("mode", "audit")]), mode: EnforcementMode::Audit, ..base.clone() }, 9),
        ("off", TerminationPolicySpec { pod_selector: labels(&[("mode", "off")]), mode: EnforcementMode::Disabled, ..base.clone() }, 8),
        ("zero", TerminationPolicySpec { pod_selector: labels(&[("mode", "zero")]), ..base.clone() }, 0),
        (
            "exec",
            TerminationPolicySpec {
                pod_selector: Some(LabelSelector { match_labels: None, match_expressions: Some(vec![expr("handler", "In", &["exec"])]) }),
                pre_stop: PreStopSpec {
                    handler: PreStopHandler::Exec,
                    exec_images: vec!["docker.io/library/nginx*".into(), "busybox:1.36".into()],
                    ..PreStopSpec::default()
                },
                ..base.clone()
            },
            5,
        ),
        (
            "notin",
            TerminationPolicySpec {
                pod_selector: Some(LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![expr("app", "Exists", &[]), expr("tier", "NotIn", &["batch", "fe"]), expr("legacy", "DoesNotExist", &[])]),
                }),
                grace: GraceSpec { app_shutdown_seconds: 0, max_seconds: 1 },
                ..base.clone()
            },
            4,
        ),
        ("svc", TerminationPolicySpec { pod_selector: labels(&[("scope", "svc")]), scope: Scope::ServiceBacked, ..base.clone() }, 11),
        // grace.maxSeconds below the sleep: a current grace between them must still be raised to
        // the sleep (R3)
        (
            "long",
            TerminationPolicySpec {
                pod_selector: labels(&[("tier", "batch")]),
                grace: GraceSpec { app_shutdown_seconds: 30, max_seconds: 20 },
                ..base.clone()
            },
            45,
        ),
        ("all", base.clone(), 10),
    ]
}

fn plan_policy(ns: &str, name: &str, spec: &TerminationPolicySpec, pre_stop: u32, all_long_running: bool) -> PlanPolicy {
    let mut spec = spec.clone();
    if all_long_running {
        spec.scope = Scope::AllLongRunning;
    }
    PlanPolicy { namespace: ns.into(), name: name.into(), spec, pre_stop_seconds: pre_stop }
}

/// One plan for every test namespace; the cluster default policy for the default namespaces.
fn plan() -> Plan {
    let mut out = Vec::new();
    for (ns, alr) in [(NS_WEBHOOK, false), (NS_WEBHOOK_ALR, true), (NS_POLICY, false)] {
        for (name, spec, pre_stop) in policies() {
            out.push(plan_policy(ns, name, &spec, pre_stop, alr));
        }
    }
    let default_spec = TerminationPolicySpec { scope: Scope::AllLongRunning, pod_selector: labels(&[("app", "web")]), ..TerminationPolicySpec::default() };
    Plan {
        policies: out,
        default_policy: Some(plan_policy(SYSTEM, "cluster-default", &default_spec, 12, false)),
        capabilities: Capabilities { native_sleep: true },
        wait: Default::default(),
    }
}

/// What a backend decides, from a dry-run create: the container and init container lifecycles,
/// the grace period and the annotations (the policy annotation's namespace replaced by `NS`),
/// or the API server's refusal code.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Created { lifecycles: Vec<Value>, init_lifecycles: Vec<Value>, grace: Option<i64>, annotations: BTreeMap<String, String> },
    Rejected(u16),
}

fn outcome(result: Result<Pod, kube::Error>, ns: &str) -> Outcome {
    match result {
        Ok(pod) => {
            let v = serde_json::to_value(&pod).unwrap();
            outcome_of(&v, ns)
        }
        Err(kube::Error::Api(e)) => Outcome::Rejected(e.code),
        Err(e) => panic!("dry-run create in {ns} failed without an API answer: {e}"),
    }
}

fn outcome_of(v: &Value, ns: &str) -> Outcome {
    let lifecycles = |key: &str| -> Vec<Value> {
        v.pointer(&format!("/spec/{key}"))
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|c| c.get("lifecycle").cloned().unwrap_or(Value::Null)).collect())
            .unwrap_or_default()
    };
    let annotations = v
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let v = v.as_str().unwrap_or_default();
                    let v = if k == "safetermination.io/policy" { v.replacen(&format!("{ns}/"), "NS/", 1) } else { v.to_string() };
                    (k.clone(), v)
                })
                .collect()
        })
        .unwrap_or_default();
    Outcome::Created {
        lifecycles: lifecycles("containers"),
        init_lifecycles: lifecycles("initContainers"),
        grace: v.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64),
        annotations,
    }
}

async fn dry_run(client: &Client, ns: &str, pod: &Value) -> Outcome {
    let mut pod = pod.clone();
    pod["metadata"]["namespace"] = json!(ns);
    let typed: Pod = match serde_json::from_value(pod) {
        Ok(p) => p,
        Err(e) => panic!("a generated pod does not decode as a Pod: {e}"),
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    outcome(api.create(&PostParams { dry_run: true, ..Default::default() }, &typed).await, ns)
}

fn pod_labels(pod: &Value) -> Labels {
    pod.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect())
        .unwrap_or_default()
}

fn generated_pods(n: usize) -> Vec<Value> {
    // deterministic: the same 1,000 pods every run (a failure names the pod's index)
    let mut runner = TestRunner::deterministic();
    let strategy = support::pods::valid_pod();
    (0..n)
        .map(|i| {
            let mut pod = strategy.new_tree(&mut runner).expect("generate a pod").current();
            pod["metadata"]["name"] = json!(format!("gen-{i}"));
            pod
        })
        .collect()
}

/// Waits until the API server mutates a probe pod in `ns` (the policy's objects and parameters
/// reach its admission plugin through informers).
async fn wait_until_mutated(client: &Client, ns: &str, what: &str) {
    let probe = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "wait-for-admission", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    });
    common::wait_for(&format!("{what} to mutate a pod in {ns}"), 60, async || match dry_run(client, ns, &probe).await {
        Outcome::Created { lifecycles, .. } => lifecycles.first().is_some_and(|l| !l.is_null()).then_some(()),
        _ => None,
    })
    .await;
}

/// Applies the policy, binding and parameters for `plan`, bound to the `namespaces`.
async fn apply_policy_backend(client: &Client, plan: &Plan, namespaces: &[&str]) -> PolicyObjects {
    let objects = PolicyObjects {
        name: NAME.into(),
        params_namespace: SYSTEM.into(),
        namespace_selector: json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}),
        owner: None,
    };
    let metrics = safe_termination::controller::admission::AdmissionMetrics::default();
    safe_termination::controller::admission::apply_policy(client, &objects, &metrics).await.expect("apply the MutatingAdmissionPolicy and binding");
    safe_termination::controller::admission::apply_parameters(client, &objects, &parameters(plan), &metrics).await.expect("apply the parameters");
    objects
}

async fn remove_policy_backend(client: &Client) {
    safe_termination::controller::admission::remove_policy(client, NAME).await.expect("remove the policy");
    let _ = Api::<TerminationParameters>::namespaced(client.clone(), SYSTEM).delete(NAME, &DeleteParams::default()).await;
}

#[tokio::test]
async fn the_policy_backend_equals_the_webhook_on_every_case_and_1000_generated_pods() {
    let client = common::client().await;
    common::apply_crd(&client).await;
    for ns in [SYSTEM, NS_WEBHOOK, NS_WEBHOOK_ALR, NS_POLICY, NS_DEFAULT_WEBHOOK, NS_DEFAULT_POLICY, NS_NONE] {
        common::own_namespace(&client, ns).await;
    }
    let plan = plan();
    // no Service anywhere: the webhook's ServiceBacked policies skip every pod
    let hook = common::start_webhook_with(plan.clone(), Arc::new(StaticServiceIndex::default()));
    for ns in [NS_WEBHOOK, NS_WEBHOOK_ALR, NS_DEFAULT_WEBHOOK] {
        common::register_webhook(&client, &format!("{NAME}-{ns}"), ns, hook.port).await;
    }
    apply_policy_backend(&client, &plan, &[NS_POLICY, NS_DEFAULT_POLICY]).await;
    for (ns, what) in [(NS_WEBHOOK, "the webhook"), (NS_DEFAULT_WEBHOOK, "the webhook"), (NS_POLICY, "the policy"), (NS_DEFAULT_POLICY, "the policy")] {
        wait_until_mutated(&client, ns, what).await;
    }

    // the shared cases (tests/data/pods), then the generated pods
    let mut pods: Vec<(String, Value)> = Vec::new();
    let mut files: Vec<String> = std::fs::read_dir("tests/data/pods").unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    for file in &files {
        for ns in [NS_WEBHOOK, NS_WEBHOOK_ALR, NS_POLICY, NS_DEFAULT_WEBHOOK, NS_DEFAULT_POLICY, NS_NONE] {
            // service accounts the templates name, in every namespace
            let _ = common::creatable_pods(&client, file, ns).await;
        }
        for (name, pod) in common::creatable_pods(&client, file, NS_WEBHOOK).await {
            pods.push((format!("{file}: {name}"), pod));
        }
    }
    let cases = pods.len();
    assert!(cases >= 16, "only {cases} pod templates from the shared cases");
    pods.extend(generated_pods(GENERATED).into_iter().enumerate().map(|(i, p)| (format!("generated pod {i}"), p)));

    let started = Instant::now();
    let results: Vec<(String, Value, [Outcome; 6])> = futures::stream::iter(pods)
        .map(|(what, pod)| {
            let client = client.clone();
            async move {
                let outcomes = [
                    dry_run(&client, NS_WEBHOOK, &pod).await,
                    dry_run(&client, NS_WEBHOOK_ALR, &pod).await,
                    dry_run(&client, NS_POLICY, &pod).await,
                    dry_run(&client, NS_DEFAULT_WEBHOOK, &pod).await,
                    dry_run(&client, NS_DEFAULT_POLICY, &pod).await,
                    dry_run(&client, NS_NONE, &pod).await,
                ];
                (what, pod, outcomes)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let elapsed = started.elapsed();

    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for (what, pod, [webhook, webhook_alr, policy, default_webhook, default_policy, input]) in &results {
        if policy != webhook_alr {
            failures.push(format!("{what}: the policy gave\n  {policy:?}\nthe webhook (ServiceBacked as AllLongRunning) gave\n  {webhook_alr:?}\npod: {pod}"));
        }
        if default_policy != default_webhook {
            failures.push(format!("{what} (default policy): the policy gave\n  {default_policy:?}\nthe webhook gave\n  {default_webhook:?}\npod: {pod}"));
        }
        if webhook != policy {
            // the one documented difference: a ServiceBacked policy that no Service satisfies
            let resolved = plan.resolve(NS_WEBHOOK, &pod_labels(pod)).map(|r| r.policy.spec.scope);
            let unchanged = match (webhook, input) {
                (
                    Outcome::Created { lifecycles, init_lifecycles, annotations, .. },
                    Outcome::Created { lifecycles: l0, init_lifecycles: i0, annotations: a0, .. },
                ) => lifecycles == l0 && init_lifecycles == i0 && annotations == a0,
                _ => false,
            };
            if resolved == Some(Scope::ServiceBacked) && unchanged {
                *counts.entry("ServiceBacked difference (documented)").or_default() += 1;
            } else {
                failures.push(format!(
                    "{what}: an undocumented difference (policy scope {resolved:?}): the webhook gave\n  {webhook:?}\nthe policy gave\n  {policy:?}\npod: {pod}"
                ));
            }
        }
        for (label, o) in [("policy", policy), ("default policy", default_policy)] {
            match o {
                Outcome::Rejected(_) => *counts.entry("rejected by the API server (both backends)").or_default() += 1,
                Outcome::Created { lifecycles, annotations, .. } => {
                    let input_lifecycles = match input {
                        Outcome::Created { lifecycles, .. } => lifecycles.clone(),
                        Outcome::Rejected(_) => Vec::new(),
                    };
                    if lifecycles != &input_lifecycles {
                        *counts.entry(if label == "policy" { "hook injected (policy)" } else { "hook injected (default policy)" }).or_default() += 1;
                    }
                    if lifecycles.iter().any(|l| l.pointer("/preStop/exec/command/0") == Some(&json!("sleep"))) {
                        *counts.entry("exec sleep injected").or_default() += 1;
                    }
                    if annotations.contains_key("safetermination.io/audit-prestop-seconds")
                        && !matches!(input, Outcome::Created { annotations: a0, .. } if a0.contains_key("safetermination.io/audit-prestop-seconds"))
                    {
                        *counts.entry("audit annotated").or_default() += 1;
                    }
                }
            }
        }
    }
    println!(
        "differential: {} pods ({cases} from the shared cases, {GENERATED} generated), 6 dry-run creates each, in {:.1} s",
        results.len(),
        elapsed.as_secs_f64()
    );
    for (k, v) in &counts {
        println!("  {k}: {v}");
    }
    assert!(failures.is_empty(), "{} of {} pods differ:\n{}", failures.len(), results.len(), failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n\n"));
    // the comparison covered each rule: it cannot pass on pods nobody mutated
    for (k, at_least) in [
        ("hook injected (policy)", 200),
        ("hook injected (default policy)", 50),
        ("exec sleep injected", 10),
        ("audit annotated", 10),
        ("ServiceBacked difference (documented)", 10),
    ] {
        let n = counts.get(k).copied().unwrap_or(0);
        assert!(n >= at_least, "{k}: {n}, expected at least {at_least}: the generated pods do not exercise it");
    }

    hook.stop.cancel();
    remove_policy_backend(&client).await;
    for ns in [NS_WEBHOOK, NS_WEBHOOK_ALR, NS_DEFAULT_WEBHOOK] {
        common::cleanup(&client, &format!("{NAME}-{ns}"), ns).await;
    }
    for ns in [SYSTEM, NS_POLICY, NS_DEFAULT_POLICY, NS_NONE] {
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).delete(ns, &DeleteParams::default()).await;
    }
}

/// The operator with `--admission-backend auto` on Kubernetes 1.37: it writes the policy, says
/// `policy` in the status and the metric, the parameters follow a recommendation change within
/// one reconcile, and with the operator stopped new pods still get the last sized values.
#[tokio::test]
async fn the_operator_keeps_the_policy_at_the_measured_value_and_pods_keep_it_while_it_is_down() {
    let client = common::client().await;
    common::apply_crd(&client).await;
    let (system, ns, name) = ("e2e-adm-op-system", "e2e-adm-op", "e2e-adm-op");
    common::own_namespace(&client, system).await;
    common::own_namespace(&client, ns).await;
    let selector = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}}).to_string();
    let op =
        common::Operator::start(system, &["--admission-backend", "auto", "--admission-policy-name", name, "--admission-namespace-selector", &selector]).await;
    let metrics = op.metrics().await;
    assert_eq!(common::metric_sum(&metrics, "safe_termination_admission_backend", &["backend=\"policy\""]), Some(1.0), "auto on 1.37 is the policy");

    let policies: Api<safe_termination::core::crd::TerminationPolicy> = Api::namespaced(client.clone(), ns);
    let policy: safe_termination::core::crd::TerminationPolicy = serde_json::from_value(json!({
        "apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"scope": "AllLongRunning"}
    }))
    .unwrap();
    policies.create(&PostParams::default(), &policy).await.expect("create TerminationPolicy");
    let status = common::wait_policy_status(&client, ns, "web", 90, "a recommendation and the backend", |s| {
        s.pointer("/recommendation/preStopSeconds").is_some() && s.pointer("/admission/backend").is_some()
    })
    .await;
    assert_eq!(status.pointer("/admission/backend"), Some(&json!("policy")));
    assert_eq!(status.pointer("/admission/differences").and_then(Value::as_array).map(Vec::len), Some(1), "AllLongRunning: only the warnings difference");
    let first = status.pointer("/recommendation/preStopSeconds").and_then(Value::as_u64).unwrap();

    let params: Api<TerminationParameters> = Api::namespaced(client.clone(), system);
    let prestop_in_params = async || -> Option<u64> {
        let p = params.get_opt(name).await.ok()??;
        p.spec.namespaces.get(ns)?.first().map(|e| u64::from(e.pre_stop_seconds))
    };
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    });
    let injected = async |client: &Client| -> Option<i64> {
        match dry_run(client, ns, &pod).await {
            Outcome::Created { lifecycles, .. } => lifecycles.first().and_then(|l| l.pointer("/preStop/sleep/seconds")).and_then(Value::as_i64),
            Outcome::Rejected(_) => None,
        }
    };
    common::wait_for("the parameters to carry the first recommendation", 30, async || (prestop_in_params().await == Some(first)).then_some(())).await;
    common::wait_for("the policy to inject the first recommendation", 30, async || (injected(&client).await == Some(first as i64)).then_some(())).await;

    // the recommendation changes (the sleep's lower bound raised to 15 s): status, then
    // parameters, then pods
    let changed_at = Instant::now();
    policies
        .patch(
            "web",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(json!({
                "apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
                "metadata": {"name": "web", "namespace": ns},
                "spec": {"scope": "AllLongRunning", "preStop": {"minSeconds": 15, "defaultSeconds": 15}}
            })),
        )
        .await
        .expect("patch the policy");
    let status = common::wait_policy_status(&client, ns, "web", 60, "the new recommendation", |s| {
        s.pointer("/recommendation/preStopSeconds").and_then(Value::as_u64).is_some_and(|v| v != first)
    })
    .await;
    let status_after = changed_at.elapsed();
    let second = status.pointer("/recommendation/preStopSeconds").and_then(Value::as_u64).unwrap();
    common::wait_for("the parameters to follow the status", 10, async || (prestop_in_params().await == Some(second)).then_some(())).await;
    let params_after = changed_at.elapsed();
    common::wait_for("the policy to inject the new value", 30, async || (injected(&client).await == Some(second as i64)).then_some(())).await;
    let pods_after = changed_at.elapsed();
    println!(
        "recommendation {first} s -> {second} s: status after {:.1} s, parameters after {:.1} s, new pods after {:.1} s",
        status_after.as_secs_f64(),
        params_after.as_secs_f64(),
        pods_after.as_secs_f64()
    );
    assert!(params_after - status_after < Duration::from_secs(5), "parameters {params_after:?} vs status {status_after:?}: more than one reconcile");

    // the operator stops: new pods still get the last sized value (no webhook in this namespace)
    drop(op);
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let real: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "created-while-down", "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &real).await.expect("create a pod while the operator is down");
    let got = created.spec.unwrap().containers[0].lifecycle.clone().and_then(|l| l.pre_stop).and_then(|p| p.sleep).map(|s| s.seconds);
    assert_eq!(got, Some(second as i64), "with the operator stopped, a new pod still gets the last sized sleep");
    println!("operator stopped: a new pod got preStop sleep {second} s");

    let _ = api.delete("created-while-down", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
    safe_termination::controller::admission::remove_policy(&client, name).await.expect("remove the policy");
    let _ = params.delete(name, &DeleteParams::default()).await;
    for n in [system, ns] {
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).delete(n, &DeleteParams::default()).await;
    }
}
