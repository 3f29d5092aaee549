//! The pod mutation engine: (Pod, plan, Service index) -> a JSON Patch, warnings and a reason per
//! container. Pure and total: any JSON value is accepted and answered, never a panic.
//!
//! Rules (docs/webhook.md R1-R11, each tested):
//! - R1 an existing `lifecycle.preStop` is kept as it is (a handler holds one action); `postStart`
//!   is never touched; an existing sleep shorter than the plan is reported, not rewritten.
//! - R2 `terminationGracePeriodSeconds` is only ever raised.
//! - R3 the sleep never exceeds the resulting grace (raised in the same patch); an explicit
//!   grace of 0 means "no grace": skip with a warning.
//! - R4 native sleep only when the probe says the API server keeps it ([`Capabilities`]).
//! - R5 the `exec sleep N` fallback only for images on the policy's allow-list, never on Windows.
//! - R6 only `spec.containers` (init containers and native sidecars untouched); classic sidecars
//!   in `containers` get the same sleep as the app.
//! - R7 run-to-completion pods (restartPolicy Never/OnFailure) and R8 mirror pods are left alone.
//! - R11 idempotent: the engine run on its own output yields an empty patch.
//! - R12 handler `Wait` ([`crate::core::wait`]): the waiter's `preStop.exec` in each container,
//!   its init container, emptyDir and projected volume added once per pod (a reinvocation that
//!   finds them adds only the new containers' mounts), the grace raised to hold the waiter's
//!   deadline (`maxSeconds`, leaving `appShutdownSeconds`); Windows pods get the native sleep.
//!
//! Bounded work: a pod with more than [`MAX_POD_CONTAINERS`] containers and init containers
//! together ([`PodReason::TooManyContainers`]) or more than [`MAX_POD_LABELS`] labels
//! ([`PodReason::TooManyLabels`]) is admitted unchanged with a warning, decided before any
//! per-container or per-label work, so one request's patch, warnings, per-container reasons and
//! label copies hold at most that many entries.
//!
//! Opt-outs: annotation `safetermination.io/skip: "true"` on the pod, and
//! `safetermination.io/skip-containers: a,b`. Mutated pods are annotated with
//! `safetermination.io/prestop-seconds` and `safetermination.io/policy`.

use super::plan::{Capabilities, Plan, PlanPolicy};
use crate::core::annotations::{
    ANNOTATION_AUDIT_PRESTOP_SECONDS, ANNOTATION_MIRROR, ANNOTATION_POLICY, ANNOTATION_PRESTOP_SECONDS, ANNOTATION_SKIP, ANNOTATION_SKIP_CONTAINERS,
};
use crate::core::crd::{EnforcementMode, PreStopHandler, Scope};
use crate::core::selector::{Labels, ServiceIndex};
use crate::core::sizing::{KUBERNETES_DEFAULT_GRACE_SECONDS, grace_seconds};
use crate::core::wait::{self as wait, WaitInjection};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation};
use serde::Serialize;
use serde_json::{Value, json};

/// Why the pod as a whole was or was not mutated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PodReason {
    /// At least one operation was emitted.
    Mutated,
    /// Audit mode: annotations only.
    Audited,
    /// In scope, but nothing to change (already mutated: reinvocation, or every container kept
    /// its own hook and the grace is already enough).
    NoChange,
    /// Not a Pod object.
    NotAPod,
    /// No policy applies in this namespace (and no default policy).
    NoPolicy,
    /// The policy is Disabled.
    PolicyDisabled,
    /// `safetermination.io/skip: "true"`.
    OptedOut,
    /// restartPolicy Never or OnFailure (R7).
    RunToCompletion,
    /// A mirror pod (R8).
    MirrorPod,
    /// Scope ServiceBacked and no Service selects the pod.
    NotServiceBacked,
    /// terminationGracePeriodSeconds is explicitly 0 (R3).
    GraceZero,
    /// The plan's sleep is 0 s.
    ZeroSleep,
    /// No container could be given a hook (R4/R5): warned.
    NoUsableHandler,
    /// More than [`MAX_POD_CONTAINERS`] containers and init containers: left unchanged, warned.
    TooManyContainers,
    /// More than [`MAX_POD_LABELS`] labels: left unchanged, warned.
    TooManyLabels,
}

/// The most containers and init containers together a pod may have for the engine to mutate it
/// (a pod with more is admitted unchanged with a warning). The bound on one admission request's
/// work: the patch, the warnings and the per-container reasons grow with the containers. Real
/// pods have a few to tens of containers; the API server sets no limit, and a 3 MiB request
/// (its own limit) can name about 80,000 `{"name":"cN","image":"x"}` containers.
pub const MAX_POD_CONTAINERS: usize = 256;

/// The warning of [`PodReason::TooManyContainers`] (at most 119 characters, so
/// [`short_warning`] sends it whole).
pub fn too_many_containers_warning() -> String {
    format!("safe-termination: more than {MAX_POD_CONTAINERS} containers and init containers; pod admitted unchanged")
}

/// The most labels a pod may have for the engine to read them (policies and Services select on
/// them; a pod with more is admitted unchanged with a warning). Each label is copied into the
/// selector's map, about 120 bytes per label however short it is: a 3 MiB request of short
/// labels (about 300,000) cost some 40-50 MB (docs/benchmarks/bounded-work.md "Bounded work per request"). Real
/// pods have a few to tens of labels; the API server sets no limit on their number. Checked
/// first, before the pod-level rules: the policy is chosen by the labels.
pub const MAX_POD_LABELS: usize = 1024;

/// The warning of [`PodReason::TooManyLabels`] (under 119 characters).
pub fn too_many_labels_warning() -> String {
    format!("safe-termination: more than {MAX_POD_LABELS} labels; pod admitted unchanged")
}

/// The number of `spec.containers` and `spec.initContainers` entries of `spec` (each list's
/// length when it is an array, else 0).
fn container_count(spec: &Value) -> usize {
    let len = |key: &str| spec.get(key).and_then(Value::as_array).map_or(0, Vec::len);
    len("containers").saturating_add(len("initContainers"))
}

/// What happened to one container of `spec.containers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ContainerReason {
    /// A native `sleep` preStop was injected.
    InjectedSleep,
    /// An `exec: [sleep, N]` preStop was injected.
    InjectedExec,
    /// The waiter's `preStop.exec` was injected (handler `Wait`).
    InjectedWait,
    /// It already had a preStop hook (R1).
    ExistingPreStop,
    /// Listed in `safetermination.io/skip-containers`.
    OptedOut,
    /// No handler allowed: native sleep unsupported and exec not allowed for its image (R5).
    NoUsableHandler,
    /// Audit mode: a hook would have been injected.
    WouldInject,
    /// Not evaluated because the pod was skipped.
    PodSkipped,
}

/// The decision for one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerMutation {
    /// Container name (a name longer than [`MAX_SHOWN_NAME_BYTES`] cut there with `…`).
    pub name: String,
    /// What happened.
    pub reason: ContainerReason,
}

/// The engine's answer for one pod.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMutation {
    /// RFC 6902 operations (empty when nothing changes); they apply cleanly to the input.
    pub patch: Patch,
    /// Human-readable warnings, whole: [`crate::webhook::review`] cuts each to 119 characters for the
    /// API server ([`short_warning`]).
    pub warnings: Vec<String>,
    /// Why the pod was or was not mutated.
    pub reason: PodReason,
    /// Per-container decisions, in `spec.containers` order.
    pub containers: Vec<ContainerMutation>,
    /// `namespace/name` of the policy applied, if any.
    pub policy: Option<String>,
}

impl PodMutation {
    fn skip(reason: PodReason, warnings: Vec<String>, policy: Option<String>) -> Self {
        Self { patch: Patch(Vec::new()), warnings, reason, containers: Vec::new(), policy }
    }
}

/// Limits an admission warning to 119 characters (Kubernetes' admission webhook docs ask for
/// 120 or fewer; kubectl prints each on one line): what
/// [`crate::webhook::review`] sends. [`PodMutation::warnings`] are whole; `mutate` prints them so.
pub fn short_warning(s: String) -> String {
    const MAX: usize = 119;
    if s.chars().count() <= MAX {
        return s;
    }
    let mut out: String = s.chars().take(MAX - 3).collect();
    out.push_str("...");
    out
}

/// The longest container name a [`PodMutation`] repeats (in its per-container reasons and
/// warnings), bytes: 253, the longest name Kubernetes accepts for any object (a container's is at
/// most 63). A longer name, which the API server refuses anyway, is cut there with `…`, so that a
/// pod's names are not copied whole into each reason and warning.
pub const MAX_SHOWN_NAME_BYTES: usize = 253;

/// `name` as a [`PodMutation`] shows it: whole up to [`MAX_SHOWN_NAME_BYTES`], else cut there
/// (at a character boundary) with `…`.
fn shown_name(name: &str) -> String {
    if name.len() <= MAX_SHOWN_NAME_BYTES {
        return name.to_string();
    }
    let mut end = MAX_SHOWN_NAME_BYTES;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

fn ptr(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn add(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path: ptr(tokens), value })
}

fn str_map(v: Option<&Value>) -> Labels {
    v.and_then(Value::as_object).map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect()).unwrap_or_default()
}

/// True when the image matches an allow-list entry: exact, or a prefix for entries ending in `*`.
pub fn image_allowed(image: &str, allow: &[String]) -> bool {
    allow.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => image.starts_with(prefix),
        None => image == p,
    })
}

/// A pod for Windows nodes: `spec.os.name`, the `kubernetes.io/os` node selector, or a
/// required node affinity term asking `kubernetes.io/os In [.., windows, ..]`.
fn is_windows(spec: &Value) -> bool {
    let os = spec.pointer("/os/name").and_then(Value::as_str);
    let selector = spec.pointer("/nodeSelector/kubernetes.io~1os").and_then(Value::as_str);
    let terms = spec.pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms").and_then(Value::as_array);
    let affinity = terms.into_iter().flatten().filter_map(|t| t.get("matchExpressions")?.as_array()).flatten().any(|e| {
        e.get("key").and_then(Value::as_str) == Some("kubernetes.io/os")
            && e.get("operator").and_then(Value::as_str) == Some("In")
            && e.get("values").and_then(Value::as_array).is_some_and(|v| v.iter().any(|x| x.as_str() == Some("windows")))
    });
    os == Some("windows") || selector == Some("windows") || affinity
}

/// Why the waiter's parts cannot go into this pod, if so: one of its names or paths is taken by
/// something of the pod's own (a volume of another type, an init container or a container with
/// the install container's name, a mount at one of its paths or of its volumes elsewhere). The
/// pod then gets the native sleep: a clashing mount gets the pod refused, and a hook whose
/// binary is not there fails and waits nothing.
fn wait_clash(spec: &Value) -> Option<String> {
    let list = |k: &str| spec.get(k).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    let name = |v: &Value| v.get("name").and_then(Value::as_str).unwrap_or("").to_string();
    for v in list("volumes") {
        let ours = match name(v).as_str() {
            wait::BIN_VOLUME => v.get("emptyDir").is_some(),
            wait::CONFIG_VOLUME => v.get("projected").is_some(),
            _ => true,
        };
        if !ours {
            return Some(format!("volume {} is the pod's own", name(v)));
        }
    }
    for c in list("initContainers") {
        if name(c) == wait::INSTALL_CONTAINER && c.pointer("/command/0").and_then(Value::as_str) != Some(wait::WAITER_IMAGE_PATH) {
            return Some(format!("init container {} is the pod's own", wait::INSTALL_CONTAINER));
        }
    }
    for c in list("containers") {
        if name(c) == wait::INSTALL_CONTAINER {
            return Some(format!("container {} is the pod's own", wait::INSTALL_CONTAINER));
        }
        for m in c.get("volumeMounts").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
            let path = m.get("mountPath").and_then(Value::as_str).unwrap_or("");
            let expected = match name(m).as_str() {
                wait::BIN_VOLUME => Some(wait::BIN_MOUNT_PATH),
                wait::CONFIG_VOLUME => Some(wait::CONFIG_MOUNT_PATH),
                _ => None,
            };
            let taken = expected.is_none() && (path == wait::BIN_MOUNT_PATH || path == wait::CONFIG_MOUNT_PATH);
            if taken || expected.is_some_and(|p| p != path) {
                return Some(format!("container {} mounts {} at {path}", name(c), name(m)));
            }
        }
    }
    None
}

/// Decides the mutation of `pod` (a Pod as JSON) created in `namespace` (the admission request's
/// namespace; the pod's own `metadata.namespace` is used when that is empty).
pub fn mutate_pod(pod: &Value, namespace: &str, plan: &Plan, services: &dyn ServiceIndex) -> PodMutation {
    if pod.get("kind").and_then(Value::as_str).is_some_and(|k| k != "Pod") || !pod.is_object() {
        return PodMutation::skip(PodReason::NotAPod, Vec::new(), None);
    }
    let meta = pod.get("metadata");
    let label_values = meta.and_then(|m| m.get("labels"));
    if label_values.and_then(Value::as_object).is_some_and(|l| l.len() > MAX_POD_LABELS) {
        return PodMutation::skip(PodReason::TooManyLabels, vec![too_many_labels_warning()], None);
    }
    let annotations = str_map(meta.and_then(|m| m.get("annotations")));
    let labels = str_map(label_values);
    let namespace = if namespace.is_empty() { meta.and_then(|m| m.get("namespace")).and_then(Value::as_str).unwrap_or("") } else { namespace };
    let empty = json!({});
    let spec = pod.get("spec").filter(|s| s.is_object()).unwrap_or(&empty);
    let scope = match in_scope(spec, &annotations, &labels, namespace, plan, services) {
        Ok(scope) => scope,
        Err(skipped) => return skipped,
    };
    if container_count(spec) > MAX_POD_CONTAINERS {
        let InScope { policy_ref, mut warnings, .. } = scope;
        warnings.push(too_many_containers_warning());
        return PodMutation::skip(PodReason::TooManyContainers, warnings, Some(policy_ref));
    }
    let wanted = scope.policy.spec.pre_stop.handler == PreStopHandler::Wait;
    let clash = wanted.then(|| wait_clash(spec)).flatten();
    let waiting = (wanted && clash.is_none()).then(|| WaitPlan::new(&scope, &plan.wait));
    let mut hooks = container_hooks(spec, &annotations, scope.policy, scope.pre_stop, plan.capabilities, waiting.as_ref());
    if let Some(why) = clash {
        hooks.warnings.insert(0, format!("safe-termination: no preStop waiter ({why}): native sleep instead"));
    }
    finish(meta, spec, &annotations, scope, hooks, waiting.as_ref(), &plan.wait)
}

/// A pod the policy applies to, as the pod-level rules of [`in_scope`] left it.
struct InScope<'p> {
    policy: &'p PlanPolicy,
    /// `namespace/name` of `policy`.
    policy_ref: String,
    /// The warnings so far (a policy chosen over others).
    warnings: Vec<String>,
    /// The pod's own terminationGracePeriodSeconds, when it set one (never 0 here).
    current_grace: Option<i64>,
    /// The plan's sleep, seconds (> 0 here).
    pre_stop: u32,
}

/// The pod-level rules, in order: R8 mirror pods, R7 run-to-completion pods, the opt-out
/// annotation, the policy (none, Disabled, ServiceBacked without a Service), a grace that is not
/// an integer or is 0 (R3), a 0 s sleep. `Err` is the skip decision.
fn in_scope<'p>(
    spec: &Value,
    annotations: &Labels,
    labels: &Labels,
    namespace: &str,
    plan: &'p Plan,
    services: &dyn ServiceIndex,
) -> Result<InScope<'p>, PodMutation> {
    if annotations.contains_key(ANNOTATION_MIRROR) {
        return Err(PodMutation::skip(PodReason::MirrorPod, Vec::new(), None));
    }
    if matches!(spec.get("restartPolicy").and_then(Value::as_str), Some("Never" | "OnFailure")) {
        return Err(PodMutation::skip(PodReason::RunToCompletion, Vec::new(), None));
    }
    if annotations.get(ANNOTATION_SKIP).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Err(PodMutation::skip(PodReason::OptedOut, Vec::new(), None));
    }
    let Some(resolved) = plan.resolve(namespace, labels) else {
        return Err(PodMutation::skip(PodReason::NoPolicy, Vec::new(), None));
    };
    let policy: &PlanPolicy = resolved.policy;
    let policy_ref = policy.reference();
    let mut warnings = Vec::new();
    if !resolved.also_matched.is_empty() {
        warnings.push(format!("safe-termination: policy {} chosen over {}", policy.name, resolved.also_matched.join(",")));
    }
    match policy.spec.mode {
        EnforcementMode::Disabled => return Err(PodMutation::skip(PodReason::PolicyDisabled, warnings, Some(policy_ref))),
        EnforcementMode::Enforce | EnforcementMode::Audit => {}
    }
    if policy.spec.scope == Scope::ServiceBacked && !services.selects(namespace, labels) {
        return Err(PodMutation::skip(PodReason::NotServiceBacked, warnings, Some(policy_ref)));
    }
    let grace_value = spec.get("terminationGracePeriodSeconds").filter(|v| !v.is_null());
    if grace_value.is_some_and(|v| v.as_i64().is_none()) {
        // not an integer (the API server would reject it): never overwrite what the user wrote
        warnings.push("safe-termination: terminationGracePeriodSeconds is not an integer; pod left unchanged".into());
        return Err(PodMutation::skip(PodReason::NoChange, warnings, Some(policy_ref)));
    }
    let current_grace = grace_value.and_then(Value::as_i64);
    if current_grace == Some(0) {
        warnings.push("safe-termination: terminationGracePeriodSeconds is 0, so no preStop sleep was added".into());
        return Err(PodMutation::skip(PodReason::GraceZero, warnings, Some(policy_ref)));
    }
    // sized and bounded when the plan was built (sizing::clamp_pre_stop): served as it is
    let pre_stop = policy.pre_stop_seconds;
    if pre_stop == 0 {
        return Err(PodMutation::skip(PodReason::ZeroSleep, warnings, Some(policy_ref)));
    }
    Ok(InScope { policy, policy_ref, warnings, current_grace, pre_stop })
}

/// What a `Wait` policy gives its pods: the grace that holds the waiter's deadline, the
/// deadline, and where the waiter asks.
struct WaitPlan<'p> {
    /// The pod's grace once raised to hold the longest wait (R2: never lowered).
    grace: i64,
    /// The waiter's deadline, seconds ([`wait::deadline_seconds`]).
    deadline: u32,
    injection: &'p WaitInjection,
}

impl<'p> WaitPlan<'p> {
    fn new(scope: &InScope<'_>, injection: &'p WaitInjection) -> Self {
        let spec = &scope.policy.spec;
        let hold = spec.pre_stop.max_seconds.max(scope.pre_stop);
        let grace = grace_seconds(scope.current_grace, hold, &spec.grace);
        Self { grace, deadline: wait::deadline_seconds(spec.pre_stop.max_seconds, grace, spec.grace.app_shutdown_seconds, scope.pre_stop), injection }
    }

    /// The waiter's `preStop` handler for `policy` with the admission sleep `pre_stop`.
    fn hook(&self, policy: &str, pre_stop: u32) -> Value {
        let mut command = vec![
            json!(wait::WAITER_PATH),
            json!("wait"),
            json!("--url"),
            json!(self.injection.url),
            json!("--policy"),
            json!(policy),
            json!("--fallback-seconds"),
            json!(pre_stop.to_string()),
            json!("--deadline-seconds"),
            json!(self.deadline.to_string()),
        ];
        if let Some(a) = &self.injection.address {
            command.extend([json!("--address"), json!(a)]);
        }
        json!({"exec": {"command": command}})
    }
}

/// The volume mounts of the waiter in an app container: its binary and its projected files.
fn wait_mounts() -> [Value; 2] {
    [
        json!({"name": wait::BIN_VOLUME, "mountPath": wait::BIN_MOUNT_PATH, "readOnly": true}),
        json!({"name": wait::CONFIG_VOLUME, "mountPath": wait::CONFIG_MOUNT_PATH, "readOnly": true}),
    ]
}

/// The pod-level parts of the waiter (R12): its emptyDir and projected volume, and the init
/// container that copies it, each only when the pod does not have it yet (by name). Every part
/// passes the Restricted Pod Security level: emptyDir and projected volumes only, the init
/// container non-root (the image's user, 65532), no privilege escalation, every capability
/// dropped, the runtime's default seccomp profile, a read-only root filesystem.
fn wait_pod_ops(spec: &Value, injection: &WaitInjection) -> Vec<PatchOperation> {
    let named = |list: &str, name: &str| {
        spec.get(list).and_then(Value::as_array).is_some_and(|l| l.iter().any(|v| v.get("name").and_then(Value::as_str) == Some(name)))
    };
    let mut ops = Vec::new();
    let volumes = [
        (wait::BIN_VOLUME, json!({"name": wait::BIN_VOLUME, "emptyDir": {"sizeLimit": wait::BIN_VOLUME_SIZE_LIMIT}})),
        (
            wait::CONFIG_VOLUME,
            json!({"name": wait::CONFIG_VOLUME, "projected": {"defaultMode": 0o444, "sources": [
                {"serviceAccountToken": {"audience": wait::WAIT_AUDIENCE, "expirationSeconds": wait::TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": wait::CONFIG_MAP_NAME, "optional": true}},
                {"downwardAPI": {"items": [{"path": wait::ADMISSION_CA_FILE, "fieldRef": {"fieldPath": format!("metadata.annotations['{}']", wait::ANNOTATION_WAIT_CA)}}]}}
            ]}}),
        ),
    ];
    let missing: Vec<Value> = volumes.into_iter().filter(|(name, _)| !named("volumes", name)).map(|(_, v)| v).collect();
    if spec.get("volumes").is_some_and(Value::is_array) {
        ops.extend(missing.into_iter().map(|v| add(&["spec", "volumes", "-"], v)));
    } else if !missing.is_empty() {
        ops.push(add(&["spec", "volumes"], Value::Array(missing)));
    }
    if !named("initContainers", wait::INSTALL_CONTAINER) {
        let install = json!({
            "name": wait::INSTALL_CONTAINER,
            "image": injection.image,
            "imagePullPolicy": "IfNotPresent",
            "command": [wait::WAITER_IMAGE_PATH, "install", wait::WAITER_PATH],
            "volumeMounts": [{"name": wait::BIN_VOLUME, "mountPath": wait::BIN_MOUNT_PATH}],
            // limits too: a ResourceQuota on limits.cpu or limits.memory refuses a pod without them
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "16Mi"}},
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}
            }
        });
        ops.push(if spec.get("initContainers").is_some_and(Value::is_array) {
            add(&["spec", "initContainers", "-"], install)
        } else {
            add(&["spec", "initContainers"], json!([install]))
        });
    }
    ops
}

/// The operations that mount the waiter into container `idx` (`c`), skipping a mount of the
/// same name already there.
fn wait_mount_ops(c: &Value, idx: &str) -> Vec<PatchOperation> {
    let existing = c.get("volumeMounts").and_then(Value::as_array);
    let has = |name: &str| existing.is_some_and(|l| l.iter().any(|m| m.get("name").and_then(Value::as_str) == Some(name)));
    let todo: Vec<Value> = wait_mounts().into_iter().filter(|m| !has(m["name"].as_str().unwrap_or(""))).collect();
    if todo.is_empty() {
        return Vec::new();
    }
    if existing.is_some() {
        return todo.into_iter().map(|m| add(&["spec", "containers", idx, "volumeMounts", "-"], m)).collect();
    }
    vec![add(&["spec", "containers", idx, "volumeMounts"], Value::Array(todo))]
}

/// What [`container_hooks`] decided for `spec.containers`.
struct Hooks {
    /// The hooks to add (none in audit mode).
    ops: Vec<PatchOperation>,
    /// One per container object, in order.
    containers: Vec<ContainerMutation>,
    /// Containers given (or, in audit mode, that would be given) a hook.
    injected: usize,
    /// Containers that run the waiter: given it now (handler `Wait`), or kept with it from an
    /// earlier admission (a reinvocation after another webhook's patch): the pod-level parts
    /// must be there for them.
    waiters: usize,
    /// Containers that kept their own preStop (R1).
    kept: usize,
    /// Whether some container could be given no handler (R4/R5).
    any_without_handler: bool,
    /// Kept sleeps below the plan's, then the containers left without a handler.
    warnings: Vec<String>,
}

/// The preStop hook of each container of `spec.containers` (R1, R4-R6): kept, opted out,
/// injected (native sleep or `exec sleep N`), or none usable.
fn container_hooks(
    spec: &Value,
    annotations: &Labels,
    policy: &PlanPolicy,
    pre_stop: u32,
    capabilities: Capabilities,
    waiting: Option<&WaitPlan<'_>>,
) -> Hooks {
    let audit = policy.spec.mode == EnforcementMode::Audit;
    let skip_containers: Vec<&str> =
        annotations.get(ANNOTATION_SKIP_CONTAINERS).map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()).unwrap_or_default();
    let windows = is_windows(spec);
    let Capabilities { native_sleep } = capabilities;
    let handler = policy.spec.pre_stop.handler;
    let exec_images = &policy.spec.pre_stop.exec_images;
    let mut hooks = Hooks { ops: Vec::new(), containers: Vec::new(), injected: 0, waiters: 0, kept: 0, any_without_handler: false, warnings: Vec::new() };
    let mut no_handler: Vec<String> = Vec::new();
    let list = spec.get("containers").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    if spec.get("containers").is_some_and(|c| !c.is_null() && !c.is_array()) {
        // a map or a string where a list belongs (a Pod the API server refuses): said, not silent
        hooks.warnings.push("safe-termination: spec.containers is not a list; no preStop added".into());
    }
    for (i, c) in list.iter().enumerate() {
        // a container entry that is not an object cannot take a hook (the API server rejects
        // such a pod anyway); nothing is added under it
        if !c.is_object() {
            continue;
        }
        let full_name = c.get("name").and_then(Value::as_str).unwrap_or("");
        let name = shown_name(full_name);
        let idx = i.to_string();
        let lifecycle = c.get("lifecycle").filter(|l| l.is_object());
        let reason = if skip_containers.contains(&full_name) {
            ContainerReason::OptedOut
        } else if let Some(existing) = lifecycle.and_then(|l| l.get("preStop")).filter(|p| !p.is_null()) {
            hooks.kept += 1;
            if existing.pointer("/exec/command/0").and_then(Value::as_str) == Some(wait::WAITER_PATH) {
                // ours from an earlier admission: its mounts may have been dropped by another
                // webhook's patch since; without them the hook fails and nothing is waited
                hooks.waiters += 1;
                hooks.ops.extend(wait_mount_ops(c, &idx));
            }
            if let Some(s) = existing.pointer("/sleep/seconds").and_then(Value::as_i64).filter(|s| *s < i64::from(pre_stop)) {
                // the figures first: a cut warning (short_warning) loses the container name, not them
                hooks.warnings.push(format!("safe-termination: preStop sleep {s}s kept, below the recommended {pre_stop}s, in container {name}"));
            }
            ContainerReason::ExistingPreStop
        } else {
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            let exec_ok = !windows && image_allowed(image, exec_images);
            let action = match handler {
                PreStopHandler::Wait if !windows && waiting.is_some() => waiting.map(|w| ("wait", w.hook(&policy.name, pre_stop))),
                PreStopHandler::Wait if native_sleep => Some(("sleep", json!({"sleep": {"seconds": pre_stop}}))),
                PreStopHandler::Auto if native_sleep => Some(("sleep", json!({"sleep": {"seconds": pre_stop}}))),
                PreStopHandler::Sleep if native_sleep => Some(("sleep", json!({"sleep": {"seconds": pre_stop}}))),
                PreStopHandler::Auto | PreStopHandler::Exec if exec_ok => Some(("exec", json!({"exec": {"command": ["sleep", pre_stop.to_string()]}}))),
                _ => None,
            };
            match action {
                None => {
                    no_handler.push(name.clone());
                    ContainerReason::NoUsableHandler
                }
                Some((kind, _)) if audit => {
                    hooks.injected += 1;
                    // counted, so that the audit's warning gives the grace the waiter would get
                    hooks.waiters += usize::from(kind == "wait");
                    ContainerReason::WouldInject
                }
                Some((kind, hook)) => {
                    hooks.injected += 1;
                    if lifecycle.is_some() {
                        hooks.ops.push(add(&["spec", "containers", &idx, "lifecycle", "preStop"], hook));
                    } else {
                        hooks.ops.push(add(&["spec", "containers", &idx, "lifecycle"], json!({ "preStop": hook })));
                    }
                    match kind {
                        "sleep" => ContainerReason::InjectedSleep,
                        "wait" => {
                            hooks.waiters += 1;
                            hooks.ops.extend(wait_mount_ops(c, &idx));
                            ContainerReason::InjectedWait
                        }
                        _ => ContainerReason::InjectedExec,
                    }
                }
            }
        };
        hooks.containers.push(ContainerMutation { name, reason });
    }
    if !no_handler.is_empty() {
        let why = if windows {
            "no native sleep, no exec on Windows"
        } else if handler == PreStopHandler::Wait {
            "no waiter image configured"
        } else {
            "no native sleep, image not in execImages"
        };
        hooks.warnings.push(format!("safe-termination: {why}: no preStop for {}", no_handler.join(",")));
        hooks.any_without_handler = true;
    }
    hooks
}

/// The decision from the container hooks: the grace raised to hold the sleep (R2, R3) and the
/// annotations, or in audit mode the audit annotation and a warning only.
fn finish(
    meta: Option<&Value>,
    spec: &Value,
    annotations: &Labels,
    scope: InScope<'_>,
    hooks: Hooks,
    waiting: Option<&WaitPlan<'_>>,
    injection: &WaitInjection,
) -> PodMutation {
    let InScope { policy, policy_ref, mut warnings, current_grace, pre_stop } = scope;
    let Hooks { mut ops, containers, injected, waiters, kept, any_without_handler, warnings: hook_warnings } = hooks;
    warnings.extend(hook_warnings);
    if injected == 0 && kept == 0 {
        let reason = if any_without_handler { PodReason::NoUsableHandler } else { PodReason::NoChange };
        return PodMutation { patch: Patch(Vec::new()), warnings, reason, containers, policy: Some(policy_ref) };
    }
    // a waiter may wait up to its deadline: the grace holds that (R12), else the sleep (R2, R3)
    let target_grace = match waiting {
        Some(w) if waiters > 0 => w.grace,
        _ => grace_seconds(current_grace, pre_stop, &policy.spec.grace),
    };
    let grace_changes = match current_grace {
        Some(g) => target_grace > g,
        None => target_grace != KUBERNETES_DEFAULT_GRACE_SECONDS,
    };
    if policy.spec.mode == EnforcementMode::Audit {
        let what = if waiters > 0 { format!("the preStop waiter (fallback {pre_stop}s)") } else { format!("a {pre_stop}s preStop sleep") };
        warnings.push(format!("safe-termination (audit): would add {what} to {injected} container(s), grace {}s", target_grace));
        let mut annotate = Vec::new();
        if annotations.get(ANNOTATION_AUDIT_PRESTOP_SECONDS) != Some(&pre_stop.to_string()) && injected > 0 {
            annotate.push((ANNOTATION_AUDIT_PRESTOP_SECONDS, pre_stop.to_string()));
            annotate.push((ANNOTATION_POLICY, policy_ref.clone()));
        }
        let patch = annotation_ops(meta, annotations, &annotate);
        let reason = if patch.is_empty() { PodReason::NoChange } else { PodReason::Audited };
        return PodMutation { patch: Patch(patch), warnings, reason, containers, policy: Some(policy_ref) };
    }
    if grace_changes {
        let value = json!(target_grace);
        ops.push(match current_grace {
            Some(_) => PatchOperation::Replace(ReplaceOperation { path: ptr(&["spec", "terminationGracePeriodSeconds"]), value }),
            None => add(&["spec", "terminationGracePeriodSeconds"], value),
        });
    }
    if waiters > 0 {
        ops.extend(wait_pod_ops(spec, injection));
    }
    if injected > 0 {
        let mut annotate = vec![(ANNOTATION_PRESTOP_SECONDS, pre_stop.to_string()), (ANNOTATION_POLICY, policy_ref.clone())];
        if let Some(w) = waiting.filter(|_| waiters > 0) {
            annotate.push((wait::ANNOTATION_PRESTOP_HANDLER, "Wait".to_string()));
            // a CA bundle of a sensible size (one or two certificates): the pod's annotations
            // are limited to 256 KiB in all
            if !w.injection.ca_pem.is_empty() && w.injection.ca_pem.len() <= 16 * 1024 {
                annotate.push((wait::ANNOTATION_WAIT_CA, w.injection.ca_pem.clone()));
            }
        }
        ops.extend(annotation_ops(meta, annotations, &annotate));
    }
    let reason = if ops.is_empty() { PodReason::NoChange } else { PodReason::Mutated };
    PodMutation { patch: Patch(ops), warnings, reason, containers, policy: Some(policy_ref) }
}

/// Operations that set `annotate` on the pod: one `add` of the whole map when the pod has no
/// annotations object, else one `add` per key (which replaces an existing value). Keys whose
/// value is already right are left out.
fn annotation_ops(meta: Option<&Value>, existing: &Labels, annotate: &[(&str, String)]) -> Vec<PatchOperation> {
    let todo: Vec<&(&str, String)> = annotate.iter().filter(|(k, v)| existing.get(*k) != Some(v)).collect();
    if todo.is_empty() {
        return Vec::new();
    }
    let has_map = meta.and_then(|m| m.get("annotations")).is_some_and(Value::is_object);
    let has_meta = meta.is_some_and(Value::is_object);
    if !has_map {
        let map: serde_json::Map<String, Value> = todo.iter().map(|(k, v)| ((*k).to_string(), Value::String(v.clone()))).collect();
        if !has_meta {
            return vec![add(&["metadata"], json!({ "annotations": map }))];
        }
        return vec![add(&["metadata", "annotations"], Value::Object(map))];
    }
    todo.iter().map(|(k, v)| add(&["metadata", "annotations", k], Value::String(v.clone()))).collect()
}
