//! The properties the fuzz targets check: one function per target, taking the raw input bytes
//! and panicking when a property does not hold (libFuzzer records a panic as a crash). The
//! targets in `fuzz/fuzz_targets/` call these, and `tests/fuzz_corpora.rs` includes this file
//! with `#[path]` to replay the committed corpora (`fuzz/corpus/<target>/`) under `cargo test`.
//!
//! Dependencies: only crates the main package already has (the library, serde_json,
//! json-patch, base64, reqwest's header types), so the same file compiles in both places.

#![allow(dead_code)]

use base64::Engine as _;
use safe_termination::core::crd::{EnforcementMode, GraceSpec, PreStopHandler, PreStopSpec, Scope, TerminationPolicySpec};
use safe_termination::core::exposition::native::SCHEMA_MIN;
use safe_termination::core::exposition::parse::parse_kube_proxy_metrics_strict;
use safe_termination::core::exposition::protobuf::decode_kube_proxy_protobuf;
use safe_termination::core::exposition::{
    HistogramFamily, KubeProxyScrape, NativeHistogram, filter_kube_proxy_metrics, filter_kube_proxy_protobuf, parse_kube_proxy_metrics,
    parse_kube_proxy_protobuf, parse_scrape,
};
use safe_termination::core::model::{Basis, ClusterWindow, ProxyMode};
use safe_termination::core::mutate::mutate_pod;
use safe_termination::core::plan::{Capabilities, Plan, PlanPolicy};
use safe_termination::core::proxyconfig::{ProxyConfig, parse_configz, parse_go_duration, parse_kube_proxy_config, reduce_configz};
use safe_termination::core::selector::{AssumeServiceBacked, Labels, ServiceIndex, StaticServiceIndex};
use safe_termination::core::sizing::{KUBERNETES_DEFAULT_GRACE_SECONDS, grace_seconds, recommend};
use safe_termination::webhook::review;
use serde_json::Value;
use std::sync::OnceLock;

/// A target's check: the input bytes; panics when a property does not hold.
pub type Check = fn(&[u8]);

/// Every target: its name (the directory of its corpus and the binary's name) and check.
pub const TARGETS: &[(&str, Check)] = &[
    ("text_parser", text_parser),
    ("protobuf", protobuf),
    ("native", native),
    ("review", review_body),
    ("mutate_yaml", mutate_yaml),
    ("configz", configz),
    ("configmap", configmap),
    ("go_duration", go_duration),
    ("policy_spec", policy_spec),
    ("agent_answer", agent_answer),
    ("rule_listing", rule_listing),
    ("observe_wire", observe_wire),
    ("nft_netlink", nft_netlink),
    ("cilium_lb", cilium_lb),
];

/// `a == b`, or, for values holding NaN (a NaN `_sum` is legal; NaN bucket counts are accepted
/// too, a known defect once), equal `Debug` forms.
fn same<T: PartialEq + std::fmt::Debug>(a: &T, b: &T) -> bool {
    a == b || format!("{a:?}") == format!("{b:?}")
}

// ---------------------------------------------------------------------------------------------
// scrapes

/// The text exposition: the fast path and the strict parser give the same result, `Ok` or
/// `Err` (the contract of `parse_kube_proxy_metrics`); a body that parses reads the same after
/// the node agent's filter (the contract of `filter_kube_proxy_metrics`); every native-free
/// classic quantile is a number or NaN, never a panic.
pub fn text_parser(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let fast = parse_kube_proxy_metrics(text);
    let strict = parse_kube_proxy_metrics_strict(text);
    assert!(same(&fast, &strict), "fast path {fast:?}\nstrict {strict:?}");
    if let Ok(scrape) = fast {
        let filtered = filter_kube_proxy_metrics(text);
        let again = parse_kube_proxy_metrics(&filtered);
        assert!(same(&again, &Ok(scrape.clone())), "the filtered body reads {again:?}\nthe whole one {scrape:?}");
        classic_quantiles(&scrape);
    }
}

/// Quantiles of the classic histograms of `scrape` at the levels the operator asks for: no
/// panic (the values themselves may be NaN: NaN bucket counts are a known defect).
fn classic_quantiles(scrape: &KubeProxyScrape) {
    for h in [&scrape.sync, &scrape.sync_full, &scrape.sync_partial, &scrape.network_programming].into_iter().flatten() {
        for q in [0.0, 0.5, 0.9, 0.99, 1.0] {
            let _ = h.quantile(q);
        }
    }
}

/// The protobuf exposition: decode and parse agree on `Ok`/`Err`; every native series and both
/// summed natives pass [`check_native`]; a body that parses reads the same after the agent's
/// protobuf filter.
pub fn protobuf(data: &[u8]) {
    let decoded = decode_kube_proxy_protobuf(data);
    let parsed = parse_kube_proxy_protobuf(data);
    assert_eq!(decoded.is_ok(), parsed.is_ok(), "decode {decoded:?}\nparse {parsed:?}");
    let (Ok(decoded), Ok(scrape)) = (decoded, parsed) else { return };
    for family in [HistogramFamily::Sync, HistogramFamily::NetworkProgramming] {
        for (_, h) in decoded.native_series(family) {
            check_native(h);
        }
    }
    for h in [&scrape.sync_native, &scrape.network_programming_native].into_iter().flatten() {
        check_native(h);
    }
    classic_quantiles(&scrape);
    let filtered = filter_kube_proxy_protobuf(data);
    let again = parse_kube_proxy_protobuf(&filtered);
    assert!(same(&again, &Ok(scrape.clone())), "the filtered body reads {again:?}\nthe whole one {scrape:?}");
}

/// True when every number of `h` is finite, its buckets hold at least one observation, and the
/// bounds of its populated buckets are finite floats above 0: the "finite input" of the fuzzing target's
/// rule "never a NaN quantile from finite input". A count above what the buckets hold is NaN
/// observations (`NativeHistogram::new`); with nothing but those, Prometheus'
/// `histogram_quantile` is NaN too (`promql/quantile.go`: rank / bucket count 0). Bucket `i` of
/// schema `s` ends at `2^(i x 2^-s)`: beyond `2^±1000` its bounds leave the float range (0 or
/// infinity), where Prometheus' interpolation is NaN as well.
fn finite_with_observations(h: &NativeHistogram) -> bool {
    let buckets = h.positive().iter().chain(h.negative());
    let held: f64 = h.zero_count() + buckets.clone().map(|b| b.1).sum::<f64>();
    let in_range = |i: i32| (f64::from(i) * 2f64.powi(-h.schema())).abs() < 1000.0;
    [h.count(), h.sum(), h.zero_threshold(), held].iter().all(|x| x.is_finite())
        && buckets.clone().all(|&(i, c)| c.is_finite() && (c == 0.0 || (in_range(i) && in_range(i.saturating_sub(1)))))
        && held > 0.0
        && h.count() > 0.0
}

/// The quantile levels checked on every native histogram.
const LEVELS: [f64; 9] = [0.0, 0.01, 0.25, 0.5, 0.5000001, 0.9, 0.99, 0.999, 1.0];

/// A native histogram's maths on itself: quantiles (never NaN from finite input), and each
/// coarser schema keeps the count, the observations the buckets hold and the order of its
/// buckets.
fn check_native(h: &NativeHistogram) {
    check_quantiles(h);
    for schema in (SCHEMA_MIN..h.schema()).rev() {
        let r = h.reduce_to_schema(schema);
        assert_eq!((r.schema(), r.count(), r.zero_count()), (schema, h.count(), h.zero_count()));
        for (side, before) in [(r.positive(), h.positive()), (r.negative(), h.negative())] {
            assert!(side.windows(2).all(|w| w[0].0 < w[1].0), "schema {schema}: buckets out of order {side:?}");
            let (a, b): (f64, f64) = (side.iter().map(|x| x.1).sum(), before.iter().map(|x| x.1).sum());
            assert!(a == b || (a - b).abs() <= 1e-9 * b.abs() || !b.is_finite(), "schema {schema}: buckets hold {a}, were {b}");
        }
        check_quantiles(&r);
    }
}

fn check_quantiles(h: &NativeHistogram) {
    if !finite_with_observations(h) {
        for q in LEVELS {
            let _ = h.quantile(q);
        }
        return;
    }
    for q in LEVELS {
        let v = h.quantile(q).seconds;
        assert!(!v.is_nan(), "quantile({q}) is NaN on {h:?}");
    }
}

/// A cursor over fuzz bytes that reads 0 past the end.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(std::array::from_fn(|_| self.u8()))
    }
    /// A count: mostly small integers, sometimes any float bits (NaN and infinities refused by
    /// `NativeHistogram::new`, which is checked too).
    fn count(&mut self) -> f64 {
        match self.u8() {
            0..=199 => f64::from(self.u8()),
            200..=239 => f64::from(self.u16()) * 1000.0,
            240..=249 => f64::from(self.u16()) / 7.0,
            _ => f64::from_bits(self.u64()),
        }
    }
    /// A bucket index near kube-proxy's (schema 3: -30..40 for 0.1 ms..30 s), sometimes anywhere.
    fn index(&mut self) -> i32 {
        match self.u8() {
            0..=239 => i32::from(self.u8() as i8),
            240..=249 => i32::from(self.u16() as i16),
            _ => self.u64() as i32,
        }
    }
    fn buckets(&mut self) -> Vec<(i32, f64)> {
        let n = self.u8() % 12;
        let mut b: Vec<(i32, f64)> = (0..n).map(|_| (self.index(), self.count())).collect();
        b.sort_by_key(|x| x.0);
        b.dedup_by_key(|x| x.0);
        b
    }
    fn histogram(&mut self) -> Option<NativeHistogram> {
        let schema = i32::from(self.u8() % 15) - 5;
        let zero_threshold = match self.u8() % 6 {
            0 => 0.0,
            1 => 2f64.powi(-128),
            2 => 0.001,
            3 => 0.5,
            4 => 1.0,
            _ => f64::from_bits(self.u64()),
        };
        let zero_count = self.count();
        let positive = self.buckets();
        let negative = self.buckets();
        let held: f64 = zero_count + positive.iter().chain(&negative).map(|b| b.1).sum::<f64>();
        let count = match self.u8() % 8 {
            0 => self.count(),
            1 => held + f64::from(self.u8()),
            _ => held,
        };
        let sum = match self.u8() % 4 {
            0 => f64::from_bits(self.u64()),
            _ => f64::from(self.u16()) / 100.0,
        };
        NativeHistogram::from_buckets(schema, (zero_threshold, zero_count), (count, sum), &positive, &negative).ok()
    }
}

/// The native-histogram maths on two histograms built from the bytes (schemas -5..=9, so the
/// refusals of `NativeHistogram::new` are reached too): [`check_native`] on each, on their sum
/// and on their delta both ways; a delta is a reset exactly when `is_reset_since` says so; the
/// sum's count is the two counts added; an interval's count is the difference.
pub fn native(data: &[u8]) {
    let mut bytes = Bytes(data);
    let (Some(a), Some(b)) = (bytes.histogram(), bytes.histogram()) else { return };
    check_native(&a);
    check_native(&b);
    let sum = a.add(&b);
    assert!(same(&sum.count(), &(a.count() + b.count())), "sum count {} of {} + {}", sum.count(), a.count(), b.count());
    check_native(&sum);
    for (later, earlier) in [(&a, &b), (&b, &a), (&sum, &a)] {
        let d = later.delta_since(earlier);
        assert_eq!(d.is_reset(), later.is_reset_since(earlier));
        if !d.is_reset() {
            assert!(same(&d.histogram().count(), &(later.count() - earlier.count())));
        }
        check_native(d.histogram());
    }
    // the sum of a histogram and an empty one of the same shape is itself, compacted
    let copy = NativeHistogram::from_buckets(a.schema(), (a.zero_threshold(), a.zero_count()), (a.count(), a.sum()), a.positive(), a.negative());
    assert!(copy.as_ref().is_ok_and(|c| same(c, &a)), "rebuilding {a:?} gave {copy:?}");
}

// ---------------------------------------------------------------------------------------------
// admission

fn policy(spec: TerminationPolicySpec, seconds: u32) -> Option<PlanPolicy> {
    Some(PlanPolicy { namespace: String::new(), name: "fuzz".into(), spec, pre_stop_seconds: seconds })
}

/// Four plans (those of tests/webhook_fuzz.rs): the default (native sleep, 10 s); no native
/// sleep with an exec allow-list, scope AllLongRunning and a namespace policy; Audit; a sleep
/// above the grace cap.
pub fn plans() -> &'static [Plan] {
    static PLANS: OnceLock<Vec<Plan>> = OnceLock::new();
    PLANS.get_or_init(|| {
        let native = Capabilities { native_sleep: true };
        let base = TerminationPolicySpec::default();
        let exec = TerminationPolicySpec {
            scope: Scope::AllLongRunning,
            pre_stop: PreStopSpec { exec_images: vec!["busybox*".into(), "nginx".into()], ..base.pre_stop.clone() },
            ..base.clone()
        };
        let exec_only = TerminationPolicySpec { pre_stop: PreStopSpec { handler: PreStopHandler::Exec, ..exec.pre_stop.clone() }, ..exec.clone() };
        let audit = TerminationPolicySpec { mode: EnforcementMode::Audit, ..base.clone() };
        let wait = TerminationPolicySpec { pre_stop: PreStopSpec { handler: PreStopHandler::Wait, ..base.pre_stop.clone() }, ..base.clone() };
        let long = TerminationPolicySpec {
            pre_stop: PreStopSpec { max_seconds: 3600, ..base.pre_stop.clone() },
            grace: GraceSpec { max_seconds: 60, ..base.grace.clone() },
            ..base.clone()
        };
        vec![
            Plan { policies: Vec::new(), default_policy: policy(TerminationPolicySpec::default(), 10), capabilities: native, wait: Default::default() },
            Plan {
                policies: vec![PlanPolicy { namespace: "team".into(), name: "exec-only".into(), spec: exec_only, pre_stop_seconds: 7 }],
                default_policy: policy(exec, 45),
                capabilities: Capabilities { native_sleep: false },
                wait: Default::default(),
            },
            Plan { policies: Vec::new(), default_policy: policy(audit, 10), capabilities: native, wait: Default::default() },
            Plan { policies: Vec::new(), default_policy: policy(long, 700), capabilities: native, wait: Default::default() },
            Plan { policies: Vec::new(), default_policy: policy(wait, 5), capabilities: native, wait: Default::default() },
        ]
    })
}

fn services() -> &'static StaticServiceIndex {
    static SERVICES: OnceLock<StaticServiceIndex> = OnceLock::new();
    SERVICES.get_or_init(|| {
        let mut sel = Labels::new();
        sel.insert("app".into(), "web".into());
        StaticServiceIndex { services: vec![("default".into(), sel.clone()), ("team".into(), sel)] }
    })
}

/// The request contract of review.rs (`RequestFields`), as tests/webhook_fuzz.rs writes it
/// again from its documentation: the uid of a body `review` must answer 200, `None` for one it
/// must answer 400.
pub fn decodable(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    if v.get("kind")?.as_str()? != "AdmissionReview" || v.get("apiVersion")?.as_str()? != "admission.k8s.io/v1" {
        return None;
    }
    let r = v.get("request")?.as_object()?;
    let uid = r.get("uid")?.as_str().filter(|u| !u.is_empty())?;
    let strings = |field: &str, keys: [&str; 3]| match r.get(field) {
        Some(Value::Object(o)) => keys.iter().all(|k| o.get(*k).is_some_and(Value::is_string)),
        Some(Value::Array(a)) => a.len() == 3 && a.iter().all(Value::is_string),
        _ => false,
    };
    let optional = |field: &str, null_ok: bool| match r.get(field) {
        None => true,
        Some(Value::Null) => null_ok,
        Some(x) => x.is_string(),
    };
    let ok = strings("kind", ["group", "version", "kind"])
        && strings("resource", ["group", "version", "resource"])
        && matches!(r.get("operation").and_then(Value::as_str), Some("CREATE" | "UPDATE" | "DELETE" | "CONNECT"))
        && optional("subResource", true)
        && optional("namespace", true)
        && optional("name", false)
        && matches!(r.get("object"), None | Some(Value::Null | Value::Object(_)));
    ok.then(|| uid.to_string())
}

/// AdmissionReview bytes into `review` under plan `len % 4` (padding a JSON body with blanks
/// reaches every plan): no internal error (fail open); 400 with a message exactly for a body
/// outside the request contract, else 200, `allowed: true` and the uid echoed; warnings of at
/// most 120 characters; a patch is base64 JSONPatch with `patch_ops` operations that applies
/// to the whole `request.object`, and the patched pod passes [`check_patched`].
pub fn review_body(data: &[u8]) {
    let plan = &plans()[data.len() % plans().len()];
    let out = review(data, plan, services());
    assert!(!out.fail_open, "internal error (fail open): {}", String::from_utf8_lossy(&out.body));
    let Some(uid) = decodable(data) else {
        assert_eq!(out.status, 400, "a body outside the contract answered {}", out.status);
        assert!(out.body.starts_with(b"bad AdmissionReview: "));
        return;
    };
    assert_eq!(out.status, 200, "a review answered {}: {}", out.status, String::from_utf8_lossy(&out.body));
    let resp: Value = serde_json::from_slice(&out.body).expect("the response is JSON");
    assert_eq!((resp["apiVersion"].as_str(), resp["kind"].as_str()), (Some("admission.k8s.io/v1"), Some("AdmissionReview")));
    let r = &resp["response"];
    assert_eq!((r["uid"].as_str(), out.uid.as_str(), r["allowed"].as_bool()), (Some(uid.as_str()), uid.as_str(), Some(true)));
    for w in r["warnings"].as_array().into_iter().flatten() {
        assert!(w.as_str().is_some_and(|w| w.chars().count() <= 120), "warning {w}");
    }
    let Some(patch) = r.get("patch") else {
        assert_eq!(out.patch_ops, 0);
        return;
    };
    assert_eq!(r["patchType"].as_str(), Some("JSONPatch"));
    let bytes = base64::engine::general_purpose::STANDARD.decode(patch.as_str().unwrap_or("-")).expect("the patch is base64");
    let ops: json_patch::Patch = serde_json::from_slice(&bytes).expect("the patch is a JSON Patch");
    assert_eq!(ops.0.len(), out.patch_ops);
    let request: Value = serde_json::from_slice(data).expect("a decodable body is JSON");
    let original = &request["request"]["object"];
    let mut pod = original.clone();
    json_patch::patch(&mut pod, &ops.0).unwrap_or_else(|e| panic!("the patch does not apply: {e}\npatch {ops:?}\nobject {original}"));
    check_patched(original, &pod);
    let mut again = request.clone();
    again["request"]["object"] = pod;
    let second = review(&serde_json::to_vec(&again).expect("a Value serialises"), plan, services());
    assert_eq!((second.status, second.patch_ops), (200, 0), "the second pass patched: {}", String::from_utf8_lossy(&second.body));
}

/// The operator's own annotations, the only user-visible values a patch may replace.
const OWN_ANNOTATIONS: [&str; 5] = [
    "safetermination.io/prestop-seconds",
    "safetermination.io/policy",
    "safetermination.io/audit-prestop-seconds",
    "safetermination.io/prestop-handler",
    "safetermination.io/wait-ca",
];

/// The pod after a patch keeps the rules the API server enforces, and the user's values:
/// - the grace period is never lowered (R2), and every preStop sleep the patch added (native
///   `sleep.seconds` or `exec: [sleep, N]`) is at most the grace that results (R3; an absent
///   grace is Kubernetes' default of 30 s);
/// - every non-null scalar of the original pod is still there with its value, but for the grace
///   (raised) and the operator's own annotations. Not compared: values under a `metadata`,
///   `annotations`, `containers` entry or `lifecycle` that is not an object (such a pod does
///   not decode as a Pod, so the API server never sends it; a patch may replace them).
fn check_patched(original: &Value, patched: &Value) {
    let grace_of = |pod: &Value| pod.pointer("/spec/terminationGracePeriodSeconds").filter(|v| !v.is_null()).map(|v| v.as_i64());
    let after = match grace_of(patched) {
        None => Some(KUBERNETES_DEFAULT_GRACE_SECONDS),
        Some(g) => g,
    };
    if let Some(Some(before)) = grace_of(original) {
        assert!(after.is_some_and(|a| a >= before), "grace lowered from {before} to {after:?}");
    }
    let containers = |pod: &Value| pod.pointer("/spec/containers").and_then(Value::as_array).cloned().unwrap_or_default();
    let (before, now) = (containers(original), containers(patched));
    for (i, c) in now.iter().enumerate() {
        let hook = c.pointer("/lifecycle/preStop");
        if hook.is_none() || hook == before.get(i).and_then(|b| b.pointer("/lifecycle/preStop")) {
            continue;
        }
        let hook = hook.unwrap_or(&Value::Null);
        let sleep = hook.pointer("/sleep/seconds").and_then(Value::as_i64).or_else(|| {
            let cmd = hook.pointer("/exec/command").and_then(Value::as_array)?;
            if cmd.first().and_then(Value::as_str) == Some(safe_termination::core::wait::WAITER_PATH) {
                // the waiter (handler Wait): its deadline is what the grace must hold
                let at = cmd.iter().position(|a| a == "--deadline-seconds")?;
                return cmd.get(at + 1)?.as_str()?.parse().ok();
            }
            (cmd.len() == 2 && cmd[0] == "sleep").then(|| cmd[1].as_str()?.parse().ok())?
        });
        let sleep = sleep.unwrap_or_else(|| panic!("container {i}: added preStop {hook} is neither a sleep nor the waiter"));
        assert!(after.is_some_and(|g| sleep <= g), "container {i}: added sleep {sleep} s above the grace {after:?}");
    }
    let mut leaves = Vec::new();
    scalars(original, String::new(), &mut leaves);
    for (at, value) in leaves {
        let own = OWN_ANNOTATIONS.iter().any(|k| at == format!("/metadata/annotations/{}", k.replace('/', "~1")));
        if at == "/spec/terminationGracePeriodSeconds" || own || ill_typed_above(original, &at) {
            continue;
        }
        assert_eq!(patched.pointer(&at), Some(value), "the patch changed the user's {at}");
    }
}

/// Every non-null scalar under `v` with its JSON pointer.
fn scalars<'a>(v: &'a Value, at: String, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, c)| scalars(c, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, c)| scalars(c, format!("{at}/{i}"), out)),
        Value::Null => {}
        scalar => out.push((at, scalar)),
    }
}

/// True when a field on the way to `at` that a Pod types as an object (`metadata`,
/// `metadata.annotations`, a container, its `lifecycle`) holds something else in `pod`.
fn ill_typed_above(pod: &Value, at: &str) -> bool {
    let parts: Vec<&str> = at.split('/').skip(1).collect();
    let object_at = |n: usize| pod.pointer(&format!("/{}", parts[..n].join("/"))).is_none_or(Value::is_object);
    let typed = match parts.as_slice() {
        ["metadata", "annotations", ..] => object_at(1) && object_at(2),
        ["metadata", ..] => object_at(1),
        ["spec", "containers", _, "lifecycle", ..] => object_at(3) && object_at(4),
        ["spec", "containers", _, ..] => object_at(3),
        _ => true,
    };
    !typed
}

/// `mutate`'s input: the documents of a YAML/JSON file, each with a pod template mutated as
/// `mutate` does it under plan `len % 4`: the patch applies (else `mutate` reports an internal
/// error), the patched pod passes [`check_patched`], and a second pass adds nothing (R11).
pub fn mutate_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(docs) = safe_termination::cli::mutate::documents_of(text, "fuzz.yaml") else { return };
    let plan = &plans()[data.len() % plans().len()];
    for doc in docs.iter().take(64) {
        let Ok((pod, ns)) = safe_termination::cli::mutate::pod_of(doc, "default") else { continue };
        let d = mutate_pod(&pod, &ns, plan, &AssumeServiceBacked as &dyn ServiceIndex);
        // whole warnings (`review` cuts them for the API server: see review_body)
        assert!(d.warnings.iter().all(|w| w.starts_with("safe-termination")), "warnings {:?}", d.warnings);
        let mut patched = pod.clone();
        json_patch::patch(&mut patched, &d.patch.0).unwrap_or_else(|e| panic!("the patch does not apply: {e}\npatch {:?}\npod {pod}", d.patch));
        check_patched(&pod, &patched);
        let again = mutate_pod(&patched, &ns, plan, &AssumeServiceBacked);
        assert!(again.patch.0.is_empty(), "the second pass patched {:?}", again.patch);
    }
}

// ---------------------------------------------------------------------------------------------
// kube-proxy configuration

/// What every accepted configuration holds: periods >= 0 and within Go's `time.Duration`
/// (int64 nanoseconds, about 292 years; beyond is refused, never read as infinity).
fn check_config(c: &ProxyConfig) {
    let max = safe_termination::core::proxyconfig::GO_DURATION_MAX_NANOS * 1e-9;
    assert!((0.0..=max).contains(&c.min_sync_period_seconds), "minSyncPeriod {}", c.min_sync_period_seconds);
    assert!((0.0..=max).contains(&c.sync_period_seconds), "syncPeriod {}", c.sync_period_seconds);
}

/// `/configz` JSON: [`check_config`] on what is accepted; `reduce_configz` accepts exactly
/// what `parse_configz` does, and its reduced body reads the same.
pub fn configz(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let parsed = parse_configz(text);
    let reduced = reduce_configz(text);
    assert_eq!(parsed.is_ok(), reduced.is_ok(), "parse {parsed:?}\nreduce {reduced:?}");
    if let (Ok(c), Ok(r)) = (parsed, reduced) {
        check_config(&c);
        assert_eq!(parse_configz(&r), Ok(c), "the reduced body {r}");
    }
}

/// The ConfigMap's KubeProxyConfiguration (YAML or JSON): [`check_config`] on what is accepted;
/// a file's minSyncPeriod is defaulted unless given above 0 (IPVS: 0 stays 0).
pub fn configmap(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = parse_kube_proxy_config(text) {
        check_config(&c);
        assert!(c.min_sync_period_seconds > 0.0 || c.mode == ProxyMode::Ipvs, "{c:?}");
    }
}

/// Go durations: finite and within `time.Duration`; the sign is the text's (`-` gives <= 0, else >= 0); a plain
/// `<integer><unit>` reads as that integer times the unit.
pub fn go_duration(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(v) = parse_go_duration(text) else { return };
    assert!(v.is_finite() && v.abs() <= safe_termination::core::proxyconfig::GO_DURATION_MAX_NANOS * 1e-9, "{text:?} read as {v}");
    assert!(if text.starts_with('-') { v <= 0.0 } else { v >= 0.0 }, "{text:?} read as {v}");
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if (1..=9).contains(&digits) {
        let Some(scale) = safe_termination::core::proxyconfig::go_duration_unit_seconds(&text[digits..]) else { return };
        let n: f64 = text[..digits].parse().unwrap_or(f64::NAN);
        assert_eq!(v, n * scale, "{text:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// TerminationPolicy

/// A TerminationPolicy spec from JSON: it serialises and reads back the same; a spec that
/// `validate` accepts is sized within its bounds for every basis (the sleep in
/// `[minSeconds, maxSeconds]`, the grace at least the sleep and the 30 s default), and the
/// grace for any pod's own grace is at least that pod's and the sleep.
pub fn policy_spec(data: &[u8]) {
    let Ok(spec) = serde_json::from_slice::<TerminationPolicySpec>(data) else { return };
    let back: TerminationPolicySpec = serde_json::from_value(serde_json::to_value(&spec).expect("a spec serialises")).expect("a written spec reads back");
    assert_eq!(back, spec);
    if spec.validate().is_err() {
        return;
    }
    let p = &spec.pre_stop;
    for basis in [Basis::Measured, Basis::LowSampleCount, Basis::BeyondTopBucket, Basis::NoData] {
        for w in [None, Some(0.0), Some(0.35), Some(4.2), Some(1e9), Some(f64::INFINITY), Some(f64::NAN)] {
            let r = recommend(&ClusterWindow { worst_node: None, propagation_window_seconds: w, basis }, &spec);
            assert!(
                (p.min_seconds..=p.max_seconds).contains(&r.pre_stop_seconds),
                "{basis:?} {w:?}: sleep {} outside [{}, {}]",
                r.pre_stop_seconds,
                p.min_seconds,
                p.max_seconds
            );
            assert!(r.termination_grace_period_seconds >= i64::from(r.pre_stop_seconds).max(KUBERNETES_DEFAULT_GRACE_SECONDS));
            for own in [None, Some(-5), Some(0), Some(1), Some(45), Some(i64::MAX)] {
                let g = grace_seconds(own, r.pre_stop_seconds, &spec.grace);
                assert!(g >= i64::from(r.pre_stop_seconds) && own.is_none_or(|o| g >= o), "own {own:?}: grace {g}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the node agent's answers

/// What the operator reads from an agent's answer. The bytes: a status (2 bytes, 100..=999),
/// a flag byte (bit 0: the body could not be read, e.g. over the limit), then `name: value`
/// header lines up to an empty line, then the body. Checked: a 2xx answer gives the body with
/// its Content-Type and the proxy mode of its header, or the read failure as `other`; any other
/// status is a failure with a known reason label and a message naming the URL and the status;
/// the body then reads as a scrape in the format the Content-Type names (or fails), and as a
/// `/proxyMode` answer; never a panic.
pub fn agent_answer(data: &[u8]) {
    use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
    let mut b = Bytes(data);
    let Ok(status) = reqwest::StatusCode::from_u16(100 + b.u16() % 900) else { return };
    let unreadable = b.u8() & 1 == 1;
    let rest = b.0;
    let (head, body) = match rest.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&rest[..at], &rest[at + 2..]),
        None => (rest, &[][..]),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|&c| c == b'\n') {
        let Some(colon) = line.iter().position(|&c| c == b':') else { continue };
        let value = line[colon + 1..].strip_prefix(b" ").unwrap_or(&line[colon + 1..]);
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(&line[..colon]), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }
    let what = "https://10.0.0.7:10349/metrics";
    let read = if unreadable { Err("the body is over the limit of 16 bytes".to_string()) } else { Ok(body.to_vec()) };
    let answer = safe_termination::sources::agent_client::agent_answer(what, status, &headers, read);
    let known = ["connection_refused", "timeout", "http_status", "parse", "other"];
    match answer {
        Ok((scrape, mode)) => {
            assert!(status.is_success() && !unreadable);
            assert_eq!(scrape.bytes, body);
            let header_mode = headers.get("x-safe-termination-proxy-mode").and_then(|v| v.to_str().ok()).and_then(ProxyMode::parse);
            assert_eq!(mode, header_mode);
            let _ = parse_scrape(&scrape.bytes, scrape.content_type.as_deref());
        }
        Err(safe_termination::sources::agent_client::AgentFailure { reason, message }) => {
            assert!(!status.is_success() || unreadable, "{status}: {reason} {message}");
            assert!(known.contains(&reason.as_str()), "reason {reason}");
            assert!(message.starts_with(what), "{message}");
            if !status.is_success() {
                assert!(message.contains(&format!("HTTP {status}")), "{message}");
            }
        }
    }
    let _ = std::str::from_utf8(body).ok().and_then(ProxyMode::parse);
}

/// The node agent's rule readers' parsers (kube-proxy's `nft list chain` and `iptables -S`
/// listings): never a panic; an accepted nftables listing names at most one IP per map entry,
/// plain `dnat` or `goto endpoint-` line (a one-endpoint Service has no map); an accepted
/// iptables service chain names only `KUBE-SEP-` chains.
pub fn rule_listing(data: &[u8]) {
    use safe_termination::agent::observer::{iptables, nftables};
    let Ok(text) = std::str::from_utf8(data) else { return };
    let chain = "service-JFDYN7UY-exp-a-baseline/web/tcp/http";
    if let Ok(ips) = nftables::parse_service_chain(text, chain) {
        let sources = text.matches(" : ").count() + text.matches(" dnat ").count() + text.matches("goto endpoint-").count();
        assert!(ips.len() <= sources, "{ips:?}");
    }
    if let Ok(seps) = iptables::parse_service_chain(text, "KUBE-SVC-NPX46M4PTMTKRN6Y") {
        assert!(seps.iter().all(|s| s.starts_with("KUBE-SEP-")), "{seps:?}");
    }
    let _ = iptables::parse_endpoint_chain(text, "KUBE-SEP-AAAA");
}

/// The kernel's netlink answers the agent's nftables reader decodes (numbered by the first
/// message's sequence number, so a real answer is decoded whole): no panic; the rules found name
/// at most one map per rule, and a map's endpoints are at most its elements, in either family.
pub fn nft_netlink(data: &[u8]) {
    use netlink_packet_netfilter::nftables::{ListAttribute, NfTablesMessage, SetElementList};
    use safe_termination::agent::observer::nft_netlink::{Family, decode, endpoints_of_map, endpoints_of_rules};
    let seq = data.get(8..12).map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    let mut messages = Vec::new();
    let _ = decode(data, seq, &mut messages);
    let mut rules = Vec::new();
    let mut maps = Vec::new();
    for m in messages {
        match m {
            NfTablesMessage::NewRule(r) => rules.push(r),
            NfTablesMessage::NewSetElement(e) => maps.push(e),
            _ => {}
        }
    }
    let elements: usize = maps
        .iter()
        .flat_map(|m| &m.attributes)
        .map(|a| if let SetElementList::Elements(e) = a { e.iter().filter(|e| matches!(e, ListAttribute::Element(_))).count() } else { 0 })
        .sum();
    for family in [Family::V4, Family::V6] {
        if let Ok(found) = endpoints_of_rules(&rules, family) {
            assert!(found.maps.len() <= rules.len(), "{found:?}");
        }
        if let Ok(ips) = endpoints_of_map(&maps, family) {
            assert!(ips.len() <= elements, "{ips:?} of {elements} elements");
        }
    }
}

/// Cilium's load-balancer maps as the agent's Cilium reader reads them
/// (`agent::observer::cilium`), from bytes: `[capacity/2 - 1] [pause ticks]` then records, each a
/// tag and its fields (host byte order as Cilium writes them): 0 a slot of frontend
/// 10.96.0.1:443/TCP (u16) and its `lb4_service` value (12 bytes), 1 a backend (u32 id, 12-byte
/// `lb4_backend`), 2 and 3 the same made at a tick of the maps' clock (a byte before the
/// fields: Cilium writing while the reader reads), 4 and 5 a slot or a backend deleted at a
/// tick; any other tag ends the input. Checked: every 12 bytes decode and encode back to
/// themselves as each struct; a read never panics, looks up at most `MAX_ATTEMPTS` times
/// `2 + 3 count` keys (count below the map's capacity; twice that through the reader, which may
/// confirm a loss), and answers only addresses some backend entry held.
pub fn cilium_lb(data: &[u8]) {
    use safe_termination::agent::observer::DataPlaneReader as _;
    use safe_termination::agent::observer::cilium::{Backend, CiliumReader, Edit, Frontend, MAX_ATTEMPTS, ServiceKey, ServiceValue, Table, read_frontend};
    use safe_termination::core::removals::ServicePort;
    use std::collections::BTreeSet;
    use std::net::{IpAddr, Ipv4Addr};
    fn take<const N: usize>(data: &[u8], at: &mut usize) -> Option<[u8; N]> {
        let b: [u8; N] = data.get(*at..*at + N)?.try_into().ok()?;
        *at += N;
        Some(b)
    }
    let (Some(&cap), Some(&pause)) = (data.first(), data.get(1)) else { return };
    let frontend = Frontend { address: Ipv4Addr::new(10, 96, 0, 1), port: 443, proto: 6 };
    let mut table = Table { capacity: 2 + 2 * u32::from(cap), pause_ticks: u64::from(pause), ..Table::default() };
    let mut known: BTreeSet<Ipv4Addr> = BTreeSet::new();
    let mut pending = Vec::new();
    let mut values = Vec::new();
    let mut at = 2;
    while let Some(&tag) = data.get(at) {
        at += 1;
        let tick = if (2..=5).contains(&tag) { take::<1>(data, &mut at).map(|[t]| u64::from(t)) } else { Some(0) };
        let Some(tick) = tick else { break };
        let edit = match tag {
            0 | 2 => {
                let (Some(slot), Some(v)) = (take::<2>(data, &mut at), take::<12>(data, &mut at)) else { break };
                values.push(v);
                Edit::Service(frontend.key(u16::from_ne_bytes(slot)).encode(), Some(v))
            }
            1 | 3 => {
                let (Some(id), Some(v)) = (take::<4>(data, &mut at), take::<12>(data, &mut at)) else { break };
                values.push(v);
                known.insert(Backend::decode(&v).address);
                Edit::Backend(u32::from_ne_bytes(id), Some(v))
            }
            4 => {
                let Some(slot) = take::<2>(data, &mut at) else { break };
                Edit::Service(frontend.key(u16::from_ne_bytes(slot)).encode(), None)
            }
            5 => {
                let Some(id) = take::<4>(data, &mut at) else { break };
                Edit::Backend(u32::from_ne_bytes(id), None)
            }
            _ => break,
        };
        if tag < 2 { table.apply(&edit) } else { pending.push((tick, edit)) }
    }
    for v in &values {
        assert_eq!(&ServiceValue::decode(v).encode(), v);
        assert_eq!(&Backend::decode(v).encode(), v);
        assert_eq!(&ServiceKey::decode(v).encode(), v);
    }
    pending.sort_by_key(|(tick, _)| *tick);
    table.pending = pending.into_iter().collect();
    let per_read = u64::from(MAX_ATTEMPTS) * (2 + 3 * u64::from(table.capacity - 1));
    let mut direct = table.clone();
    if let Ok(Some(ips)) = read_frontend(&mut direct, &frontend) {
        assert!(ips.is_subset(&known), "{ips:?} not among the backends {known:?}");
    }
    assert!(direct.lookups <= per_read, "{} lookups, at most {per_read}", direct.lookups);
    let service = ServicePort {
        namespace: "default".into(),
        name: "web".into(),
        port_name: String::new(),
        protocol: "TCP".into(),
        cluster_ip: IpAddr::V4(frontend.address),
        port: 443,
    };
    let mut reader = CiliumReader::new(table);
    for n in 1..=2u64 {
        if let Ok(Some(ips)) = reader.endpoints(&service) {
            assert!(ips.iter().all(|ip| matches!(ip, IpAddr::V4(v4) if known.contains(v4))), "{ips:?} not among the backends {known:?}");
        }
        assert!(reader.maps().lookups <= n * 2 * per_read, "{} lookups in {n} reads", reader.maps().lookups);
    }
}

/// The observer's wire records, both directions: a body the agent accepts (parsed and within
/// its bounds) becomes watches, one record per distinct (Service port, endpoint), each still
/// held or expired before any read, and writes back to the same request; an answer the operator
/// accepts reports into a store without a panic, whatever its times (NaN, infinite, negative are
/// refused by JSON or moved as numbers), and closing at any time keeps every window finite or
/// absent.
pub fn observe_wire(data: &[u8]) {
    use safe_termination::agent::observer::metrics::ObserverMetrics;
    use safe_termination::agent::observer::watch::Watches;
    use safe_termination::agent_contract::observer::{ObserveRequest, ObserveResponse, WatchState};
    use safe_termination::controller::observer::report_of;
    use safe_termination::core::removals::{ClockOffset, PendingRemoval, RemovalStore};
    if let Ok(req) = serde_json::from_slice::<ObserveRequest>(data)
        && req.check().is_ok()
    {
        let mut w = Watches::default();
        w.set(&req, 1000.0);
        let distinct: std::collections::BTreeSet<_> = req.watches.iter().map(|x| (&x.service, x.endpoint)).collect();
        let records = w.records(1000.0);
        assert_eq!(records.len(), distinct.len());
        assert!(records.iter().all(|r| matches!(r.state, WatchState::Held | WatchState::Expired) && r.reads == 0));
        let again: ObserveRequest = serde_json::from_slice(&serde_json::to_vec(&req).unwrap()).unwrap();
        assert_eq!(again, req);
        // one read without any endpoint removes every watch; each whose request carried the
        // deletion's age is counted in the deletion-to-removed histogram, which writes in both
        // expositions
        let mut metrics = ObserverMetrics::default();
        let ports: std::collections::BTreeSet<_> = req.watches.iter().map(|x| x.service.clone()).collect();
        let (mut removed, mut aged) = (0, 0);
        for p in &ports {
            for r in w.apply(p, &Ok(Some(Default::default())), 1000.5, 1000.6) {
                removed += 1;
                if let Some(deletion) = r.deletion {
                    assert!(deletion <= 1000.0 && deletion.is_finite());
                    metrics.removed(r.first_without - deletion);
                    aged += 1;
                }
            }
        }
        assert_eq!((removed, metrics.removals()), (distinct.len(), aged));
        assert!(!metrics.exposition(true, Some("node-a")).is_empty() && !metrics.exposition(false, None).is_empty());
    }
    if let Ok(resp) = serde_json::from_slice::<ObserveResponse>(data) {
        let clock = ClockOffset::of(resp.agent_unix_seconds, 999.0, 1000.0);
        let mut store = RemovalStore::default();
        for r in &resp.records {
            store.open(PendingRemoval {
                service: r.service.clone(),
                endpoint: r.endpoint,
                pod: "ns/p".into(),
                deletion: 990.0,
                sleep_seconds: Some(3),
                deadline: 1050.0,
            });
            store.report("node-a", &r.service, r.endpoint, report_of(r, &clock));
        }
        let nodes = ["node-a".to_string()].into();
        store.close(1000.0, &nodes);
        store.close(1100.0, &nodes);
        let s = store.summary(1100.0, 300.0);
        assert!(s.removals <= resp.records.len());
        assert!(s.p99_seconds.is_none_or(|p| !p.is_nan()));
    }
}
