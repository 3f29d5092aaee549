//! Every real pod manifest and AdmissionReview in tests/data (copied from ../shared/cases, see
//! tests/data/SOURCES.md) through the pure mutation engine, with the outcome each must produce,
//! plus property tests on generated pods (rules R1-R11).

use base64::Engine as _;
use json_patch::Patch;
use proptest::prelude::*;
use safe_termination::cli::mutate::{documents, pod_of};
use safe_termination::core::annotations::{ANNOTATION_POLICY, ANNOTATION_PRESTOP_SECONDS};
use safe_termination::core::crd::{EnforcementMode, PreStopHandler, Scope, TerminationPolicySpec};
use safe_termination::core::mutate::{ContainerReason, PodMutation, PodReason, mutate_pod, short_warning};
use safe_termination::core::plan::{Capabilities, Plan, PlanPolicy};
use safe_termination::core::selector::{AssumeServiceBacked, Labels, StaticServiceIndex};
use safe_termination::webhook::review;
use serde_json::{Value, json};

mod support;

fn plan_with(spec: TerminationPolicySpec, pre_stop: u32, native_sleep: bool) -> Plan {
    Plan {
        policies: Vec::new(),
        default_policy: Some(PlanPolicy { namespace: String::new(), name: "default".into(), spec, pre_stop_seconds: pre_stop }),
        capabilities: Capabilities { native_sleep },
        wait: Default::default(),
    }
}

fn plan(native_sleep: bool) -> Plan {
    plan_with(TerminationPolicySpec::default(), 10, native_sleep)
}

/// The pods (workload templates) of a case file, skipping kinds without a pod template.
fn pods(file: &str) -> Vec<Value> {
    documents(&format!("tests/data/pods/{file}")).unwrap().iter().filter_map(|d| pod_of(d, "default").ok().map(|(p, _)| p)).collect()
}

fn one_pod(file: &str) -> Value {
    let mut p = pods(file);
    assert_eq!(p.len(), 1, "{file} should hold exactly one pod template");
    p.remove(0)
}

/// Runs the engine, checks the patch applies and is idempotent, and returns the patched pod.
fn run(pod: &Value, plan: &Plan) -> (PodMutation, Value) {
    let d = mutate_pod(pod, "default", plan, &AssumeServiceBacked);
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &d.patch.0).expect("patch applies to its input");
    let again = mutate_pod(&patched, "default", plan, &AssumeServiceBacked);
    assert!(again.patch.0.is_empty(), "not idempotent: {:?}", again.patch);
    // whole warnings; the webhook's answer cuts each to 119 characters for the API server
    for w in d.warnings.iter().chain(&again.warnings) {
        assert!(w.starts_with("safe-termination") && short_warning(w.clone()).chars().count() <= 119, "warning: {w}");
    }
    (d, patched)
}

fn grace(p: &Value) -> Option<i64> {
    p.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64)
}

fn sleep_of(p: &Value, i: usize) -> Option<i64> {
    p.pointer(&format!("/spec/containers/{i}/lifecycle/preStop/sleep/seconds")).and_then(Value::as_i64)
}

const RUN_TO_COMPLETION: [&str; 5] = [
    "contour-certgen-job.yaml",
    "ingress-nginx-admission-create-job.yaml",
    "k8sdocs-job-native-sidecar.yaml",
    "istio-injected-job.yaml",
    "cronjob-busybox.yaml",
];

#[test]
fn jobs_and_cronjobs_get_no_patch_r7() {
    for f in RUN_TO_COMPLETION {
        let (d, _) = run(&one_pod(f), &plan(true));
        assert!(d.patch.0.is_empty(), "{f}");
        assert_eq!(d.reason, PodReason::RunToCompletion, "{f}");
    }
}

#[test]
fn ingress_nginx_keeps_its_hook_and_grace_300_r1_r2() {
    let pod = one_pod("ingress-nginx-controller-deployment.yaml");
    let (d, patched) = run(&pod, &plan(true));
    assert!(d.patch.0.is_empty(), "{:?}", d.patch);
    assert_eq!(d.containers[0].reason, ContainerReason::ExistingPreStop);
    assert_eq!(grace(&patched), Some(300));
    // a plan that needs more than 300 s raises grace only, lifecycle untouched
    let mut spec = TerminationPolicySpec::default();
    spec.pre_stop.max_seconds = 600;
    spec.grace.max_seconds = 1000;
    let (d, patched) = run(&pod, &plan_with(spec, 400, true));
    assert_eq!(d.patch.0.len(), 1, "{:?}", d.patch);
    assert_eq!(grace(&patched), Some(430));
    assert_eq!(patched.pointer("/spec/containers/0/lifecycle"), pod.pointer("/spec/containers/0/lifecycle"));
}

#[test]
fn kube_state_metrics_native_sleep_on_all_three_r3() {
    let pod = one_pod("kube-state-metrics-distroless-multicontainer.yaml");
    assert_eq!(grace(&pod), None);
    let (d, patched) = run(&pod, &plan(true));
    assert_eq!(d.reason, PodReason::Mutated);
    for i in 0..3 {
        assert_eq!(sleep_of(&patched, i), Some(10), "container {i}");
    }
    assert_eq!(grace(&patched), Some(40));
    assert_eq!(patched.pointer(&format!("/metadata/annotations/{}", ANNOTATION_PRESTOP_SECONDS.replace('/', "~1"))), Some(&json!("10")));
    // a sleep above the default 30 s grace raises grace in the same patch
    let mut spec = TerminationPolicySpec::default();
    spec.grace.app_shutdown_seconds = 0;
    let (_, patched) = run(&pod, &plan_with(spec, 45, true));
    assert_eq!(sleep_of(&patched, 0), Some(45));
    assert_eq!(grace(&patched), Some(45));
}

#[test]
fn kube_state_metrics_without_native_sleep_gets_no_shell_r5() {
    let pod = one_pod("kube-state-metrics-distroless-multicontainer.yaml");
    let (d, _) = run(&pod, &plan(false));
    assert!(d.patch.0.is_empty());
    assert_eq!(d.reason, PodReason::NoUsableHandler);
    assert_eq!(d.warnings.len(), 1);
    assert!(d.warnings[0].contains("kube-state-metrics"), "{}", d.warnings[0]);
    // exec only for allow-listed images, as [sleep, N] without a shell
    let mut spec = TerminationPolicySpec::default();
    spec.pre_stop.exec_images = vec!["quay.io/brancz/kube-rbac-proxy*".into()];
    let (d, patched) = run(&pod, &plan_with(spec, 10, false));
    assert_eq!(
        d.containers.iter().map(|c| c.reason).collect::<Vec<_>>(),
        vec![ContainerReason::NoUsableHandler, ContainerReason::InjectedExec, ContainerReason::InjectedExec]
    );
    assert_eq!(patched.pointer("/spec/containers/1/lifecycle/preStop/exec/command"), Some(&json!(["sleep", "10"])));
    assert_eq!(patched.pointer("/spec/containers/0/lifecycle"), None);
}

#[test]
fn windows_pods_never_get_exec_r5() {
    let mut pod = one_pod("hostnetwork-deployment.yaml");
    pod["spec"]["os"] = json!({"name": "windows"});
    let mut spec = TerminationPolicySpec::default();
    spec.pre_stop.exec_images = vec!["*".into()];
    let (d, _) = run(&pod, &plan_with(spec.clone(), 10, false));
    assert!(d.patch.0.is_empty());
    assert!(d.warnings[0].contains("Windows"));
    // native sleep is fine on Windows
    let (d, _) = run(&pod, &plan_with(spec, 10, true));
    assert_eq!(d.reason, PodReason::Mutated);
}

#[test]
fn node_exporter_hostnetwork_both_containers() {
    let (d, patched) = run(&one_pod("node-exporter-hostnetwork-daemonset.yaml"), &plan(true));
    assert_eq!(d.reason, PodReason::Mutated);
    assert_eq!((sleep_of(&patched, 0), sleep_of(&patched, 1)), (Some(10), Some(10)));
    assert_eq!(patched.pointer("/spec/hostNetwork"), Some(&json!(true)));
}

#[test]
fn explicit_grace_zero_is_skipped_with_a_warning_r3() {
    let all = pods("istio-sample-curl-grace0.yaml");
    assert_eq!(all.len(), 1, "multi-document file: one Deployment among ServiceAccount and Service");
    let (d, _) = run(&all[0], &plan(true));
    assert!(d.patch.0.is_empty());
    assert_eq!(d.reason, PodReason::GraceZero);
    assert_eq!(d.warnings.len(), 1);
}

#[test]
fn flow_style_pod_keeps_post_start_and_pre_stop_r1() {
    let pod = one_pod("k8sdocs-lifecycle-prestop-exec.yaml");
    let (d, patched) = run(&pod, &plan(true));
    assert!(d.patch.0.len() <= 1);
    assert_eq!(patched.pointer("/spec/containers/0/lifecycle"), pod.pointer("/spec/containers/0/lifecycle"));
    for op in &d.patch.0 {
        assert_eq!(op.path().to_string(), "/spec/terminationGracePeriodSeconds");
    }
}

#[test]
fn native_sidecars_are_never_touched_r6() {
    for f in ["k8sdocs-deployment-native-sidecar.yaml", "istio-native-sidecar-input.yaml", "linkerd-native-sidecar.yaml", "istio-injected-deployment.yaml"] {
        let pod = one_pod(f);
        let (d, patched) = run(&pod, &plan(true));
        assert_eq!(d.reason, PodReason::Mutated, "{f}");
        assert_eq!(patched.pointer("/spec/initContainers"), pod.pointer("/spec/initContainers"), "{f}");
        assert_eq!(sleep_of(&patched, 0), Some(10), "{f}");
        for op in &d.patch.0 {
            let path = op.path().to_string();
            assert!(!path.starts_with("/spec/initContainers"), "{f}: {path}");
            if path.starts_with("/spec/containers/") {
                assert!(path.starts_with("/spec/containers/0/"), "{f}: only the app container: {path}");
            }
        }
    }
}

#[test]
fn classic_sidecar_in_containers_gets_the_same_sleep_r6() {
    let pod = one_pod("istio-mock-injected-deployment.yaml");
    let (d, patched) = run(&pod, &plan(true));
    assert_eq!(d.containers.len(), 2);
    assert_eq!(d.containers[1].name, "istio-proxy");
    assert_eq!((sleep_of(&patched, 0), sleep_of(&patched, 1)), (Some(10), Some(10)));
    assert_eq!(patched.pointer("/spec/initContainers"), pod.pointer("/spec/initContainers"));
}

#[test]
fn hostnetwork_deployment_is_mutated_like_any_pod() {
    let (d, patched) = run(&one_pod("hostnetwork-deployment.yaml"), &plan(true));
    assert_eq!(d.reason, PodReason::Mutated);
    assert_eq!(sleep_of(&patched, 0), Some(10));
    assert_eq!(patched.pointer(&format!("/metadata/annotations/{}", ANNOTATION_POLICY.replace('/', "~1"))), Some(&json!("default")));
}

#[test]
fn every_case_applies_and_is_idempotent_with_and_without_native_sleep() {
    for entry in std::fs::read_dir("tests/data/pods").unwrap() {
        let path = entry.unwrap().path();
        for pod in pods(path.file_name().unwrap().to_str().unwrap()) {
            for native in [true, false] {
                let (_, patched) = run(&pod, &plan(native));
                if let (Some(s), g) = (sleep_of(&patched, 0), grace(&patched)) {
                    assert!(s <= g.unwrap_or(30), "{path:?}: sleep {s} above grace {g:?}");
                }
            }
        }
    }
}

#[test]
fn opt_outs_mirror_pods_disabled_audit_and_scope() {
    let base = one_pod("hostnetwork-deployment.yaml");
    let with_ann = |k: &str, v: &str| {
        let mut p = base.clone();
        p["metadata"]["annotations"] = json!({ k: v });
        p
    };
    let d = mutate_pod(&with_ann("safetermination.io/skip", "true"), "default", &plan(true), &AssumeServiceBacked);
    assert_eq!((d.reason, d.patch.0.len()), (PodReason::OptedOut, 0));
    let d = mutate_pod(&with_ann("kubernetes.io/config.mirror", "abc"), "default", &plan(true), &AssumeServiceBacked);
    assert_eq!((d.reason, d.patch.0.len()), (PodReason::MirrorPod, 0));
    let (d, _) = run(&with_ann("safetermination.io/skip-containers", "web-svc"), &plan(true));
    assert_eq!(d.containers[0].reason, ContainerReason::OptedOut);
    assert!(d.patch.0.is_empty());

    let mut spec = TerminationPolicySpec { mode: EnforcementMode::Disabled, ..Default::default() };
    let d = mutate_pod(&base, "default", &plan_with(spec.clone(), 10, true), &AssumeServiceBacked);
    assert_eq!(d.reason, PodReason::PolicyDisabled);

    spec.mode = EnforcementMode::Audit;
    let (d, patched) = run(&base, &plan_with(spec, 10, true));
    assert_eq!(d.reason, PodReason::Audited);
    assert_eq!(sleep_of(&patched, 0), None, "audit changes no lifecycle");
    assert_eq!(grace(&patched), grace(&base));
    assert!(d.warnings.iter().any(|w| w.contains("audit")));
    assert_eq!(patched.pointer("/metadata/annotations/safetermination.io~1audit-prestop-seconds"), Some(&json!("10")));

    // scope ServiceBacked: only pods some Service selects
    let labels = base.pointer("/metadata/labels").cloned().unwrap();
    let sel: Labels = serde_json::from_value(labels).unwrap();
    let matching = StaticServiceIndex { services: vec![("default".into(), sel.clone())] };
    let other_ns = StaticServiceIndex { services: vec![("elsewhere".into(), sel)] };
    let p = plan(true);
    assert_eq!(mutate_pod(&base, "default", &p, &matching).reason, PodReason::Mutated);
    assert_eq!(mutate_pod(&base, "default", &p, &other_ns).reason, PodReason::NotServiceBacked);
    let all = TerminationPolicySpec { scope: Scope::AllLongRunning, ..Default::default() };
    assert_eq!(mutate_pod(&base, "default", &plan_with(all, 10, true), &other_ns).reason, PodReason::Mutated);
    // no policy in the namespace and no default: untouched
    let none = Plan { policies: vec![], default_policy: None, capabilities: Capabilities { native_sleep: true }, wait: Default::default() };
    assert_eq!(mutate_pod(&base, "default", &none, &matching).reason, PodReason::NoPolicy);
}

#[test]
fn handler_sleep_only_and_exec_only() {
    let pod = one_pod("hostnetwork-deployment.yaml");
    let mut spec = TerminationPolicySpec::default();
    spec.pre_stop.handler = PreStopHandler::Sleep;
    spec.pre_stop.exec_images = vec!["*".into()];
    assert_eq!(mutate_pod(&pod, "", &plan_with(spec.clone(), 10, false), &AssumeServiceBacked).reason, PodReason::NoUsableHandler);
    spec.pre_stop.handler = PreStopHandler::Exec;
    let (d, _) = run(&pod, &plan_with(spec, 10, true));
    assert_eq!(d.containers[0].reason, ContainerReason::InjectedExec);
}

#[test]
fn under_sized_existing_sleep_is_reported_not_rewritten_r1() {
    let mut pod = one_pod("hostnetwork-deployment.yaml");
    pod["spec"]["containers"][0]["lifecycle"] = json!({"preStop": {"sleep": {"seconds": 2}}});
    let (d, patched) = run(&pod, &plan(true));
    assert_eq!(sleep_of(&patched, 0), Some(2));
    assert!(d.warnings.iter().any(|w| w.contains("below the recommended 10s")), "{:?}", d.warnings);
}

#[test]
fn policy_precedence_most_specific_then_name() {
    let pod = one_pod("hostnetwork-deployment.yaml"); // labels app: web-svc
    let sel = |pairs: &[(&str, &str)]| {
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            match_expressions: None,
        })
    };
    let labels: Labels = serde_json::from_value(pod.pointer("/metadata/labels").cloned().unwrap()).unwrap();
    let first_label = labels.iter().next().map(|(k, v)| (k.clone(), v.clone())).unwrap();
    let mk = |name: &str, selector, pre| {
        let spec = TerminationPolicySpec { pod_selector: selector, ..Default::default() };
        PlanPolicy { namespace: "default".into(), name: name.into(), spec, pre_stop_seconds: pre }
    };
    let plan = Plan {
        policies: vec![
            mk("b-broad", None, 5),
            mk("a-broad", None, 6),
            mk("z-specific", sel(&[(&first_label.0, &first_label.1)]), 7),
            mk("miss", sel(&[("nope", "x")]), 8),
        ],
        default_policy: None,
        capabilities: Capabilities { native_sleep: true },
        wait: Default::default(),
    };
    let d = mutate_pod(&pod, "default", &plan, &AssumeServiceBacked);
    assert_eq!(d.policy.as_deref(), Some("default/z-specific"));
    assert!(d.warnings.iter().any(|w| w.contains("chosen over a-broad,b-broad")), "{:?}", d.warnings);
}

#[test]
fn admission_review_case_round_trip() {
    let body = std::fs::read("tests/data/admission/admissionreview-pod-create.json").unwrap();
    let out = review(&body, &plan(true), &AssumeServiceBacked);
    assert_eq!(out.status, 200);
    let v: Value = serde_json::from_slice(&out.body).unwrap();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["response"]["uid"], "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4");
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(v["response"]["patchType"], "JSONPatch");
    let patch_bytes = base64::engine::general_purpose::STANDARD.decode(v["response"]["patch"].as_str().expect("base64 string")).unwrap();
    let patch: Patch = serde_json::from_slice(&patch_bytes).unwrap();
    let req: Value = serde_json::from_slice(&body).unwrap();
    let mut obj = req["request"]["object"].clone();
    json_patch::patch(&mut obj, &patch.0).unwrap();
    assert_eq!(sleep_of(&obj, 0), Some(10));
    assert_eq!(grace(&obj), Some(40), "30 raised to 10 + 30");
}

#[test]
fn admission_non_create_and_subresources_are_allowed_unpatched_r9() {
    let body = std::fs::read("tests/data/admission/admissionreview-pod-create.json").unwrap();
    let base: Value = serde_json::from_slice(&body).unwrap();
    for (field, value) in [("operation", json!("UPDATE")), ("subResource", json!("status")), ("operation", json!("DELETE"))] {
        let mut r = base.clone();
        r["request"][field] = value;
        let out = review(&serde_json::to_vec(&r).unwrap(), &plan(true), &AssumeServiceBacked);
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(out.status, 200);
        assert_eq!(v["response"]["uid"], "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4");
        assert_eq!(v["response"]["allowed"], true);
        assert!(v["response"].get("patch").is_none(), "{field}");
    }
    for bad in [
        &b"not json"[..],
        br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1beta1","request":{"uid":"x"}}"#,
        br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#,
    ] {
        let out = review(bad, &plan(true), &AssumeServiceBacked);
        assert_eq!(out.status, 400);
        assert!(String::from_utf8_lossy(&out.body).starts_with("bad AdmissionReview: "));
    }
}

#[test]
fn composes_with_linkerd_injector_patch_in_either_order() {
    let theirs: Patch = serde_json::from_slice(&std::fs::read("tests/data/admission/other-webhook-patch-linkerd.json").unwrap()).unwrap();
    let body = std::fs::read("tests/data/admission/admissionreview-pod-create.json").unwrap();
    let req: Value = serde_json::from_slice(&body).unwrap();
    let mut base = req["request"]["object"].clone();
    // the shape their patch was computed against: an initContainers list to insert into
    base["spec"]["initContainers"] = json!([]);
    let p = plan(true);
    // theirs first, then ours computed on their output (reinvocation order)
    let mut a = base.clone();
    json_patch::patch(&mut a, &theirs.0).unwrap();
    let ours_after = mutate_pod(&a, "example-ns", &p, &AssumeServiceBacked);
    json_patch::patch(&mut a, &ours_after.patch.0).unwrap();
    // ours first, then theirs applied to our output
    let mut b = base.clone();
    let ours_first = mutate_pod(&b, "example-ns", &p, &AssumeServiceBacked);
    json_patch::patch(&mut b, &ours_first.patch.0).unwrap();
    json_patch::patch(&mut b, &theirs.0).expect("their patch still applies after ours");
    assert_eq!(a, b, "same pod either order");
    assert_eq!(sleep_of(&a, 0), Some(10));
    assert!(a.pointer("/metadata/annotations/linkerd.io~1proxy-version").is_some());
}

// ---------- property tests on generated pods ----------

fn arb_lifecycle() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        Just(Some(json!({"postStart": {"exec": {"command": ["true"]}}}))),
        Just(Some(json!({"preStop": {"exec": {"command": ["/drain"]}}}))),
        (0i64..100).prop_map(|s| Some(json!({"preStop": {"sleep": {"seconds": s}}}))),
        Just(Some(json!({"preStop": {"httpGet": {"path": "/quit", "port": 8080}}, "postStart": {"exec": {"command": ["x"]}}}))),
        Just(Some(json!({}))),
        Just(Some(Value::Null)),
    ]
}

fn arb_container() -> impl Strategy<Value = Value> {
    ("[a-z~/]{1,8}", prop::sample::select(vec!["nginx", "gcr.io/distroless/static", "busybox:1.36"]), arb_lifecycle()).prop_map(|(name, image, lc)| {
        let mut c = json!({"name": name, "image": image});
        if let Some(lc) = lc {
            c["lifecycle"] = lc;
        }
        c
    })
}

fn arb_pod() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(arb_container(), 0..4),
        prop::collection::vec(arb_container(), 0..3),
        prop::option::of(prop_oneof![Just(0i64), 1i64..100, Just(300), Just(604800)]),
        prop::sample::select(vec![None, Some("Always"), Some("Never"), Some("OnFailure")]),
        prop::sample::select(vec![0u8, 1, 2, 3]),
    )
        .prop_map(|(containers, inits, grace, restart, annotations)| {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "x"}}, "spec": {"containers": containers}});
            let inits: Vec<Value> = inits
                .into_iter()
                .map(|mut c| {
                    c["restartPolicy"] = json!("Always");
                    c
                })
                .collect();
            if !inits.is_empty() {
                pod["spec"]["initContainers"] = Value::Array(inits);
            }
            if let Some(g) = grace {
                pod["spec"]["terminationGracePeriodSeconds"] = json!(g);
            }
            if let Some(r) = restart {
                pod["spec"]["restartPolicy"] = json!(r);
            }
            match annotations {
                1 => pod["metadata"]["annotations"] = json!({"a/b~c": "x"}),
                2 => pod["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "h"}),
                3 => pod["metadata"]["annotations"] = Value::Null,
                _ => {}
            }
            pod
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn generated_pods_obey_the_rules(pod in prop_oneof![arb_pod(), support::pods::valid_pod()], pre_stop in 1u32..120, native in any::<bool>(), exec_all in any::<bool>()) {
        let mut spec = TerminationPolicySpec::default();
        spec.pre_stop.max_seconds = 120;
        if exec_all { spec.pre_stop.exec_images = vec!["busybox*".into()]; }
        let plan = plan_with(spec, pre_stop, native);
        let d = mutate_pod(&pod, "default", &plan, &AssumeServiceBacked);
        let mut patched = pod.clone();
        prop_assert!(json_patch::patch(&mut patched, &d.patch.0).is_ok(), "patch applies");
        // idempotent
        let again = mutate_pod(&patched, "default", &plan, &AssumeServiceBacked);
        prop_assert!(again.patch.0.is_empty(), "idempotent: {:?}", again.patch);
        // no initContainer changed
        prop_assert_eq!(patched.pointer("/spec/initContainers"), pod.pointer("/spec/initContainers"));
        // grace only raised
        let g0 = grace(&pod);
        let g1 = grace(&patched);
        if let Some(g0) = g0 { prop_assert!(g1.unwrap() >= g0); }
        // existing hooks unchanged; injected sleeps within grace
        let n = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
        for i in 0..n {
            let before = pod.pointer(&format!("/spec/containers/{i}/lifecycle/preStop")).filter(|v| !v.is_null());
            let after = patched.pointer(&format!("/spec/containers/{i}/lifecycle/preStop"));
            if before.is_some() { prop_assert_eq!(before, after); }
            prop_assert_eq!(pod.pointer(&format!("/spec/containers/{i}/lifecycle/postStart")), patched.pointer(&format!("/spec/containers/{i}/lifecycle/postStart")));
            if before.is_none() && let Some(s) = sleep_of(&patched, i) {
                prop_assert!(s <= g1.unwrap_or(30), "sleep {} > grace {:?}", s, g1);
            }
        }
        // no patch for Jobs or mirror pods or grace 0
        let restart = pod.pointer("/spec/restartPolicy").and_then(Value::as_str);
        let mirror = pod.pointer("/metadata/annotations/kubernetes.io~1config.mirror").is_some();
        if matches!(restart, Some("Never" | "OnFailure")) || mirror || g0 == Some(0) {
            prop_assert!(d.patch.0.is_empty());
        }
    }
}

#[test]
fn a_grace_period_that_is_not_an_integer_is_never_overwritten() {
    for g in [json!("600"), json!(45.5), json!(1e20), json!(true)] {
        let mut pod = one_pod("hostnetwork-deployment.yaml");
        pod["spec"]["terminationGracePeriodSeconds"] = g.clone();
        let d = mutate_pod(&pod, "default", &plan(true), &AssumeServiceBacked);
        assert!(d.patch.0.is_empty(), "{g}: {:?}", d.patch);
        assert!(d.warnings.iter().any(|w| w.contains("not an integer")), "{g}");
    }
}

/// An AdmissionReview v1 of a Pod CREATE of `pod` in namespace `default`.
fn review_body(pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "default",
            "object": pod
        }
    }))
    .unwrap()
}

/// Bounded work per pod: at [`MAX_POD_CONTAINERS`] containers and init containers together and
/// [`MAX_POD_LABELS`] labels a pod is mutated as any other; one more of either and it is left
/// unchanged with the warning, before any per-container work (no per-container reasons). The
/// webhook's pruned parse, which keeps at most one more than each bound, decides the same as
/// the engine on the whole pod, and its answer is the warning alone.
#[test]
fn pods_past_the_container_or_label_bound_are_left_unchanged_with_a_warning() {
    use safe_termination::core::mutate::{MAX_POD_CONTAINERS, MAX_POD_LABELS, too_many_containers_warning, too_many_labels_warning};
    let containers = |n: usize| (0..n).map(|i| json!({"name": format!("c{i}"), "image": "x"})).collect::<Vec<_>>();
    let labels = |n: usize| (0..n).map(|i| (format!("l{i}"), json!("v"))).collect::<serde_json::Map<_, _>>();
    let pod = |c: usize, init: usize, l: usize| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": labels(l)}, "spec": {"containers": containers(c), "initContainers": containers(init)}});
    let p = plan(true);
    for (c, init, l, reason) in [
        (MAX_POD_CONTAINERS, 0, MAX_POD_LABELS, PodReason::Mutated),
        (MAX_POD_CONTAINERS - 6, 6, 1, PodReason::Mutated),
        (MAX_POD_CONTAINERS + 1, 0, 1, PodReason::TooManyContainers),
        (MAX_POD_CONTAINERS - 5, 6, 1, PodReason::TooManyContainers),
        (1, MAX_POD_CONTAINERS, 1, PodReason::TooManyContainers),
        (3 * MAX_POD_CONTAINERS, 3 * MAX_POD_CONTAINERS, 1, PodReason::TooManyContainers),
        (1, 0, MAX_POD_LABELS + 1, PodReason::TooManyLabels),
        (3 * MAX_POD_CONTAINERS, 0, 3 * MAX_POD_LABELS, PodReason::TooManyLabels),
    ] {
        let pod = pod(c, init, l);
        let (d, _) = run(&pod, &p);
        assert_eq!(d.reason, reason, "{c} containers, {init} init containers, {l} labels");
        let out = review(&review_body(&pod), &p, &AssumeServiceBacked);
        let r: Value = serde_json::from_slice(&out.body).unwrap();
        match reason {
            PodReason::Mutated => {
                assert_eq!((d.containers.len(), d.patch.0.len()), (c, c + 2), "a preStop per container, the grace, the annotations");
                assert_eq!((out.decision, out.patch_ops), ("mutated", c + 2));
            }
            PodReason::TooManyContainers => {
                assert_eq!((d.warnings.clone(), d.containers.len(), d.patch.0.len()), (vec![too_many_containers_warning()], 0, 0));
                assert_eq!(d.policy.as_deref(), Some("default"));
                assert_eq!((out.decision, out.patch_ops), ("skipped_too_many_containers", 0));
                assert_eq!(r["response"]["warnings"], json!([too_many_containers_warning()]));
            }
            _ => {
                assert_eq!((d.warnings.clone(), d.containers.len(), d.patch.0.len()), (vec![too_many_labels_warning()], 0, 0));
                assert_eq!((out.decision, out.patch_ops), ("skipped_too_many_labels", 0));
                assert_eq!(r["response"]["warnings"], json!([too_many_labels_warning()]));
            }
        }
        assert!(r["response"].get("patch").is_some() == (reason == PodReason::Mutated), "{r}");
    }
    assert_eq!(too_many_containers_warning(), "safe-termination: more than 256 containers and init containers; pod admitted unchanged");
    assert_eq!(too_many_labels_warning(), "safe-termination: more than 1024 labels; pod admitted unchanged");
    // a name longer than any Kubernetes name is shown cut (each reason and warning repeats it)
    let long = "n".repeat(300);
    let mut one = pod(1, 0, 1);
    one["spec"]["containers"][0] = json!({"name": long, "image": "x", "lifecycle": {"preStop": {"sleep": {"seconds": 1}}}});
    let (d, _) = run(&one, &p);
    assert_eq!(d.containers[0].name, format!("{}…", &long[..253]));
    assert!(d.warnings[0].ends_with(&format!("in container {}…", &long[..253])), "{:?}", d.warnings);
    // the opt-outs and the namespace's policy still come first: a skipped pod gets no warning
    let mut opted_out = pod(MAX_POD_CONTAINERS + 1, 0, 1);
    opted_out["metadata"]["annotations"] = json!({"safetermination.io/skip": "true"});
    assert_eq!(run(&opted_out, &p).0.warnings, Vec::<String>::new());
    assert_eq!(run(&opted_out, &p).0.reason, PodReason::OptedOut);
}

/// `spec.containers` written as a map (or anything but a list) is said in a warning, not a
/// silent NoChange; the webhook's pruned parse says the same.
#[test]
fn containers_that_are_not_a_list_are_warned_about() {
    let p = plan(true);
    for containers in [json!({"web": {"image": "nginx"}}), json!("web")] {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": containers}});
        let (d, _) = run(&pod, &p);
        assert_eq!((d.reason, d.patch.0.len()), (PodReason::NoChange, 0));
        assert_eq!(d.warnings, ["safe-termination: spec.containers is not a list; no preStop added"]);
        let r: Value = serde_json::from_slice(&review(&review_body(&pod), &p, &AssumeServiceBacked).body).unwrap();
        assert_eq!(r["response"]["warnings"], json!(d.warnings));
    }
}
