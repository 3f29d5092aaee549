//! Capability probe (rule R4): does the API server keep `lifecycle.preStop.sleep`?
//!
//! Probed, never guessed from the version: a server-side dry-run create of a pod with a native
//! sleep in the operator's own namespace, then a check that the field survived. On 1.29 (gate
//! `PodLifecycleSleepAction` alpha, off) or with the gate off, the API server silently drops the
//! field and then rejects the pod ("must specify a handler type"): that answer means "no".
//! Any other rejection (a quota, a policy, a `LimitRange`, a webhook's validation) says nothing
//! about the sleep action and is returned as an error, so the caller keeps its last answer.

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

/// Result of a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// The sleep action survived the dry-run create.
    NativeSleep,
    /// The field was dropped or the pod was rejected for lacking a handler.
    NoNativeSleep(String),
}

/// The probe pod: a pause container with a 1 s native preStop sleep, opted out of our own
/// webhook, never actually created (dry run). It satisfies the `restricted` Pod Security
/// profile, so the probe also works in a namespace that enforces it (Pod Security admission
/// runs on dry-run creates too and would otherwise answer 403).
pub fn probe_pod(namespace: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "safe-termination-probe-",
            "namespace": namespace,
            "annotations": {"safetermination.io/skip": "true"},
            "labels": {"app.kubernetes.io/name": "safe-termination-probe"}
        },
        "spec": {
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "probe",
                "image": "registry.k8s.io/pause:3.10",
                "lifecycle": {"preStop": {"sleep": {"seconds": 1}}},
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
            }]
        }
    }))
    .unwrap_or_default()
}

/// The field the API server names when the probe container's preStop is left without a handler.
const PRESTOP_FIELD: &str = "spec.containers[0].lifecycle.preStop";

/// The detail kube-apiserver gives for a lifecycle handler with no action
/// (`validateHandler` in `pkg/apis/core/validation/validation.go`:
/// `field.Required(fldPath, "must specify a handler type")`). With `PodLifecycleSleepAction`
/// off, `dropPodLifecycleSleepAction` (`pkg/api/pod/util.go`) clears `sleep` first, so the probe
/// pod's preStop reaches validation empty. A server whose drop also removes the emptied preStop
/// accepts the pod, which [`interpret`] reads as "dropped".
const NO_HANDLER: &str = "must specify a handler type";

/// True when a 422 `Status` says the probe container's preStop has no handler: a cause on
/// [`PRESTOP_FIELD`] with [`NO_HANDLER`], or, for a server that sends no causes, the summary
/// message `Pod "..." is invalid: spec.containers[0].lifecycle.preStop: Required value: must
/// specify a handler type`.
fn rejected_for_missing_handler(status: &kube::core::Status) -> bool {
    let by_cause = status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.field == PRESTOP_FIELD && c.message.contains(NO_HANDLER)));
    by_cause || status.message.contains(&format!("{PRESTOP_FIELD}: Required value: {NO_HANDLER}"))
}

/// Interprets a dry-run answer: `Ok(pod)` must still carry the sleep; an `Invalid` (422) answer
/// that the probe container's preStop has no handler means the gate is off. Every other error,
/// including a 422 for any other field, is returned: the answer is unknown, not "off".
pub fn interpret(answer: Result<Pod, kube::Error>) -> Result<ProbeResult, kube::Error> {
    match answer {
        Ok(pod) => {
            let kept = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.lifecycle.as_ref())
                .and_then(|l| l.pre_stop.as_ref())
                .and_then(|h| h.sleep.as_ref())
                .is_some();
            Ok(if kept { ProbeResult::NativeSleep } else { ProbeResult::NoNativeSleep("the API server dropped lifecycle.preStop.sleep".into()) })
        }
        Err(kube::Error::Api(s)) if s.code == 422 && rejected_for_missing_handler(&s) => {
            Ok(ProbeResult::NoNativeSleep(format!("dry-run rejected: {}", s.message)))
        }
        Err(e) => Err(e),
    }
}

/// Runs the probe in `namespace` (needs `create pods` there; dry run, nothing is persisted).
pub async fn probe_native_sleep(client: Client, namespace: &str) -> Result<ProbeResult, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let pp = PostParams { dry_run: true, field_manager: Some("safe-termination-probe".into()) };
    interpret(api.create(&pp, &probe_pod(namespace)).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpretation() {
        let pod = probe_pod("ns");
        assert_eq!(interpret(Ok(pod.clone())).unwrap(), ProbeResult::NativeSleep);
        let mut dropped = pod;
        dropped.spec.as_mut().unwrap().containers[0].lifecycle.as_mut().unwrap().pre_stop.as_mut().unwrap().sleep = None;
        assert!(matches!(interpret(Ok(dropped)).unwrap(), ProbeResult::NoNativeSleep(_)));
        let status: kube::core::Status = serde_json::from_value(json!({
            "status": "Failure", "code": 422, "reason": "Invalid",
            "message": "Pod \"x\" is invalid: spec.containers[0].lifecycle.preStop: Required value: must specify a handler type"
        }))
        .unwrap();
        assert!(matches!(interpret(Err(kube::Error::Api(Box::new(status)))).unwrap(), ProbeResult::NoNativeSleep(m) if m.contains("handler")));
    }

    fn invalid(message: &str, causes: serde_json::Value) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(json!({
            "status": "Failure", "code": 422, "reason": "Invalid", "message": message,
            "details": {"kind": "Pod", "causes": causes}
        }))
        .unwrap();
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn missing_handler_cause_means_no_native_sleep() {
        let err = invalid(
            "Pod \"safe-termination-probe-abcde\" is invalid: spec.containers[0].lifecycle.preStop: Required value: must specify a handler type",
            json!([{"reason": "FieldValueRequired", "message": "Required value: must specify a handler type", "field": "spec.containers[0].lifecycle.preStop"}]),
        );
        match interpret(Err(err)).unwrap() {
            ProbeResult::NoNativeSleep(m) => assert_eq!(
                m,
                "dry-run rejected: Pod \"safe-termination-probe-abcde\" is invalid: spec.containers[0].lifecycle.preStop: Required value: must specify a handler type"
            ),
            other => panic!("expected NoNativeSleep, got {other:?}"),
        }
    }

    #[test]
    fn unrelated_invalid_is_an_error_not_off() {
        let msg = "Pod \"safe-termination-probe-abcde\" is invalid: spec.containers[0].resources.requests: Invalid value: \"100m\": must be less than or equal to cpu limit of 50m";
        let err = invalid(
            msg,
            json!([{"reason": "FieldValueInvalid", "message": "Invalid value: \"100m\": must be less than or equal to cpu limit of 50m", "field": "spec.containers[0].resources.requests"}]),
        );
        match interpret(Err(err)) {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422);
                assert_eq!(s.message, msg);
            }
            other => panic!("expected the 422 back as an error, got {other:?}"),
        }
        // The handler message on another container's postStart is not the probe's preStop.
        let other_field = invalid(
            "Pod \"p\" is invalid: spec.containers[1].lifecycle.postStart: Required value: must specify a handler type",
            json!([{"reason": "FieldValueRequired", "message": "Required value: must specify a handler type", "field": "spec.containers[1].lifecycle.postStart"}]),
        );
        assert!(interpret(Err(other_field)).is_err());
        // A 422 without details or message about the handler is unknown too.
        let bare: kube::core::Status =
            serde_json::from_value(json!({"status": "Failure", "code": 422, "reason": "Invalid", "message": "admission webhook \"x\" denied the request"}))
                .unwrap();
        assert!(interpret(Err(kube::Error::Api(Box::new(bare)))).is_err());
    }
}
