//! The preStop `Wait` handler's mutation (rule R12) on every real pod manifest of tests/data
//! (copied from ../shared/cases): the waiter's hook, its init container and volumes, the grace
//! that holds its deadline, each part checked against the Restricted Pod Security level's rules
//! (Kubernetes "Pod Security Standards", 1.34), idempotence, reinvocation after another webhook,
//! and Windows pods keeping the sleep. The Restricted level is also checked by a real API server
//! in tests/e2e_in_process.rs.

use safe_termination::cli::mutate::{documents, pod_of};
use safe_termination::core::crd::{PreStopHandler, TerminationPolicySpec};
use safe_termination::core::mutate::{ContainerReason, PodMutation, PodReason, mutate_pod};
use safe_termination::core::plan::{Capabilities, Plan, PlanPolicy};
use safe_termination::core::selector::AssumeServiceBacked;
use safe_termination::core::wait::{self, WaitInjection};
use serde_json::{Value, json};

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

fn wait_plan(pre_stop: u32) -> Plan {
    let mut spec = TerminationPolicySpec::default();
    spec.pre_stop.handler = PreStopHandler::Wait;
    Plan {
        policies: Vec::new(),
        default_policy: Some(PlanPolicy { namespace: String::new(), name: "web".into(), spec, pre_stop_seconds: pre_stop }),
        capabilities: Capabilities { native_sleep: true },
        wait: WaitInjection {
            image: "registry.example/safe-termination@sha256:0123".into(),
            url: "https://st.ops.svc:443/wait/v1".into(),
            address: Some("10.96.0.20:443".into()),
            ca_pem: CA.into(),
        },
    }
}

fn pods(file: &str) -> Vec<Value> {
    documents(&format!("tests/data/pods/{file}")).unwrap().iter().filter_map(|d| pod_of(d, "default").ok().map(|(p, _)| p)).collect()
}

fn every_case() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("tests/data/pods").unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        for p in pods(&name) {
            out.push((name.clone(), p));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 14, "the shared cases: {}", out.len());
    out
}

/// Applies the decision and checks it is idempotent (R11).
fn run(pod: &Value, plan: &Plan) -> (PodMutation, Value) {
    let d = mutate_pod(pod, "default", plan, &AssumeServiceBacked);
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &d.patch.0).expect("the patch applies");
    let again = mutate_pod(&patched, "default", plan, &AssumeServiceBacked);
    assert!(again.patch.0.is_empty(), "not idempotent: {:?}", again.patch);
    (d, patched)
}

fn named<'a>(p: &'a Value, list: &str, name: &str) -> Vec<&'a Value> {
    p.pointer(&format!("/spec/{list}")).and_then(Value::as_array).map(|l| l.iter().filter(|v| v["name"] == name).collect()).unwrap_or_default()
}

/// The Restricted level's rules that apply to what the mutation adds (Pod Security Standards,
/// "Restricted"): volume types; per container, allowPrivilegeEscalation false, runAsNonRoot,
/// capabilities dropping ALL and adding nothing but NET_BIND_SERVICE, seccomp RuntimeDefault or
/// Localhost; no host fields in probes or lifecycle hooks (KEP-4940). Returns each violation.
fn restricted_violations_of_injected(p: &Value) -> Vec<String> {
    let mut v = Vec::new();
    for vol in named(p, "volumes", wait::BIN_VOLUME).into_iter().chain(named(p, "volumes", wait::CONFIG_VOLUME)) {
        let kinds: Vec<&String> = vol.as_object().unwrap().keys().filter(|k| *k != "name").collect();
        if !kinds
            .iter()
            .all(|k| ["emptyDir", "projected", "configMap", "secret", "downwardAPI", "persistentVolumeClaim", "ephemeral", "csi"].contains(&k.as_str()))
        {
            v.push(format!("volume {} of type {kinds:?}", vol["name"]));
        }
    }
    for c in named(p, "initContainers", wait::INSTALL_CONTAINER) {
        let sc = &c["securityContext"];
        if sc["allowPrivilegeEscalation"] != json!(false) {
            v.push("allowPrivilegeEscalation".into());
        }
        if sc["runAsNonRoot"] != json!(true) || sc["runAsUser"] == json!(0) {
            v.push("runAsNonRoot".into());
        }
        if sc["capabilities"]["drop"] != json!(["ALL"]) || sc["capabilities"].get("add").is_some() {
            v.push("capabilities".into());
        }
        if sc["seccompProfile"]["type"] != "RuntimeDefault" {
            v.push("seccompProfile".into());
        }
    }
    for c in p["spec"]["containers"].as_array().unwrap() {
        if c.pointer("/lifecycle/preStop/httpGet/host").is_some() || c.pointer("/lifecycle/preStop/tcpSocket/host").is_some() {
            v.push(format!("a host in {}'s preStop", c["name"]));
        }
    }
    v
}

#[test]
fn every_case_gets_the_waiter_once_with_restricted_parts_and_a_grace_that_holds_its_deadline() {
    let plan = wait_plan(7);
    let mut waited = 0;
    for (file, pod) in every_case() {
        let (d, p) = run(&pod, &plan);
        let waiters: Vec<&Value> = p["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c.pointer("/lifecycle/preStop/exec/command/0") == Some(&json!(wait::WAITER_PATH)))
            .collect();
        let injected = d.containers.iter().filter(|c| c.reason == ContainerReason::InjectedWait).count();
        assert!(waiters.len() >= injected, "{file}");
        if waiters.is_empty() {
            assert!(named(&p, "initContainers", wait::INSTALL_CONTAINER).is_empty(), "{file}: no waiter, no init container");
            continue;
        }
        waited += 1;
        assert_eq!(d.reason, PodReason::Mutated, "{file}");
        assert_eq!(named(&p, "initContainers", wait::INSTALL_CONTAINER).len(), 1, "{file}");
        assert_eq!(named(&p, "volumes", wait::BIN_VOLUME).len(), 1, "{file}");
        assert_eq!(named(&p, "volumes", wait::CONFIG_VOLUME).len(), 1, "{file}");
        assert_eq!(restricted_violations_of_injected(&p), Vec::<String>::new(), "{file}");
        let grace = p["spec"]["terminationGracePeriodSeconds"].as_i64().unwrap();
        for c in waiters {
            let cmd: Vec<&str> = c["lifecycle"]["preStop"]["exec"]["command"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
            let arg = |flag: &str| cmd.iter().position(|s| *s == flag).map(|i| cmd[i + 1]).unwrap_or_else(|| panic!("{file}: {flag} in {cmd:?}"));
            assert_eq!(arg("--fallback-seconds"), "7", "{file}");
            assert_eq!(arg("--policy"), "web", "{file}");
            assert_eq!(arg("--address"), "10.96.0.20:443", "{file}");
            let deadline: i64 = arg("--deadline-seconds").parse().unwrap();
            assert!((7..=60).contains(&deadline), "{file}: deadline {deadline}");
            assert!(deadline + 30 <= grace || grace > 600 - 1, "{file}: deadline {deadline} leaves the app 30 s of grace {grace}");
            let mounts: Vec<&Value> =
                c["volumeMounts"].as_array().unwrap().iter().filter(|m| m["name"] == wait::BIN_VOLUME || m["name"] == wait::CONFIG_VOLUME).collect();
            assert_eq!(mounts.len(), 2, "{file}: {mounts:?}");
            assert!(mounts.iter().all(|m| m["readOnly"] == json!(true)), "{file}");
        }
        assert_eq!(p.pointer("/metadata/annotations/safetermination.io~1wait-ca"), Some(&json!(CA)), "{file}");
        assert_eq!(p.pointer("/metadata/annotations/safetermination.io~1prestop-handler"), Some(&json!("Wait")), "{file}");
    }
    assert!(waited >= 8, "pods given the waiter: {waited}");
}

#[test]
fn an_existing_pre_stop_and_a_larger_grace_are_kept() {
    let pod = json!({"kind": "Pod", "metadata": {"name": "p"}, "spec": {"terminationGracePeriodSeconds": 300, "containers": [
        {"name": "app", "image": "a", "lifecycle": {"preStop": {"exec": {"command": ["/drain"]}}}},
        {"name": "side", "image": "b"}
    ]}});
    let (d, p) = run(&pod, &wait_plan(5));
    assert_eq!(p.pointer("/spec/containers/0/lifecycle/preStop/exec/command/0"), Some(&json!("/drain")));
    assert_eq!(d.containers[0].reason, ContainerReason::ExistingPreStop);
    assert_eq!(d.containers[1].reason, ContainerReason::InjectedWait);
    assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 300, "grace only raised");
    assert!(p.pointer("/spec/containers/0/volumeMounts").is_none(), "the kept container gets no mounts");
}

#[test]
fn the_default_grace_is_raised_to_hold_max_seconds_and_the_app_shutdown() {
    let pod = json!({"kind": "Pod", "spec": {"containers": [{"name": "app", "image": "a"}]}});
    let (_, p) = run(&pod, &wait_plan(5));
    assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 90, "maxSeconds 60 + appShutdownSeconds 30");
    let cmd = &p["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"];
    assert_eq!(cmd[9], "60", "deadline: maxSeconds");
    assert_eq!(p["spec"]["initContainers"][0]["image"], "registry.example/safe-termination@sha256:0123");
    assert_eq!(p["spec"]["initContainers"][0]["command"], json!([wait::WAITER_IMAGE_PATH, "install", wait::WAITER_PATH]));
}

#[test]
fn windows_pods_keep_the_native_sleep() {
    let pod = json!({"kind": "Pod", "spec": {"os": {"name": "windows"}, "containers": [{"name": "app", "image": "a"}]}});
    let (d, p) = run(&pod, &wait_plan(5));
    assert_eq!(d.containers[0].reason, ContainerReason::InjectedSleep);
    assert_eq!(p.pointer("/spec/containers/0/lifecycle/preStop/sleep/seconds"), Some(&json!(5)));
    assert!(p.pointer("/spec/initContainers").is_none());
    assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 35, "the sleep's grace");
}

/// Istio and Linkerd inject after us and the API server reinvokes us: a new classic sidecar gets
/// the waiter (and only its mounts are added); a webhook that replaced the init containers and
/// volumes (dropping ours) gets them back, since a waiter hook without its binary fails and waits
/// nothing.
#[test]
fn reinvocation_adds_only_what_is_missing() {
    let plan = wait_plan(5);
    let pod = json!({"kind": "Pod", "spec": {"containers": [{"name": "app", "image": "a"}]}});
    let (_, mut p) = run(&pod, &plan);
    p["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "istio-proxy", "image": "proxyv2"}));
    let d = mutate_pod(&p, "default", &plan, &AssumeServiceBacked);
    let paths: Vec<String> = d.patch.0.iter().map(|op| op.path().to_string()).collect();
    assert_eq!(paths, ["/spec/containers/1/lifecycle", "/spec/containers/1/volumeMounts"], "{paths:?}");
    let (_, mut q) = run(&pod, &plan);
    q["spec"]["initContainers"] = json!([{"name": "linkerd-init", "image": "l"}]);
    q["spec"]["volumes"] = json!([]);
    q["spec"]["containers"][0]["volumeMounts"] = json!([]);
    let (d, fixed) = run(&q, &plan);
    assert_eq!(d.reason, PodReason::Mutated);
    assert_eq!(named(&fixed, "initContainers", wait::INSTALL_CONTAINER).len(), 1);
    assert_eq!(fixed["spec"]["initContainers"][0]["name"], "linkerd-init", "theirs first, ours appended");
    assert_eq!(fixed["spec"]["volumes"].as_array().unwrap().len(), 2);
    assert_eq!(fixed["spec"]["containers"][0]["volumeMounts"].as_array().unwrap().len(), 2);
}

/// The acceptance, offline: `safe-termination mutate --policy P deploy.yaml -o json`
/// with P's handler `Wait` prints the pod with the waiter, its token and its fallback, every
/// injected part within the Restricted level, and the policy's own name for its ConfigMap key.
#[test]
fn the_mutate_command_prints_the_waiter_with_its_token_and_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, "apiVersion: safetermination.io/v1alpha1\nkind: TerminationPolicy\nmetadata: {name: web, namespace: shop}\nspec:\n  preStop: {handler: Wait, defaultSeconds: 12}\n").unwrap();
    let deploy = dir.path().join("d.yaml");
    std::fs::write(&deploy, "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}\n      containers:\n      - {name: web, image: gcr.io/distroless/static, securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}}\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_safe-termination"))
        .args(["mutate", "--policy", policy.to_str().unwrap(), deploy.to_str().unwrap(), "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pod = &v["results"][0]["pod"];
    let cmd = &pod["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"];
    assert_eq!(cmd[0], wait::WAITER_PATH, "{pod}");
    assert_eq!((cmd[4].as_str(), cmd[5].as_str(), cmd[6].as_str(), cmd[7].as_str()), (Some("--policy"), Some("web"), Some("--fallback-seconds"), Some("12")));
    let token = &named(pod, "volumes", wait::CONFIG_VOLUME)[0]["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(token["audience"], wait::WAIT_AUDIENCE);
    assert_eq!(restricted_violations_of_injected(pod), Vec::<String>::new());
}

/// The waiter's names and paths taken by the pod's own things (a volume of another type, a
/// mount at one of its paths, an init container or a container of its name) give the native
/// sleep with a warning: a clashing mount gets the pod refused, a hook without its binary waits
/// nothing. Pods for Windows nodes by a required node affinity get the sleep too.
#[test]
fn a_pod_whose_names_or_paths_clash_with_the_waiters_gets_the_sleep() {
    let plan = wait_plan(5);
    let base = |spec: Value| json!({"kind": "Pod", "spec": spec});
    let cases = [
        ("volume", base(json!({"volumes": [{"name": wait::BIN_VOLUME, "configMap": {"name": "x"}}], "containers": [{"name": "app", "image": "a"}]}))),
        (
            "path",
            base(
                json!({"containers": [{"name": "app", "image": "a", "volumeMounts": [{"name": "data", "mountPath": wait::BIN_MOUNT_PATH}]}], "volumes": [{"name": "data", "emptyDir": {}}]}),
            ),
        ),
        ("mount", base(json!({"containers": [{"name": "app", "image": "a", "volumeMounts": [{"name": wait::BIN_VOLUME, "mountPath": "/data"}]}]}))),
        ("init", base(json!({"initContainers": [{"name": wait::INSTALL_CONTAINER, "image": "theirs"}], "containers": [{"name": "app", "image": "a"}]}))),
        ("container", base(json!({"containers": [{"name": wait::INSTALL_CONTAINER, "image": "a"}]}))),
        (
            "windows by affinity",
            base(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]}]}}},
                "containers": [{"name": "app", "image": "a"}]})),
        ),
    ];
    for (what, pod) in cases {
        let (d, p) = run(&pod, &plan);
        assert!(d.containers.iter().all(|c| c.reason != ContainerReason::InjectedWait), "{what}: {:?}", d.containers);
        assert_eq!(p.pointer("/spec/containers/0/lifecycle/preStop/sleep/seconds"), Some(&json!(5)), "{what}: {p}");
        assert!(named(&p, "initContainers", wait::INSTALL_CONTAINER).iter().all(|c| c["image"] != "registry.example/safe-termination@sha256:0123"), "{what}");
        if what != "windows by affinity" {
            assert!(d.warnings.iter().any(|w| w.contains("no preStop waiter")), "{what}: {:?}", d.warnings);
        }
    }
}

#[test]
fn audit_mode_says_the_waiter_and_its_grace() {
    let mut plan = wait_plan(5);
    plan.default_policy.as_mut().unwrap().spec.mode = safe_termination::core::crd::EnforcementMode::Audit;
    let pod = json!({"kind": "Pod", "spec": {"containers": [{"name": "app", "image": "a"}]}});
    let (d, p) = run(&pod, &plan);
    assert!(d.warnings.iter().any(|w| w.contains("the preStop waiter (fallback 5s)") && w.contains("grace 90s")), "{:?}", d.warnings);
    assert!(p.pointer("/spec/initContainers").is_none() && p.pointer("/spec/containers/0/lifecycle").is_none());
}

/// The shared AdmissionReview (../shared/cases/admission, copied to tests/data/admission)
/// through the webhook's whole answer with a `Wait` policy, and Linkerd's injector patch (the
/// shared case) applied after ours and ours again after theirs (reinvocation): the waiter, its
/// init container after theirs, and nothing added twice.
#[test]
fn the_shared_admission_review_and_linkerds_patch_compose_with_the_waiter() {
    use base64::Engine as _;
    let plan = wait_plan(7);
    let body = std::fs::read("tests/data/admission/admissionreview-pod-create.json").unwrap();
    let out = safe_termination::webhook::review(&body, &plan, &AssumeServiceBacked);
    assert_eq!(out.status, 200);
    let v: Value = serde_json::from_slice(&out.body).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    let bytes = base64::engine::general_purpose::STANDARD.decode(v["response"]["patch"].as_str().expect("a patch")).unwrap();
    let ours: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let req: Value = serde_json::from_slice(&body).unwrap();
    let mut pod = req["request"]["object"].clone();
    pod["spec"]["initContainers"] = json!([]);
    json_patch::patch(&mut pod, &ours.0).unwrap();
    assert_eq!(pod.pointer("/spec/containers/0/lifecycle/preStop/exec/command/0"), Some(&json!(wait::WAITER_PATH)));
    let theirs: json_patch::Patch = serde_json::from_slice(&std::fs::read("tests/data/admission/other-webhook-patch-linkerd.json").unwrap()).unwrap();
    json_patch::patch(&mut pod, &theirs.0).expect("their patch applies after ours");
    let again = mutate_pod(&pod, "example-ns", &plan, &AssumeServiceBacked);
    json_patch::patch(&mut pod, &again.patch.0).unwrap();
    assert_eq!(named(&pod, "initContainers", wait::INSTALL_CONTAINER).len(), 1, "{}", pod["spec"]["initContainers"]);
    assert_eq!(named(&pod, "volumes", wait::BIN_VOLUME).len(), 1);
    assert!(mutate_pod(&pod, "example-ns", &plan, &AssumeServiceBacked).patch.0.is_empty(), "idempotent after both");
}
