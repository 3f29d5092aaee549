//! `safe-termination mutate` and `safe-termination review`: run the webhook's decision offline on
//! manifests (Pods and workloads' pod templates) or on an AdmissionReview request.

use crate::cli::{Error, OutputFormat, load_policy, policy_spec_of, whole_in};
use crate::core::crd::TerminationPolicySpec;
use crate::core::mutate::{PodMutation, mutate_pod};
use crate::core::plan::{Capabilities, Plan, PlanPolicy};
use crate::core::selector::{AssumeServiceBacked, Labels, ServiceIndex, StaticServiceIndex};
use crate::core::sizing;
use crate::webhook::review;
use serde::Serialize;
use serde_json::{Value, json};
use std::fmt::Write as _;

/// `--native-sleep`: whether the target API server keeps `lifecycle.preStop.sleep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NativeSleep {
    /// Assume a current API server (1.30+, gate on; GA in 1.34): native sleep.
    Auto,
    /// Native sleep is kept.
    True,
    /// Native sleep is dropped (1.29, or the gate off): exec fallback or skip.
    False,
}

/// Flags shared by `mutate`, `review` and the stand-alone `webhook` (a static plan).
#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// A TerminationPolicy YAML/JSON for every namespace the input holds no TerminationPolicy of (a policy in the input serves its own namespace; the defaults otherwise).
    #[arg(long, value_name = "FILE", env = "SAFE_TERMINATION_POLICY")]
    pub policy: Option<String>,
    /// The preStop sleep to inject, seconds (0 to 3600, the CRD's bound on maxSeconds), capped
    /// at the policy's preStop.maxSeconds (60 by default; a warning says so); without it the
    /// policy's defaultSeconds (no measurement) is used.
    #[arg(long, env = "SAFE_TERMINATION_PRE_STOP_SECONDS", allow_negative_numbers = true, value_parser = whole_in(0u32, 3600, "a whole number of seconds"))]
    pub pre_stop_seconds: Option<u32>,
    /// Whether the API server keeps native preStop sleep.
    #[arg(long, value_enum, default_value_t = NativeSleep::Auto, env = "SAFE_TERMINATION_NATIVE_SLEEP")]
    pub native_sleep: NativeSleep,
}

impl PlanArgs {
    /// Builds the static plan: one default policy for every namespace.
    pub fn plan(&self) -> Result<Plan, Error> {
        let (spec, named): (TerminationPolicySpec, Option<String>) = match &self.policy {
            Some(p) => load_policy(p)?,
            None => (TerminationPolicySpec::default(), None),
        };
        let pre_stop_seconds = self.pre_stop_for(&spec);
        // the policy's own name (the waiter's ConfigMap key is `<name>.preStopSeconds`), else
        // the file's stem
        let stem = self.policy.as_deref().map_or("static", |p| std::path::Path::new(p).file_stem().and_then(|s| s.to_str()).unwrap_or("static"));
        let name = named.as_deref().unwrap_or(stem);
        Ok(Plan {
            policies: Vec::new(),
            default_policy: Some(PlanPolicy { namespace: String::new(), name: name.to_string(), spec, pre_stop_seconds }),
            capabilities: Capabilities { native_sleep: self.native_sleep != NativeSleep::False },
            wait: Default::default(),
        })
    }

    /// The sleep served for `spec`: `--pre-stop-seconds` capped at the policy's maxSeconds
    /// (0: no sleep), or without it the policy's unmeasured default.
    fn pre_stop_for(&self, spec: &TerminationPolicySpec) -> u32 {
        match self.pre_stop_seconds {
            Some(s) => {
                let max = sizing::pre_stop_bounds(&spec.pre_stop).1;
                if s > max {
                    tracing::warn!("--pre-stop-seconds {s} is above the policy's preStop.maxSeconds {max}: {max} s is served");
                }
                s.min(max)
            }
            None => sizing::unmeasured_pre_stop(spec),
        }
    }
}

/// The TerminationPolicies among the inputs, as the webhook's plan holds them: each serves its
/// namespace (the document's, else `default_ns`), ahead of the default policy, with the sleep
/// of [`PlanArgs::pre_stop_for`]. Errors name the document (`FILE#N`) whose policy is invalid.
fn input_policies(docs: &[(String, Vec<Value>)], default_ns: &str, args: &PlanArgs) -> Result<Vec<PlanPolicy>, Error> {
    let mut out = Vec::new();
    for (file, d) in docs {
        for (n, doc) in d.iter().enumerate() {
            if doc.get("kind").and_then(Value::as_str) != Some("TerminationPolicy") {
                continue;
            }
            let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            let spec = policy_spec_of(doc, &format!("{file}#{n} TerminationPolicy/{name}"))?;
            let namespace = doc.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(default_ns).to_string();
            out.push(PlanPolicy { pre_stop_seconds: args.pre_stop_for(&spec), namespace, name, spec });
        }
    }
    // the order the operator's plan has (controller::planner)
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(out)
}

/// Arguments of `mutate`.
#[derive(Debug, clap::Args)]
pub struct MutateArgs {
    /// Manifests: Pods or Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs, CronJobs
    /// (multi-document YAML, flow-style YAML or JSON; `-` for standard input).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<String>,
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Namespace for objects that name none.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// One pod template's result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MutateResult {
    /// `FILE#N Kind/name` (N = document index from 0).
    pub source: String,
    /// RFC 6902 operations.
    pub patch: Value,
    /// Warnings the webhook would return.
    pub warnings: Vec<String>,
    /// Pod-level reason.
    pub reason: Option<crate::core::mutate::PodReason>,
    /// Per-container reasons.
    pub containers: Vec<crate::core::mutate::ContainerMutation>,
    /// The Pod after the patch (absent for unsupported kinds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<Value>,
    /// For kinds without a pod template: why nothing was done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// The pod template of a workload (or a Pod itself), as a Pod, with the namespace it would be
/// created in. Errors for kinds without a pod template.
pub fn pod_of(doc: &Value, default_ns: &str) -> Result<(Value, String), Error> {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    let ns = doc.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(default_ns).to_string();
    let template = match kind {
        "Pod" => return Ok((doc.clone(), ns)),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" | "ReplicationController" => doc.pointer("/spec/template"),
        "CronJob" => doc.pointer("/spec/jobTemplate/spec/template"),
        "" => return Err(Error::Input("document has no kind".into())),
        other => return Err(Error::Input(format!("kind {other} has no pod template: not mutated"))),
    };
    let template = template.filter(|t| t.is_object()).ok_or_else(|| Error::Input(format!("{kind} has no pod template")))?;
    let mut meta = template.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.insert("namespace".into(), Value::String(ns.clone()));
    }
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template.get("spec").cloned().unwrap_or_else(|| json!({}))});
    Ok((pod, ns))
}

/// Reads every document of a YAML/JSON file (or `-`), flattening lists ([`flatten`]), dropping empty
/// ones. Errors (input, exit 1): the file cannot be read or is larger than the limit
/// ([`crate::sources::read_file`]), it is not YAML ([`documents_of`]), or it holds no document
/// at all (empty, or only comments and `---`: a cut-off file or a wrong path, as for `analyze`).
pub fn documents(path: &str) -> Result<Vec<Value>, Error> {
    let text = crate::sources::read_file(path).map_err(|e| Error::Input(e.to_string()))?;
    let origin = if path == "-" { "<stdin>" } else { path };
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| Error::Input(crate::cli::yaml_error(origin, &text, &e)))?;
    if docs.iter().all(Value::is_null) {
        return Err(Error::Input(format!("{origin}: empty ({} bytes, no YAML document): nothing to read; is this the right file?", text.len())));
    }
    documents_of_values(docs, origin)
}

/// The documents of `text` (the contents of the file `path`, named in errors) as [`documents`]
/// reads them: multi-document YAML or JSON, lists flattened ([`flatten`]), empty documents dropped.
///
/// Errors: text that is not YAML or JSON, and a document that is not a mapping (a Kubernetes
/// object is one: a string, number or sequence means the file is something else, such as
/// Markdown, which YAML reads as one string), naming `path` and the document's position.
pub fn documents_of(text: &str, path: &str) -> Result<Vec<Value>, Error> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| Error::Input(crate::cli::yaml_error(path, text, &e)))?;
    documents_of_values(docs, path)
}

/// [`documents_of`] after the parse: each document checked and flattened.
fn documents_of_values(docs: Vec<Value>, path: &str) -> Result<Vec<Value>, Error> {
    let mut out = Vec::new();
    for (n, d) in docs.into_iter().enumerate() {
        let what = match &d {
            Value::Null | Value::Object(_) => None,
            Value::String(_) => Some("a string"),
            Value::Number(_) => Some("a number"),
            Value::Bool(_) => Some("a boolean"),
            Value::Array(_) => Some("a sequence"),
        };
        if let Some(what) = what {
            return Err(Error::Input(format!("{path}: document {n} is {what}, not a Kubernetes object (a mapping with apiVersion and kind)")));
        }
        flatten(d, &mut out);
    }
    Ok(out)
}

/// Appends `d` to `out`, or the items of a list: `kind: List` (kubectl's, each item with its own
/// kind) or a typed list such as `DeploymentList` (the API server's, whose items carry no kind:
/// each gets the list's kind less `List`, and its apiVersion, unless it names its own).
fn flatten(mut d: Value, out: &mut Vec<Value>) {
    if d.is_null() {
        return;
    }
    let kind = d.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
    if let Some(item_kind) = kind.strip_suffix("List")
        && d.get("items").is_some_and(Value::is_array)
        && let Some(Value::Array(items)) = d.get_mut("items").map(Value::take)
    {
        let api_version = d.get("apiVersion").cloned();
        for mut item in items {
            if let Some(o) = item.as_object_mut().filter(|_| !item_kind.is_empty()) {
                o.entry("kind").or_insert_with(|| Value::String(item_kind.to_string()));
                if let Some(v) = &api_version {
                    o.entry("apiVersion").or_insert_with(|| v.clone());
                }
            }
            flatten(item, out);
        }
        return;
    }
    out.push(d);
}

fn service_index(docs: &[(String, Vec<Value>)], default_ns: &str) -> Option<StaticServiceIndex> {
    let services: Vec<(String, Labels)> = docs
        .iter()
        .flat_map(|(_, d)| d.iter())
        .filter(|d| d.get("kind").and_then(Value::as_str) == Some("Service"))
        .map(|d| {
            let ns = d.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(default_ns).to_string();
            let sel = d
                .pointer("/spec/selector")
                .and_then(Value::as_object)
                .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect())
                .unwrap_or_default();
            (ns, sel)
        })
        .collect();
    if services.is_empty() { None } else { Some(StaticServiceIndex { services }) }
}

/// Runs `mutate`: returns the rendered output, or an input error (exit 1).
pub fn run_mutate(args: &MutateArgs) -> Result<String, Error> {
    let mut plan = args.plan.plan()?;
    let mut all = Vec::new();
    for f in &args.files {
        all.push((f.clone(), documents(f)?));
    }
    // TerminationPolicies in the inputs serve their namespaces, as in the cluster
    plan.policies = input_policies(&all, &args.namespace, &args.plan)?;
    // Services in the inputs define scope ServiceBacked; with none, every pod counts as backed.
    let index = service_index(&all, &args.namespace);
    let services: &dyn ServiceIndex = match &index {
        Some(i) => i,
        None => &AssumeServiceBacked,
    };
    let mut results = Vec::new();
    // Services and TerminationPolicies: read (scope ServiceBacked, the namespaces' policies), not
    // mutated
    let mut read: Vec<String> = Vec::new();
    for (file, docs) in &all {
        for (n, doc) in docs.iter().enumerate() {
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("?");
            let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
            let source = format!("{file}#{n} {kind}/{name}");
            if kind == "Service" || kind == "TerminationPolicy" {
                read.push(source);
                continue;
            }
            match pod_of(doc, &args.namespace) {
                Err(why) => results.push(MutateResult {
                    source,
                    patch: json!([]),
                    warnings: Vec::new(),
                    reason: None,
                    containers: Vec::new(),
                    pod: None,
                    skipped: Some(why.to_string()),
                }),
                Ok((pod, ns)) => {
                    let d: PodMutation = mutate_pod(&pod, &ns, &plan, services);
                    let mut patched = pod.clone();
                    json_patch::patch(&mut patched, &d.patch.0)
                        .map_err(|e| Error::Input(format!("{source}: internal error, the patch does not apply: {e}")))?;
                    results.push(MutateResult {
                        source,
                        patch: serde_json::to_value(&d.patch).unwrap_or(Value::Null),
                        warnings: d.warnings,
                        reason: Some(d.reason),
                        containers: d.containers,
                        pod: Some(patched),
                        skipped: None,
                    });
                }
            }
        }
    }
    let doc = json!({
        "results": results,
        "read": read,
        "serviceScope": if index.is_some() { "services in the inputs" } else { "every pod assumed service-backed (no Service in the inputs)" }
    });
    Ok(match args.output {
        OutputFormat::Json => serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n",
        OutputFormat::Yaml => serde_saphyr::to_string(&doc).unwrap_or_default(),
        OutputFormat::Text if results.is_empty() => crate::cli::printable(nothing_to_mutate(&all)),
        OutputFormat::Text => crate::cli::printable(render_text(&results, &read)),
    })
}

/// The text output when no input held a document to mutate: each file and why (no document at
/// all, or only Services and TerminationPolicies, which are read, not mutated).
fn nothing_to_mutate(all: &[(String, Vec<Value>)]) -> String {
    let files: Vec<String> = all
        .iter()
        .map(|(file, docs)| match docs.len() {
            0 => format!("{file} (no document)"),
            n => format!("{file} ({n} document(s), only Services and TerminationPolicies)"),
        })
        .collect();
    format!("nothing to mutate: {}\n", files.join(", "))
}

/// The text output: each mutated (or skipped) document, then the Services and
/// TerminationPolicies that were read as inputs, not mutated.
fn render_text(results: &[MutateResult], read: &[String]) -> String {
    let mut s = String::new();
    for r in results {
        let _ = writeln!(s, "{}", r.source);
        if let Some(why) = &r.skipped {
            let _ = writeln!(s, "  skipped: {why}");
            continue;
        }
        if let Some(reason) = r.reason {
            let _ = writeln!(s, "  decision: {reason:?}");
        }
        for c in &r.containers {
            let _ = writeln!(s, "  container {}: {:?}", c.name, c.reason);
        }
        for op in r.patch.as_array().into_iter().flatten() {
            let _ = writeln!(s, "  patch: {op}");
        }
        for w in &r.warnings {
            let _ = writeln!(s, "  warning: {w}");
        }
    }
    for source in read {
        let _ = writeln!(s, "{source}\n  read, not mutated (Services define scope ServiceBacked; TerminationPolicies serve their namespace)");
    }
    s
}

/// Arguments of `review`.
#[derive(Debug, clap::Args)]
pub struct ReviewArgs {
    /// An AdmissionReview request (JSON), or `-` for standard input.
    #[arg(value_name = "FILE")]
    pub file: String,
    #[command(flatten)]
    pub plan: PlanArgs,
}

/// Runs `review`: the exact response body, or the 400 message as an error (exit 1). The input is
/// read as `analyze` and `mutate` read theirs ([`crate::sources::read_file_bytes`]: at most 64
/// MiB, a larger file or an endless one such as `/dev/zero` is refused without being held); an
/// empty one (no bytes, or blank) is an error naming it.
pub fn run_review(args: &ReviewArgs) -> Result<String, Error> {
    let plan = args.plan.plan()?;
    let body = crate::sources::read_file_bytes(&args.file).map_err(|e| Error::Input(e.to_string()))?;
    let origin = if args.file == "-" { "<stdin>" } else { args.file.as_str() };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::Input(format!("{origin}: empty ({} bytes): no AdmissionReview to read; is this the right file?", body.len())));
    }
    let out = review(&body, &plan, &AssumeServiceBacked);
    let text = String::from_utf8_lossy(&out.body).into_owned();
    // the webhook's 400 message, named by the file it came from (docs/cli.md: every input error
    // names its file)
    if out.status == 200 { Ok(text + "\n") } else { Err(Error::Input(format!("{origin}: {}", text.trim_end()))) }
}
