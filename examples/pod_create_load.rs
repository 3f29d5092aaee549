//! Pod CREATE latency through a real kube-apiserver with no mutation, with the webhook, and
//! with the MutatingAdmissionPolicy (docs/benchmarks/pod-create-latency.md "Pod CREATE latency";
//! driven by `bench/pod-create-latency.sh`, which starts the API server and the webhook).
//!
//! Method (Kyverno's published load test, kyverno/load-testing: concurrent virtual users each
//! creating Pods in a loop for a fixed time, latency per request as the client sees it): for
//! each number of creators (`--creators`, default 1, 10 and 50) and each configuration in turn
//! (`none`, `webhook`, `policy`: the baseline measured next to the others in the same run; and
//! `policy-floor`, a MutatingAdmissionPolicy with one constant mutation, to tell the policy
//! machinery's cost from the rules'), the
//! configuration is applied and checked in effect, then the creators POST real Pods (stored,
//! never scheduled: the API server has no scheduler) for `--duration-seconds`; each created pod
//! is checked to be mutated (webhook, policy) or not (none). The pods are deleted between runs,
//! untimed. Written to `--out`: results.json, results.md (table) and results.svg (picture).
//!
//! ```text
//! KUBECONFIG=... cargo run --release --example pod_create_load -- \
//!     --webhook-url https://127.0.0.1:28443/mutate --webhook-ca-file ca.crt --policy-file policy.yaml \
//!     [--pre-stop-seconds 10] [--creators 1,10,50] [--duration-seconds 30] [--out DIR]
//! ```

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use safe_termination::controller::admission::{AdmissionMetrics, apply_parameters, apply_policy, remove_policy};
use safe_termination::core::admission::params::parameters;
use safe_termination::core::admission::policy::PolicyObjects;
use safe_termination::core::crd::TerminationPolicy;
use safe_termination::core::plan::{Capabilities, Plan, PlanPolicy};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NAMESPACE: &str = "load";
const SYSTEM: &str = "load-system";
const NAME: &str = "pod-create-load";
/// The floor configuration's policy and binding.
const FLOOR: &str = "pod-create-load-floor";

/// Flags (see the module docs).
#[derive(clap::Parser)]
struct Args {
    /// The webhook's URL (a `safe-termination webhook` with the same policy).
    #[arg(long)]
    webhook_url: String,
    /// CA of the webhook's serving certificate, PEM.
    #[arg(long)]
    webhook_ca_file: std::path::PathBuf,
    /// The TerminationPolicy both backends apply (the webhook's `--policy`).
    #[arg(long)]
    policy_file: std::path::PathBuf,
    /// The preStop seconds both backends inject (the webhook's `--pre-stop-seconds`).
    #[arg(long, default_value_t = 10)]
    pre_stop_seconds: u32,
    /// Numbers of concurrent creators, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    creators: Vec<usize>,
    /// Configurations, comma-separated, in the order run at each number of creators.
    #[arg(long, value_delimiter = ',', default_value = "none,webhook,policy,policy-floor")]
    configs: Vec<String>,
    /// Seconds per run.
    #[arg(long, default_value_t = 30)]
    duration_seconds: u64,
    /// Output directory.
    #[arg(long, default_value = "target/pod-create-latency")]
    out: std::path::PathBuf,
}

/// One run's figures.
#[derive(serde::Serialize, Clone)]
struct RunResult {
    config: String,
    creators: usize,
    created: usize,
    failed: usize,
    /// Created pods that carried the expected mutation state (mutated: webhook, policy; not
    /// mutated: none).
    as_expected: usize,
    seconds: f64,
    per_second: f64,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
}

fn percentile_ms(sorted_micros: &[u32], q: f64) -> f64 {
    if sorted_micros.is_empty() {
        return f64::NAN;
    }
    // nearest rank
    let rank = ((q * sorted_micros.len() as f64).ceil() as usize).clamp(1, sorted_micros.len());
    f64::from(sorted_micros[rank - 1]) / 1000.0
}

fn pod_body() -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "load-", "labels": {"app": "load"}},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap()
}

fn mutated(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| s.containers.iter().all(|c| c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).is_some()))
}

async fn configure(client: &Client, config: &str, args: &Args, objects: &PolicyObjects, plan: &Plan) {
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let metrics = AdmissionMetrics::default();
    if config != "webhook" {
        let _ = hooks.delete(NAME, &DeleteParams::default()).await;
    }
    if config != "policy" {
        remove_policy(client, NAME).await.expect("remove the policy");
    }
    if config != "policy-floor" {
        remove_policy(client, FLOOR).await.expect("remove the floor policy");
    }
    match config {
        "webhook" => {
            use base64::Engine as _;
            let ca = std::fs::read(&args.webhook_ca_file).expect("read --webhook-ca-file");
            let cfg: MutatingWebhookConfiguration = serde_json::from_value(json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": NAME},
                "webhooks": [{
                    "name": "prestop.safetermination.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                    "failurePolicy": "Ignore", "timeoutSeconds": 5, "reinvocationPolicy": "IfNeeded",
                    "clientConfig": {"url": args.webhook_url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
                    "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
                }]
            }))
            .unwrap();
            hooks.patch(NAME, &PatchParams::apply("pod-create-load").force(), &Patch::Apply(&cfg)).await.expect("apply the webhook configuration");
        }
        "policy" => {
            apply_policy(client, objects, &metrics).await.expect("apply the MutatingAdmissionPolicy");
            apply_parameters(client, objects, &parameters(plan), &metrics).await.expect("apply the parameters");
        }
        "policy-floor" => {
            // the MutatingAdmissionPolicy machinery with the least CEL: no parameters, one field
            // read, one constant add: what any policy costs the API server before its rules
            let policy = json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
                "metadata": {"name": FLOOR, "labels": {"app.kubernetes.io/managed-by": "safe-termination"}},
                "spec": {
                    "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
                    "failurePolicy": "Ignore", "reinvocationPolicy": "IfNeeded",
                    "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression":
                        "has(object.spec.containers[0].lifecycle) ? [] : [JSONPatch{op: 'add', path: '/spec/containers/0/lifecycle', value: Object.spec.containers.lifecycle{preStop: Object.spec.containers.lifecycle.preStop{sleep: Object.spec.containers.lifecycle.preStop.sleep{seconds: 10}}}}]"}}]
                }
            });
            let binding = json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
                "metadata": {"name": FLOOR, "labels": {"app.kubernetes.io/managed-by": "safe-termination"}},
                "spec": {"policyName": FLOOR, "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}}}
            });
            use safe_termination::controller::admission::{binding_resource, policy_resource};
            for (resource, obj) in [(policy_resource(), policy), (binding_resource(), binding)] {
                let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
                api.patch(FLOOR, &PatchParams::apply("pod-create-load").force(), &Patch::Apply(&obj)).await.expect("apply the floor policy");
            }
        }
        "none" => {}
        other => panic!("unknown configuration {other:?}: use none, webhook, policy or policy-floor"),
    }
    // in effect: five dry-run creates in a row answered as the configuration says
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let want = config != "none";
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut in_a_row = 0;
    while in_a_row < 5 {
        let p = pods.create(&PostParams { dry_run: true, ..Default::default() }, &pod_body()).await.expect("dry-run create");
        in_a_row = if mutated(&p) == want { in_a_row + 1 } else { 0 };
        assert!(Instant::now() < deadline, "configuration {config} not in effect after 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn run(client: &Client, config: &str, creators: usize, duration: Duration) -> RunResult {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let want = config != "none";
    let started = Instant::now();
    let deadline = started + duration;
    let per_creator: Vec<(Vec<u32>, usize, usize)> = futures::stream::iter(0..creators)
        .map(|_| {
            let pods = pods.clone();
            async move {
                let (mut latencies, mut failed, mut as_expected) = (Vec::new(), 0usize, 0usize);
                let body = pod_body();
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    let r = pods.create(&PostParams::default(), &body).await;
                    let micros = u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX);
                    match r {
                        Ok(p) => {
                            latencies.push(micros);
                            as_expected += usize::from(mutated(&p) == want);
                        }
                        Err(_) => failed += 1,
                    }
                }
                (latencies, failed, as_expected)
            }
        })
        .buffer_unordered(creators)
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    let mut all: Vec<u32> = per_creator.iter().flat_map(|(l, _, _)| l.iter().copied()).collect();
    all.sort_unstable();
    let failed = per_creator.iter().map(|(_, f, _)| f).sum();
    let as_expected = per_creator.iter().map(|(_, _, e)| e).sum();
    // untimed clean-up: unscheduled pods are deleted at once
    let _ = pods.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    RunResult {
        config: config.into(),
        creators,
        created: all.len(),
        failed,
        as_expected,
        seconds,
        per_second: all.len() as f64 / seconds,
        p50_ms: percentile_ms(&all, 0.50),
        p95_ms: percentile_ms(&all, 0.95),
        p99_ms: percentile_ms(&all, 0.99),
    }
}

fn baseline(results: &[RunResult], creators: usize) -> Option<&RunResult> {
    results.iter().find(|r| r.config == "none" && r.creators == creators)
}

fn markdown(results: &[RunResult]) -> String {
    let mut s = String::from(
        "| creators | configuration | pods created | failed | as expected | pods/s | p50 ms | p95 ms | p99 ms | p99 added vs none | p99 / none |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let (added, ratio) = match baseline(results, r.creators) {
            Some(b) if r.config != "none" => (format!("{:+.2} ms", r.p99_ms - b.p99_ms), format!("{:.2}", r.p99_ms / b.p99_ms)),
            _ => ("".into(), "".into()),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} |\n",
            r.creators, r.config, r.created, r.failed, r.as_expected, r.per_second, r.p50_ms, r.p95_ms, r.p99_ms, added, ratio
        ));
    }
    s
}

/// Grouped bars: per number of creators, p50 (light) and p99 (dark) per configuration.
fn svg(results: &[RunResult]) -> String {
    let configs: Vec<&str> = {
        let mut c: Vec<&str> = Vec::new();
        for r in results {
            if !c.contains(&r.config.as_str()) {
                c.push(&r.config);
            }
        }
        c
    };
    let mut creators: Vec<usize> = results.iter().map(|r| r.creators).collect();
    creators.dedup();
    let colors = ["#888888", "#1f77b4", "#2ca02c", "#d62728"];
    let (w, h, left, top, bottom) = (760.0, 360.0, 60.0, 40.0, 60.0);
    let max = results.iter().map(|r| r.p99_ms).fold(0.0f64, f64::max).max(1.0) * 1.1;
    let plot_h = h - top - bottom;
    let group_w = (w - left - 20.0) / creators.len().max(1) as f64;
    let bar_w = group_w * 0.8 / configs.len().max(1) as f64;
    let y = |ms: f64| top + plot_h - ms / max * plot_h;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"{left}\" y=\"20\" font-size=\"14\">Pod CREATE latency through the API server: p50 (light) and p99 (dark), ms</text>\n\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        top + plot_h,
        w - 20.0,
        top + plot_h
    );
    for i in 0..=4 {
        let v = max * f64::from(i) / 4.0;
        out.push_str(&format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.1}</text><line x1=\"{left}\" y1=\"{:.1}\" x2=\"{}\" y2=\"{:.1}\" stroke=\"#eee\"/>\n",
            left - 5.0,
            y(v) + 4.0,
            y(v),
            w - 20.0,
            y(v)
        ));
    }
    for (g, n) in creators.iter().enumerate() {
        let x0 = left + g as f64 * group_w + group_w * 0.1;
        out.push_str(&format!("<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{n} creator(s)</text>\n", x0 + group_w * 0.4, top + plot_h + 18.0));
        for (c, config) in configs.iter().enumerate() {
            let Some(r) = results.iter().find(|r| r.creators == *n && r.config == *config) else { continue };
            let x = x0 + c as f64 * bar_w;
            let color = colors[c % colors.len()];
            out.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{color}\" opacity=\"0.45\"/>\n\
                 <rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{color}\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{:.1}</text>\n",
                y(r.p50_ms),
                bar_w * 0.9,
                top + plot_h - y(r.p50_ms),
                x + bar_w * 0.3,
                y(r.p99_ms),
                bar_w * 0.3,
                top + plot_h - y(r.p99_ms),
                x + bar_w * 0.45,
                y(r.p99_ms) - 3.0,
                r.p99_ms
            ));
        }
    }
    for (c, config) in configs.iter().enumerate() {
        let x = left + c as f64 * 130.0;
        out.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{config}</text>\n",
            h - 22.0,
            colors[c % colors.len()],
            x + 16.0,
            h - 12.0
        ));
    }
    out.push_str("</svg>\n");
    out
}

#[tokio::main]
async fn main() {
    let args: Args = clap::Parser::parse();
    let client = Client::try_default().await.expect("a Kubernetes client from KUBECONFIG");
    let text = std::fs::read_to_string(&args.policy_file).expect("read --policy-file");
    let policy: TerminationPolicy = serde_saphyr::from_str(&text).expect("--policy-file is a TerminationPolicy");
    let plan = Plan {
        policies: Vec::new(),
        default_policy: Some(PlanPolicy { namespace: SYSTEM.into(), name: "load".into(), spec: policy.spec, pre_stop_seconds: args.pre_stop_seconds }),
        capabilities: Capabilities { native_sleep: true },
        wait: Default::default(),
    };
    for ns in [NAMESPACE, SYSTEM] {
        let api: Api<Namespace> = Api::all(client.clone());
        let _ = api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap()).await;
        // no controller-manager: the default ServiceAccount is made here
        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        let _ = sa.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap()).await;
    }
    let objects = PolicyObjects {
        name: NAME.into(),
        params_namespace: SYSTEM.into(),
        namespace_selector: json!({"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}),
        owner: None,
    };
    std::fs::create_dir_all(&args.out).expect("create --out");
    let mut results = Vec::new();
    for &creators in &args.creators {
        for config in &args.configs {
            configure(&client, config, &args, &objects, &plan).await;
            let r = run(&client, config, creators, Duration::from_secs(args.duration_seconds)).await;
            eprintln!(
                "[pod-create-load] {creators:>3} creator(s) {config:<8} {} pods ({} failed, {} as expected) {:.0}/s p50 {:.2} ms p95 {:.2} ms p99 {:.2} ms",
                r.created, r.failed, r.as_expected, r.per_second, r.p50_ms, r.p95_ms, r.p99_ms
            );
            results.push(r);
        }
    }
    configure(&client, "none", &args, &objects, &plan).await;
    let json: Value = json!({"duration_seconds": args.duration_seconds, "pre_stop_seconds": args.pre_stop_seconds, "runs": results});
    std::fs::write(args.out.join("results.json"), serde_json::to_string_pretty(&json).unwrap()).expect("write results.json");
    std::fs::write(args.out.join("results.md"), markdown(&results)).expect("write results.md");
    std::fs::write(args.out.join("results.svg"), svg(&results)).expect("write results.svg");
    print!("{}", markdown(&results));
}
