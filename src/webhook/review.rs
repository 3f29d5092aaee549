//! AdmissionReview v1 in, AdmissionReview v1 out: the whole admission decision as a pure
//! function of the request body, the plan and the Service index. The HTTPS server and the
//! `review` command both call [`review`], so the command prints exactly what the server sends.
//!
//! Rule R9: only Pod CREATE without a subresource is mutated; every other request is allowed
//! with no patch; `response.uid` always echoes `request.uid`. A body that is not an
//! AdmissionReview v1 gets HTTP 400 with a message naming what was wrong. An internal failure
//! (a bug) answers `allowed: true` with a warning: the webhook fails open.
//!
//! Wire format: kube-core 5 serialises `AdmissionResponse.patch` (`Vec<u8>`) as a JSON array of
//! numbers. Kubernetes documents `patch` as base64 (Go `[]byte`); the response is written here
//! directly, in kube-core's field order, with `patch` as base64, so that it matches the
//! documented form whatever the decoder accepts (tests/e2e_in_process.rs: a real kube-apiserver applies it).
//!
//! Cost: the body is parsed once into a `serde_json::Value` holding only what the decision reads
//! ([`parse_review`]: at most [`MAX_POD_CONTAINERS`] + 1 containers and [`MAX_POD_LABELS`] + 1
//! labels, so its size follows the body's bytes); the request's fields are read from it by
//! reference and the pod is patched in place to check the patch (docs/benchmarks/webhook.md "Webhook",
//! docs/benchmarks/bounded-work.md "Bounded work per request").

use crate::core::annotations::{
    ANNOTATION_AUDIT_PRESTOP_SECONDS, ANNOTATION_MIRROR, ANNOTATION_POLICY, ANNOTATION_PRESTOP_SECONDS, ANNOTATION_SKIP, ANNOTATION_SKIP_CONTAINERS,
};
use crate::core::mutate::{MAX_POD_CONTAINERS, MAX_POD_LABELS, PodMutation, PodReason, mutate_pod, short_warning};
use crate::core::plan::Plan;
use crate::core::selector::ServiceIndex;
use base64::Engine as _;
use serde_json::Value;

/// The answer to one admission HTTP request.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewOutcome {
    /// HTTP status: 200, or 400 for a body that is not an AdmissionReview v1.
    pub status: u16,
    /// Response body: an AdmissionReview JSON, or a plain-text error for 400.
    pub body: Vec<u8>,
    /// `request.uid` (empty when unknown).
    pub uid: String,
    /// `request.namespace`.
    pub namespace: String,
    /// `request.name` or the pod's generateName.
    pub name: String,
    /// PodMutation label for logs and metrics (`mutated`, `no_change`, `skipped_*`, `ignored`,
    /// `fail_open`, `bad_request`).
    pub decision: &'static str,
    /// Number of patch operations sent.
    pub patch_ops: usize,
    /// True when an internal error was answered with `allowed: true`.
    pub fail_open: bool,
}

fn bad_request(message: String) -> ReviewOutcome {
    ReviewOutcome {
        status: 400,
        body: format!("bad AdmissionReview: {message}\n").into_bytes(),
        uid: String::new(),
        namespace: String::new(),
        name: String::new(),
        decision: "bad_request",
        patch_ops: 0,
        fail_open: false,
    }
}

/// PodMutation label of a pod reason.
pub fn decision_label(reason: PodReason) -> &'static str {
    match reason {
        PodReason::Mutated => "mutated",
        PodReason::Audited => "audited",
        PodReason::NoChange => "no_change",
        PodReason::NotAPod => "skipped_not_a_pod",
        PodReason::NoPolicy => "skipped_no_policy",
        PodReason::PolicyDisabled => "skipped_policy_disabled",
        PodReason::OptedOut => "skipped_opted_out",
        PodReason::RunToCompletion => "skipped_run_to_completion",
        PodReason::MirrorPod => "skipped_mirror_pod",
        PodReason::NotServiceBacked => "skipped_not_service_backed",
        PodReason::GraceZero => "skipped_grace_zero",
        PodReason::ZeroSleep => "skipped_zero_sleep",
        PodReason::NoUsableHandler => "skipped_no_usable_handler",
        PodReason::TooManyContainers => "skipped_too_many_containers",
        PodReason::TooManyLabels => "skipped_too_many_labels",
    }
}

/// The fields of an AdmissionReview v1 request the decision needs, read by reference from the
/// parsed body (no second, typed decode of the whole review: that cost more than the decision).
///
/// The contract (checked by [`request_of`]; every request kube-core's `AdmissionRequest`
/// accepts meets it): `uid` a non-empty string; `kind` `{group, version, kind}` and `resource`
/// `{group, version, resource}` objects of strings (or arrays of three strings, the sequence
/// form serde accepts for kube-core's structs); `operation` one of `CREATE`, `UPDATE`,
/// `DELETE`, `CONNECT`; `subResource`, `namespace` absent, null or a string; `name` absent or a
/// string; `object` (checked by [`review`], which takes it out) absent, null or an object. Other
/// fields (userInfo, oldObject, options, dryRun) are not read.
struct RequestFields<'a> {
    uid: &'a str,
    group: &'a str,
    version: &'a str,
    resource: &'a str,
    sub_resource: &'a str,
    operation: &'a str,
    namespace: &'a str,
    name: &'a str,
}

/// Reads and checks the fields of `request` (see [`RequestFields`]). Errors name the field.
fn request_of(req: &Value) -> Result<RequestFields<'_>, String> {
    let uid = match req.get("uid") {
        Some(Value::String(u)) if !u.is_empty() => u.as_str(),
        None | Some(Value::Null) | Some(Value::String(_)) => return Err("request.uid is missing or empty".into()),
        Some(_) => return Err("request.uid is not a string".into()),
    };
    // an object with the three keys, or (as serde, and so kube-core, also accepts for a struct)
    // an array of exactly three strings in that order
    let object_of_strings = |field: &str, keys: [&str; 3]| -> Result<[&str; 3], String> {
        let mut out = [""; 3];
        match req.get(field) {
            Some(Value::Object(o)) => {
                for (slot, key) in out.iter_mut().zip(keys) {
                    *slot = o.get(key).and_then(Value::as_str).ok_or_else(|| format!("request {uid}: request.{field}.{key} is missing or not a string"))?;
                }
            }
            Some(Value::Array(a)) if a.len() == 3 && a.iter().all(Value::is_string) => {
                for (slot, v) in out.iter_mut().zip(a) {
                    *slot = v.as_str().unwrap_or("");
                }
            }
            _ => return Err(format!("request {uid}: request.{field} is missing or not an object {{{}}}", keys.join(", "))),
        }
        Ok(out)
    };
    object_of_strings("kind", ["group", "version", "kind"])?;
    let [group, version, resource] = object_of_strings("resource", ["group", "version", "resource"])?;
    let optional = |field: &str| -> Result<&str, String> {
        match req.get(field) {
            None | Some(Value::Null) => Ok(""),
            Some(Value::String(s)) => Ok(s.as_str()),
            Some(_) => Err(format!("request {uid}: request.{field} is not a string")),
        }
    };
    let sub_resource = optional("subResource")?;
    let namespace = optional("namespace")?;
    let name = match req.get("name") {
        None => "",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(format!("request {uid}: request.name is not a string")),
    };
    let operation = match req.get("operation").and_then(Value::as_str) {
        Some(op @ ("CREATE" | "UPDATE" | "DELETE" | "CONNECT")) => op,
        _ => return Err(format!("request {uid}: request.operation is missing or not one of CREATE, UPDATE, DELETE, CONNECT")),
    };
    Ok(RequestFields { uid, group, version, resource, sub_resource, operation, namespace, name })
}

/// The response half of an AdmissionReview v1, serialised in the field order (sorted) and
/// form kube-core's `AdmissionResponse` has: `patch` as base64 (Go `[]byte`), `status` `{}`.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Response<'a> {
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    status: Empty,
    uid: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

#[derive(serde::Serialize)]
struct Empty {}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseReview<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: Response<'a>,
}

impl<'a> Response<'a> {
    fn allow(uid: &'a str) -> Self {
        Self { allowed: true, patch: None, patch_type: None, status: Empty {}, uid, warnings: Vec::new() }
    }

    fn encode(self) -> Vec<u8> {
        let review = ResponseReview { api_version: "admission.k8s.io/v1", kind: "AdmissionReview", response: self };
        // strings, a bool and an empty map: serialisation into a Vec cannot fail
        serde_json::to_vec(&review).unwrap_or_default()
    }
}

/// Handles one AdmissionReview request body. Never panics.
pub fn review(body: &[u8], plan: &Plan, services: &dyn ServiceIndex) -> ReviewOutcome {
    let mut value: Value = match parse_review(body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("body is not JSON: {e}")),
    };
    let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "AdmissionReview" || api_version != "admission.k8s.io/v1" {
        return bad_request(format!("expected kind AdmissionReview, apiVersion admission.k8s.io/v1; got kind {kind:?}, apiVersion {api_version:?}"));
    }
    let Some(req_value) = value.get_mut("request").filter(|r| r.is_object()) else {
        return bad_request("no request object".into());
    };
    // the object is taken out (not copied): the patch is checked against it in place below
    let mut object = req_value.get_mut("object").map(Value::take).unwrap_or(Value::Null);
    let req = match request_of(req_value) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    if !matches!(object, Value::Null | Value::Object(_)) {
        return bad_request(format!("request {}: request.object is not an object", req.uid));
    }
    let name = if req.name.is_empty() { object.pointer("/metadata/generateName").and_then(Value::as_str).unwrap_or("") } else { req.name };
    let mut out = ReviewOutcome {
        status: 200,
        body: Vec::new(),
        uid: req.uid.to_string(),
        namespace: req.namespace.to_string(),
        name: name.to_string(),
        decision: "ignored",
        patch_ops: 0,
        fail_open: false,
    };
    let mut response = Response::allow(req.uid);
    let is_pod = req.group.is_empty() && req.version == "v1" && req.resource == "pods";
    if is_pod && req.operation == "CREATE" && req.sub_resource.is_empty() && object.is_object() {
        let decided = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mutate_pod(&object, req.namespace, plan, services)));
        match decided {
            // Never send a patch the API server cannot apply (it would fail the pod's creation):
            // apply it to the object first (ours to change: it is not used afterwards), and fail
            // open if it does not apply. patch_unsafe: no undo log, the object is thrown away
            // whatever the outcome.
            Ok(decision) if !decision.patch.0.is_empty() && json_patch::patch_unsafe(&mut object, &decision.patch.0).is_err() => {
                fail_open(&mut response, &mut out, "internal error: the patch does not apply to the pod");
            }
            Ok(decision) => apply(&mut response, decision, &mut out),
            Err(_) => fail_open(&mut response, &mut out, "internal error while deciding the mutation"),
        }
    }
    out.body = response.encode();
    out
}

fn apply(response: &mut Response<'_>, d: PodMutation, out: &mut ReviewOutcome) {
    out.decision = decision_label(d.reason);
    if !d.patch.0.is_empty() {
        match serde_json::to_vec(&d.patch) {
            Ok(bytes) => {
                out.patch_ops = d.patch.0.len();
                response.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
                response.patch_type = Some("JSONPatch");
            }
            Err(e) => return fail_open(response, out, &format!("cannot serialise the patch: {e}")),
        }
    }
    response.warnings = d.warnings.into_iter().map(short_warning).collect();
}

fn fail_open(response: &mut Response<'_>, out: &mut ReviewOutcome, why: &str) {
    out.decision = "fail_open";
    out.fail_open = true;
    out.patch_ops = 0;
    response.allowed = true;
    response.patch = None;
    response.patch_type = None;
    response.warnings = vec![short_warning(format!("safe-termination: {why}; pod admitted unchanged"))];
}

/// Where a JSON value sits in an AdmissionReview, for [`parse_review`]: which keys of an
/// object there are kept, the place of each kept key's value, and how many of an array's
/// elements are kept ([`Place::elements`]).
///
/// No place keeps a value whole: a scalar ([`Place::Scalar`]) is kept, an object or array there
/// is replaced by an empty one of the same type (the decision only asks whether such a value is
/// there, and of which type). So the parsed value holds each kept string once, and at most a
/// fixed number of objects per container, for at most [`MAX_POD_CONTAINERS`] + 1 containers:
/// its size follows the body's bytes, not the number of JSON values in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// A string, number, bool or null, kept; an object or array, kept empty.
    Scalar,
    /// The envelope: `apiVersion`, `kind`, `request`.
    Review,
    /// `request`: the fields of [`RequestFields`] and `object`.
    Request,
    /// `request.kind` and `request.resource`: an object's `group`, `version`, `kind`,
    /// `resource`, or an array's first four elements (the contract takes exactly three: a fourth
    /// kept tells a longer array from a valid one).
    Gvk,
    /// `request.object`: `kind`, `apiVersion`, `metadata`, `spec`.
    Pod,
    /// `metadata`: `annotations`, `labels`, `namespace`, `name`, `generateName`.
    Metadata,
    /// `metadata.annotations`: only the keys [`mutate_pod`] reads (ours and the mirror-pod
    /// key); others (such as kubectl's last-applied-configuration, often kilobytes) are skipped.
    Annotations,
    /// `metadata.labels`: the first [`MAX_POD_LABELS`] + 1 distinct keys (policies and Services
    /// select on them), scalar values; the rest are checked and dropped (one more than the limit
    /// tells the engine the pod is over it).
    Labels,
    /// `spec`: `containers`, `initContainers`, `restartPolicy`, `terminationGracePeriodSeconds`,
    /// `os`, `nodeSelector`.
    Spec,
    /// `spec.containers`: the first [`MAX_POD_CONTAINERS`] + 1 elements, each a
    /// [`Place::Container`]; the rest are checked and dropped (one more than the limit tells
    /// the engine the pod is over it, and the pod is then left unchanged).
    Containers,
    /// `spec.initContainers`: counted, not read: the first [`MAX_POD_CONTAINERS`] + 1 elements
    /// kept as [`Place::Scalar`] (an empty object each).
    InitContainers,
    /// A container: `name`, `image`, `lifecycle`.
    Container,
    /// `lifecycle`: `preStop` (whether it is there; `postStart` is not read).
    Lifecycle,
    /// `lifecycle.preStop`: `sleep` (an existing sleep's seconds are compared with the plan's).
    PreStop,
    /// `preStop.sleep`: `seconds`.
    Sleep,
    /// `spec.os`: `name`.
    Os,
    /// `spec.nodeSelector`: `kubernetes.io/os`.
    NodeSelector,
}

impl Place {
    /// The place of the value under `key`, `None` when the key is dropped.
    fn child(self, key: &str) -> Option<Place> {
        use Place::*;
        match (self, key) {
            (Review, "apiVersion" | "kind") => Some(Scalar),
            (Review, "request") => Some(Request),
            (Request, "object") => Some(Pod),
            (Request, "kind" | "resource") => Some(Gvk),
            (Request, "uid" | "subResource" | "name" | "namespace" | "operation") => Some(Scalar),
            (Gvk, "group" | "version" | "kind" | "resource") => Some(Scalar),
            (Pod, "kind" | "apiVersion") => Some(Scalar),
            (Pod, "metadata") => Some(Metadata),
            (Pod, "spec") => Some(Spec),
            (Metadata, "annotations") => Some(Annotations),
            (Metadata, "labels") => Some(Labels),
            (Metadata, "namespace" | "name" | "generateName") => Some(Scalar),
            (Annotations, k) if READ_ANNOTATIONS.contains(&k) => Some(Scalar),
            (Labels, _) => Some(Scalar),
            (Spec, "containers") => Some(Containers),
            (Spec, "initContainers") => Some(InitContainers),
            (Spec, "restartPolicy" | "terminationGracePeriodSeconds") => Some(Scalar),
            (Spec, "os") => Some(Os),
            (Spec, "nodeSelector") => Some(NodeSelector),
            (Container, "name" | "image") => Some(Scalar),
            (Container, "lifecycle") => Some(Lifecycle),
            (Lifecycle, "preStop") => Some(PreStop),
            (PreStop, "sleep") => Some(Sleep),
            (Sleep, "seconds") => Some(Scalar),
            (Os, "name") => Some(Scalar),
            (NodeSelector, "kubernetes.io/os") => Some(Scalar),
            _ => None,
        }
    }

    /// The place of an array's elements here, and how many are kept (the rest are checked and
    /// dropped).
    fn elements(self) -> (Place, usize) {
        match self {
            Place::Containers => (Place::Container, MAX_POD_CONTAINERS + 1),
            Place::InitContainers => (Place::Scalar, MAX_POD_CONTAINERS + 1),
            Place::Gvk => (Place::Scalar, 4),
            _ => (Place::Scalar, 0),
        }
    }
}

/// The pod annotations [`mutate_pod`] reads; [`parse_review`] keeps no other.
const READ_ANNOTATIONS: [&str; 6] =
    [ANNOTATION_MIRROR, ANNOTATION_SKIP, ANNOTATION_SKIP_CONTAINERS, ANNOTATION_PRESTOP_SECONDS, ANNOTATION_POLICY, ANNOTATION_AUDIT_PRESTOP_SECONDS];

/// Parses an AdmissionReview body into a `serde_json::Value` that holds only what [`review`]
/// and [`mutate_pod`] read (see [`Place`]): the envelope, the request's identifying fields, and
/// of the pod its kind, metadata labels/namespace/name/generateName and the annotations
/// [`mutate_pod`] reads ([`READ_ANNOTATIONS`]: the map itself is kept, even empty), and of its
/// spec the first [`MAX_POD_CONTAINERS`] + 1 containers' name, image and
/// `lifecycle.preStop.sleep.seconds`, the init containers' count (up to the same bound),
/// restartPolicy, terminationGracePeriodSeconds, `os.name` and the `kubernetes.io/os` node
/// selector. Everything else (managedFields, userInfo, oldObject, volumes, env, probes, status,
/// postStart, the containers past the bound, ...) is checked as JSON and skipped without being
/// built, which is most of the body's allocations; an object or array where a scalar is read is
/// kept empty. Every JSON patch [`mutate_pod`] makes touches only kept paths (a container, its
/// lifecycle, the grace, the annotations), and each kept value has the type it has in the whole
/// object, so the patch applies to this value exactly when it applies to the whole object, and
/// the decision is the same (tested against whole objects in tests/webhook_fuzz.rs and
/// tests/webhook_cases.rs).
///
/// Memory: the parsed value holds each kept string's bytes once, at most a few small objects
/// per kept container, and one map entry per label: it follows the body's bytes, and the
/// containers past the bound cost nothing (docs/benchmarks/bounded-work.md "Bounded work per request").
///
/// Errors: the body is not UTF-8 or not one JSON value (serde_json's message, with line and
/// column); the same inputs `serde_json::from_slice::<Value>` rejects.
pub fn parse_review(body: &[u8]) -> Result<Value, serde_json::Error> {
    use serde::de::DeserializeSeed as _;
    let text = std::str::from_utf8(body).map_err(|e| <serde_json::Error as serde::de::Error>::custom(format!("body is not UTF-8: {e}")))?;
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Pruned(Place::Review).deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// [`parse_review`]'s seed: a `Value` built at `Place`.
struct Pruned(Place);

/// A value checked as `serde_json::Value` would check it, and dropped: every string, escape and
/// number is parsed (strings borrowed from the body, nothing allocated). Not serde's
/// `IgnoredAny`: serde_json skips that one without parsing its numbers, so `1e999` (outside
/// f64's range, which `Value` refuses) would pass in a field that is not read.
struct Skip;

impl<'de> serde::de::DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(Skip)?.is_some() {
            map.next_value_seed(Skip)?;
        }
        Ok(())
    }
}

/// An object key, borrowed from the body when it has no escapes.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v.to_string()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Pruned {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Pruned {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let (element, keep) = self.0.elements();
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(keep).min(64));
        while out.len() < keep {
            match seq.next_element_seed(Pruned(element))? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        // labels: distinct keys past the bound are not kept (a repeated key replaces its value,
        // as in serde_json's Value, so the count is of distinct keys either way)
        let keep = if self.0 == Place::Labels { MAX_POD_LABELS + 1 } else { usize::MAX };
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let kept = out.len() < keep || out.contains_key(key.as_str());
            match self.0.child(key.as_str()).filter(|_| kept) {
                Some(place) => {
                    let v = map.next_value_seed(Pruned(place))?;
                    let key = match key {
                        Key::Borrowed(s) => s.to_string(),
                        Key::Owned(s) => s,
                    };
                    out.insert(key, v);
                }
                None => map.next_value_seed(Skip)?,
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CASE: &[u8] = include_bytes!("../../tests/data/admission/admissionreview-pod-create.json");

    #[test]
    fn parse_review_keeps_only_what_the_decision_reads() {
        let v = parse_review(CASE).unwrap();
        let whole: Value = serde_json::from_slice(CASE).unwrap();
        let r = &v["request"];
        assert_eq!(r.as_object().unwrap().keys().collect::<Vec<_>>(), ["kind", "name", "namespace", "object", "operation", "resource", "uid"]);
        assert_eq!(r["object"]["metadata"].as_object().unwrap().keys().collect::<Vec<_>>(), ["annotations", "labels", "name", "namespace"]);
        // the map is kept, without kubectl's last-applied-configuration (not read)
        assert!(whole["request"]["object"]["metadata"]["annotations"].as_object().unwrap().contains_key("kubectl.kubernetes.io/last-applied-configuration"));
        assert_eq!(r["object"]["metadata"]["annotations"], serde_json::json!({}));
        let ours = parse_review(
            br#"{"request": {"object": {"metadata": {"annotations": {"a": "1", "safetermination.io/skip": "true", "kubernetes.io/config.mirror": "x"}}}}}"#,
        )
        .unwrap();
        assert_eq!(
            ours["request"]["object"]["metadata"]["annotations"],
            serde_json::json!({"safetermination.io/skip": "true", "kubernetes.io/config.mirror": "x"})
        );
        assert_eq!(r["object"]["spec"].as_object().unwrap().keys().collect::<Vec<_>>(), ["containers", "restartPolicy", "terminationGracePeriodSeconds"]);
        assert_eq!(r["object"]["spec"]["containers"], serde_json::json!([{"image": "jmalloc/echo-server", "name": "echo-server"}]));
        assert_eq!(r["uid"], whole["request"]["uid"]);
    }

    #[test]
    fn parse_review_keeps_scalars_and_bounded_lists_only() {
        let containers: Vec<Value> = (0..MAX_POD_CONTAINERS + 40)
            .map(|i| {
                serde_json::json!({"name": format!("c{i}"), "image": "x", "env": [{"name": "A"}],
                    "lifecycle": {"postStart": {"exec": {"command": ["a", "b"]}}, "preStop": {"sleep": {"seconds": 3, "x": 1}, "exec": {"command": ["a"]}}}})
            })
            .collect();
        let labels: serde_json::Map<String, Value> = (0..MAX_POD_LABELS + 40).map(|i| (format!("l{i}"), Value::from("v"))).collect();
        let body = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "kind": ["", "v1", "Pod", "x", "y"], "resource": {"group": "", "version": "v1", "resource": "pods", "extra": [1, 2]},
            "name": [1, 2, 3], "object": {"metadata": {"labels": labels},
                "spec": {"containers": containers, "initContainers": [{"name": "i0", "image": "x"}, {"name": "i1"}], "os": {"name": "linux", "x": [1]},
                    "nodeSelector": {"kubernetes.io/os": "linux", "zone": "a"}, "terminationGracePeriodSeconds": [1, 2, 3], "restartPolicy": {"a": "b"}}}}});
        let v = parse_review(&serde_json::to_vec(&body).unwrap()).unwrap();
        let r = &v["request"];
        // objects and arrays where a scalar is read are kept empty; a kind array keeps four
        // elements, so it is still refused as not three
        assert_eq!(r["kind"], serde_json::json!(["", "v1", "Pod", "x"]));
        assert_eq!(r["resource"], serde_json::json!({"group": "", "version": "v1", "resource": "pods"}));
        assert_eq!(r["name"], serde_json::json!([]));
        let spec = &r["object"]["spec"];
        assert_eq!((&spec["terminationGracePeriodSeconds"], &spec["restartPolicy"]), (&serde_json::json!([]), &serde_json::json!({})));
        assert_eq!((&spec["os"], &spec["nodeSelector"]), (&serde_json::json!({"name": "linux"}), &serde_json::json!({"kubernetes.io/os": "linux"})));
        // one more container and label than the bounds, each container's name, image and
        // preStop.sleep.seconds; init containers counted as empty objects
        let kept = spec["containers"].as_array().unwrap();
        assert_eq!(kept.len(), MAX_POD_CONTAINERS + 1);
        assert_eq!(kept[3], serde_json::json!({"name": "c3", "image": "x", "lifecycle": {"preStop": {"sleep": {"seconds": 3}}}}));
        assert_eq!(spec["initContainers"], serde_json::json!([{}, {}]));
        assert_eq!(r["object"]["metadata"]["labels"].as_object().unwrap().len(), MAX_POD_LABELS + 1);
        assert_eq!(request_of(r).err().as_deref(), Some("request u: request.kind is missing or not an object {group, version, kind}"));
    }

    #[test]
    fn parse_review_rejects_what_serde_json_rejects() {
        // the last two: numbers outside f64's range, in fields that are not read (found by the
        // `review` fuzz target: the pod held `"": 1e455`)
        for bad in [
            &b"{\"kind\": 1} x"[..],
            b"{\"request\": {\"userInfo\": {\"a\": [1,}}}",
            b"{\"a\": \"\xff\"}",
            b"",
            b"{\"request\": {\"oldObject\": tru}}",
            b"{\"request\": {\"object\": {\"\": 1e455}}}",
            b"{\"x\": [{\"y\": -2e308}]}",
        ] {
            assert!(parse_review(bad).is_err(), "{}", String::from_utf8_lossy(bad));
            assert!(serde_json::from_slice::<Value>(bad).is_err());
        }
        // duplicate keys: the last one wins, as in serde_json's Value
        let v = parse_review(br#"{"kind": "a", "kind": "AdmissionReview", "x": {"y": [1, {"z": null}]}}"#).unwrap();
        assert_eq!(v, serde_json::json!({"kind": "AdmissionReview"}));
    }
}
