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
//! numbers. Kubernetes documents `patch` as base64 (Go `[]byte`); the response is re-encoded to
//! base64 here so that it matches the documented form whatever the decoder accepts.

use super::mutate::{Decision, PodReason, mutate_pod, short_warning};
use super::plan::{Plan, ServiceIndex};
use base64::Engine as _;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::Deserialize as _;
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
    /// Decision label for logs and metrics (`mutated`, `no_change`, `skipped_*`, `ignored`,
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

/// Decision label of a pod reason.
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
    }
}

/// Serialises a response review, with `patch` as base64.
fn encode(mut review: AdmissionReview<DynamicObject>) -> Result<Vec<u8>, String> {
    // the patch bytes are taken out first: through serde they would become a JSON array with one
    // number per byte (hundreds of MB for a pod with tens of thousands of containers)
    let patch = review.response.as_mut().and_then(|r| r.patch.take());
    let mut v = serde_json::to_value(&review).map_err(|e| e.to_string())?;
    if let (Some(bytes), Some(resp)) = (patch, v.get_mut("response").and_then(Value::as_object_mut)) {
        resp.insert("patch".into(), Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)));
    }
    serde_json::to_vec(&v).map_err(|e| e.to_string())
}

/// Handles one AdmissionReview request body. Never panics.
pub fn review(body: &[u8], plan: &Plan, services: &dyn ServiceIndex) -> ReviewOutcome {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("body is not JSON: {e}")),
    };
    let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "AdmissionReview" || api_version != "admission.k8s.io/v1" {
        return bad_request(format!(
            "expected kind AdmissionReview, apiVersion admission.k8s.io/v1; got kind {kind:?}, apiVersion {api_version:?}"
        ));
    }
    let Some(req_value) = value.get("request").filter(|r| r.is_object()) else {
        return bad_request("no request object".into());
    };
    let uid = match req_value.get("uid").and_then(Value::as_str) {
        Some(u) if !u.is_empty() => u.to_string(),
        _ => return bad_request("request.uid is missing or empty".into()),
    };
    // decoded from the parsed value by reference: no copy of the (possibly large) object
    let review_typed: AdmissionReview<DynamicObject> = match AdmissionReview::deserialize(&value) {
        Ok(r) => r,
        Err(e) => return bad_request(format!("request {uid} does not decode as AdmissionReview v1: {e}")),
    };
    let req: AdmissionRequest<DynamicObject> = match review_typed.try_into() {
        Ok(r) => r,
        Err(e) => return bad_request(format!("request {uid}: {e}")),
    };
    let namespace = req.namespace.clone().unwrap_or_default();
    let object = req_value.get("object");
    let name = if req.name.is_empty() {
        object.and_then(|o| o.pointer("/metadata/generateName")).and_then(Value::as_str).unwrap_or("").to_string()
    } else {
        req.name.clone()
    };
    let mut out = ReviewOutcome {
        status: 200,
        body: Vec::new(),
        uid: uid.clone(),
        namespace: namespace.clone(),
        name,
        decision: "ignored",
        patch_ops: 0,
        fail_open: false,
    };
    let response = AdmissionResponse::from(&req);
    let is_pod = req.resource.group.is_empty() && req.resource.version == "v1" && req.resource.resource == "pods";
    let mutable = is_pod && req.operation == Operation::Create && req.sub_resource.as_deref().unwrap_or("").is_empty();
    let response = match (mutable, object) {
        (true, Some(pod)) => {
            let decided = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mutate_pod(pod, &namespace, plan, services)));
            match decided {
                // Never send a patch the API server cannot apply (it would fail the pod's
                // creation): check it against the object first, and fail open if it does not.
                Ok(decision) if !patch_applies(pod, &decision.patch) => {
                    fail_open(response, &mut out, "internal error: the patch does not apply to the pod")
                }
                Ok(decision) => apply(response, decision, &mut out),
                Err(_) => fail_open(response, &mut out, "internal error while deciding the mutation"),
            }
        }
        _ => response,
    };
    match encode(response.into_review()) {
        Ok(body) => out.body = body,
        Err(e) => {
            // cannot happen for these types; answer allowed with no patch rather than fail closed
            let fallback = fail_open(AdmissionResponse::from(&req), &mut out, &format!("cannot encode the response: {e}"));
            out.body = encode(fallback.into_review()).unwrap_or_default();
        }
    }
    out
}

/// True when `patch` applies cleanly to `object` (always true for an empty patch).
fn patch_applies(object: &Value, patch: &json_patch::Patch) -> bool {
    if patch.0.is_empty() {
        return true;
    }
    let mut probe = object.clone();
    json_patch::patch(&mut probe, &patch.0).is_ok()
}

fn apply(response: AdmissionResponse, d: Decision, out: &mut ReviewOutcome) -> AdmissionResponse {
    out.decision = decision_label(d.reason);
    let mut response = if d.patch.0.is_empty() {
        response
    } else {
        let n = d.patch.0.len();
        match response.clone().with_patch(d.patch) {
            Ok(r) => {
                out.patch_ops = n;
                r
            }
            Err(e) => return fail_open(response, out, &format!("cannot serialise the patch: {e}")),
        }
    };
    if !d.warnings.is_empty() {
        response.warnings = Some(d.warnings.into_iter().map(short_warning).collect());
    }
    response
}

fn fail_open(mut response: AdmissionResponse, out: &mut ReviewOutcome, why: &str) -> AdmissionResponse {
    out.decision = "fail_open";
    out.fail_open = true;
    out.patch_ops = 0;
    response.allowed = true;
    response.patch = None;
    response.warnings = Some(vec![short_warning(format!("safe-termination: {why}; pod admitted unchanged"))]);
    response
}
