//! The MutatingAdmissionPolicy and its binding, with the mutation rules of
//! [`crate::core::mutate`] in CEL (Kubernetes CEL with optionals, the strings and lists
//! libraries; `admissionregistration.k8s.io/v1`, GA in 1.36:
//! <https://kubernetes.io/docs/reference/access-authn-authz/mutating-admission-policy/>).
//!
//! The rules, as the webhook applies them (docs/webhook.md R1-R11):
//! - R1 only containers without a preStop get one (`inject`); `postStart` is never touched;
//! - R2/R3 grace only raised, to `max(current, min(preStop + appShutdown, maxGrace), preStop)`,
//!   so the sleep is never above the resulting grace; an explicit grace of 0 is skipped;
//! - R4 the native sleep only where the probe saw it kept (`params.spec.nativeSleep`);
//! - R5 the `exec sleep N` fallback only for allow-listed images, never on Windows;
//! - R6 only `spec.containers`; R7 run-to-completion and R8 mirror pods skipped; opt-out
//!   annotations `safetermination.io/skip` and `safetermination.io/skip-containers` honoured;
//! - R11 idempotent under reinvocation: a second run finds every container with a preStop and
//!   the grace already raised, and emits nothing;
//! - the `safetermination.io/prestop-seconds`, `.../policy` (Enforce) and
//!   `.../audit-prestop-seconds` (Audit) annotations as the webhook sets them.
//!
//! What CEL cannot do, and so differs from the webhook ([`DIFFERENCES`], asserted by
//! tests/e2e_admission_policy.rs): scope `ServiceBacked` needs the Service index, so it acts as
//! `AllLongRunning` (every long-running pod gets the sleep: a pod that no Service selects is
//! slower to terminate by the sleep, and no pod is less protected); and a mutating policy has no
//! admission warnings.

use crate::core::annotations::LABEL_IGNORE;
use serde_json::{Value, json};

/// Name of the MutatingAdmissionPolicy, its binding and its parameters object.
pub const DEFAULT_NAME: &str = "safe-termination";

/// The `app.kubernetes.io/managed-by` label value on what the operator writes.
pub const MANAGED_BY: &str = "safe-termination";

/// Where the policy backend's result differs from the webhook's, by design (the policy status
/// and README "Admission backends" list them).
pub const DIFFERENCES: [&str; 2] = [
    "scope ServiceBacked acts as AllLongRunning: CEL cannot see Services, so pods no Service selects also get the sleep",
    "no admission warnings: a MutatingAdmissionPolicy cannot return them",
];

/// Where the policy backend differs for a policy with handler `Wait`: the waiter needs a
/// volume, an init container and mounts added only when absent (by name) and the serving CA
/// copied from the operator's files; the policy injects the native sleep instead (docs/wait.md
/// "Admission backends").
pub const WAIT_DIFFERENCE: &str = "handler Wait injects the native sleep: the waiter needs the webhook backend";

/// The policy's named CEL variables, in evaluation order (`variables.NAME`). Each is evaluated
/// lazily, at most once per admission.
pub const VARIABLES: [(&str, &str); 17] = [
    ("ann", "object.metadata.?annotations.orValue({})"),
    ("labels", "object.metadata.?labels.orValue({})"),
    // the request's namespace, as the webhook uses it (a pod's own metadata.namespace may be empty)
    ("candidates", "request.namespace in params.spec.namespaces ? params.spec.namespaces[request.namespace] : params.spec.defaultPolicies"),
    // Kubernetes label-selector semantics (selector::selector_matches): all matchLabels equal and every
    // expression holds; an unknown operator never matches
    (
        "matching",
        "variables.candidates.filter(p, \
           p.matchLabels.all(k, k in variables.labels && variables.labels[k] == p.matchLabels[k]) && \
           p.matchExpressions.all(e, \
             e.operator == 'In' ? (e.key in variables.labels && variables.labels[e.key] in e.values) : \
             e.operator == 'NotIn' ? !(e.key in variables.labels && variables.labels[e.key] in e.values) : \
             e.operator == 'Exists' ? e.key in variables.labels : \
             e.operator == 'DoesNotExist' ? !(e.key in variables.labels) : false))",
    ),
    // read only when `matching` is not empty (guarded in `active`)
    ("policy", "variables.matching[0]"),
    ("grace", "object.spec.?terminationGracePeriodSeconds.orValue(30)"),
    (
        "active",
        "!('kubernetes.io/config.mirror' in variables.ann) && \
         !(object.spec.?restartPolicy.orValue('Always') in ['Never', 'OnFailure']) && \
         variables.ann[?'safetermination.io/skip'].orValue('').trim().lowerAscii() != 'true' && \
         size(variables.matching) > 0 && variables.policy.mode != 'Disabled' && \
         variables.grace != 0 && variables.policy.preStopSeconds > 0",
    ),
    ("skipContainers", "variables.ann[?'safetermination.io/skip-containers'].orValue('').split(',').map(s, s.trim())"),
    ("windows", "object.spec.?os.?name.orValue('') == 'windows' || object.spec.?nodeSelector[?'kubernetes.io/os'].orValue('') == 'windows'"),
    ("names", "object.spec.containers.map(c, c.name)"),
    ("kept", "object.spec.containers.filter(c, !(c.name in variables.skipContainers) && c.?lifecycle.?preStop.hasValue())"),
    ("sleepOK", "params.spec.nativeSleep && variables.policy.handler in ['Auto', 'Sleep', 'Wait']"),
    (
        "inject",
        "object.spec.containers.filter(c, !(c.name in variables.skipContainers) && !c.?lifecycle.?preStop.hasValue() && \
           (variables.sleepOK || (!variables.windows && variables.policy.handler in ['Auto', 'Exec'] && \
             variables.policy.execImages.exists(i, i.endsWith('*') ? \
               c.?image.orValue('').startsWith(i.substring(0, size(i) - 1)) : c.?image.orValue('') == i))))",
    ),
    ("preStop", "variables.policy.preStopSeconds"),
    // sizing::grace_seconds: max(current, min(preStop + appShutdown, maxGrace), preStop); the
    // sleep is in `wanted` itself, so a current grace between maxGrace and the sleep is raised
    (
        "capped",
        "variables.preStop + variables.policy.appShutdownSeconds < variables.policy.maxGraceSeconds ? \
           variables.preStop + variables.policy.appShutdownSeconds : variables.policy.maxGraceSeconds",
    ),
    ("wanted", "variables.capped > variables.preStop ? variables.capped : variables.preStop"),
    ("target", "variables.grace > variables.wanted ? variables.grace : variables.wanted"),
];

/// The one mutation: a JSON Patch, by container index like the webhook's, so the exec handler's
/// atomic `command` list can be set (an apply configuration may not set atomic lists).
pub const MUTATION: &str = "\
!variables.active || (size(variables.inject) == 0 && size(variables.kept) == 0) ? [] :
variables.policy.mode == 'Audit' ? (
  size(variables.inject) > 0 && variables.ann[?'safetermination.io/audit-prestop-seconds'].orValue('') != string(variables.preStop) ? (
    has(object.metadata.annotations) ? [
      JSONPatch{op: 'add', path: '/metadata/annotations/safetermination.io~1audit-prestop-seconds', value: string(variables.preStop)},
      JSONPatch{op: 'add', path: '/metadata/annotations/safetermination.io~1policy', value: string(variables.policy.policy)}
    ] : [
      JSONPatch{op: 'add', path: '/metadata/annotations', value: {
        'safetermination.io/audit-prestop-seconds': string(variables.preStop), 'safetermination.io/policy': string(variables.policy.policy)}}
    ]
  ) : []
) :
variables.inject.map(c, c.?lifecycle.hasValue() ?
  JSONPatch{op: 'add', path: '/spec/containers/' + string(variables.names.indexOf(c.name)) + '/lifecycle/preStop',
    value: variables.sleepOK ?
      Object.spec.containers.lifecycle.preStop{sleep: Object.spec.containers.lifecycle.preStop.sleep{seconds: variables.preStop}} :
      Object.spec.containers.lifecycle.preStop{exec: Object.spec.containers.lifecycle.preStop.exec{command: ['sleep', string(variables.preStop)]}}} :
  JSONPatch{op: 'add', path: '/spec/containers/' + string(variables.names.indexOf(c.name)) + '/lifecycle',
    value: Object.spec.containers.lifecycle{preStop: variables.sleepOK ?
      Object.spec.containers.lifecycle.preStop{sleep: Object.spec.containers.lifecycle.preStop.sleep{seconds: variables.preStop}} :
      Object.spec.containers.lifecycle.preStop{exec: Object.spec.containers.lifecycle.preStop.exec{command: ['sleep', string(variables.preStop)]}}}}
) +
(variables.target != variables.grace ? [JSONPatch{op: 'add', path: '/spec/terminationGracePeriodSeconds', value: variables.target}] : []) +
(size(variables.inject) == 0 ? [] :
  has(object.metadata.annotations) ? [
    JSONPatch{op: 'add', path: '/metadata/annotations/safetermination.io~1prestop-seconds', value: string(variables.preStop)},
    JSONPatch{op: 'add', path: '/metadata/annotations/safetermination.io~1policy', value: string(variables.policy.policy)}
  ] : [
    JSONPatch{op: 'add', path: '/metadata/annotations', value: {
      'safetermination.io/prestop-seconds': string(variables.preStop), 'safetermination.io/policy': string(variables.policy.policy)}}
  ])";

/// Names and scope of what the operator writes.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyObjects {
    /// Name of the policy, the binding and the parameters object.
    pub name: String,
    /// Namespace of the parameters object (the operator's).
    pub params_namespace: String,
    /// The binding's `matchResources.namespaceSelector` (a LabelSelector as JSON): the
    /// webhook's, so both backends see the same namespaces.
    pub namespace_selector: Value,
    /// Owner of the cluster-scoped objects (an ownerReference as JSON), so that uninstalling the
    /// chart deletes them; `None`: no owner.
    pub owner: Option<Value>,
}

/// The namespace selector the chart's webhook configuration uses by default: not kube-system,
/// not the operator's namespace, not labelled `safetermination.io/ignore=true`.
pub fn default_namespace_selector(operator_namespace: &str) -> Value {
    json!({"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", operator_namespace]},
        {"key": LABEL_IGNORE, "operator": "NotIn", "values": ["true"]}
    ]})
}

impl PolicyObjects {
    fn metadata(&self, namespace: Option<&str>) -> Value {
        let mut m = json!({
            "name": self.name,
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY, "app.kubernetes.io/name": "safe-termination"}
        });
        if let Some(ns) = namespace {
            m["namespace"] = json!(ns);
        }
        if let Some(owner) = &self.owner {
            m["ownerReferences"] = json!([owner]);
        }
        m
    }

    /// The MutatingAdmissionPolicy: Pod CREATE, fail open (`Ignore`, as the webhook, R10),
    /// reinvoked after later mutations (`IfNeeded`, as the webhook), [`VARIABLES`] and
    /// [`MUTATION`].
    pub fn policy(&self) -> Value {
        let variables: Vec<Value> = VARIABLES.iter().map(|(name, expression)| json!({"name": name, "expression": expression})).collect();
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": self.metadata(None),
            "spec": {
                "paramKind": {"apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationParameters"},
                "matchConstraints": {
                    "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
                },
                "failurePolicy": "Ignore",
                "reinvocationPolicy": "IfNeeded",
                "variables": variables,
                "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": MUTATION}}]
            }
        })
    }

    /// The binding: the parameters object by name in the operator's namespace (absent: pods
    /// pass unchanged, `parameterNotFoundAction: Allow`), the webhook's namespace selector, and
    /// the per-pod opt-out label `safetermination.io/ignore=true`.
    pub fn binding(&self) -> Value {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": self.metadata(None),
            "spec": {
                "policyName": self.name,
                "paramRef": {"name": self.name, "namespace": self.params_namespace, "parameterNotFoundAction": "Allow"},
                "matchResources": {
                    "namespaceSelector": self.namespace_selector,
                    "objectSelector": {"matchExpressions": [{"key": LABEL_IGNORE, "operator": "NotIn", "values": ["true"]}]}
                }
            }
        })
    }

    /// The parameters object with `spec`.
    pub fn parameters(&self, spec: &super::params::TerminationParametersSpec) -> Value {
        json!({
            "apiVersion": "safetermination.io/v1alpha1",
            "kind": "TerminationParameters",
            "metadata": self.metadata(Some(&self.params_namespace)),
            "spec": spec
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects() -> PolicyObjects {
        PolicyObjects { name: DEFAULT_NAME.into(), params_namespace: "st".into(), namespace_selector: default_namespace_selector("st"), owner: None }
    }

    /// The `NAME`s of every `variables.NAME` in `expr`.
    fn references(expr: &str) -> Vec<&str> {
        expr.match_indices("variables.")
            .map(|(i, m)| {
                let rest = &expr[i + m.len()..];
                let end = rest.find(|c: char| !c.is_ascii_alphanumeric() && c != '_').unwrap_or(rest.len());
                &rest[..end]
            })
            .collect()
    }

    #[test]
    fn variables_are_defined_before_use_and_each_is_used() {
        let names: Vec<&str> = VARIABLES.iter().map(|(n, _)| *n).collect();
        for (i, (name, expr)) in VARIABLES.iter().enumerate() {
            for r in references(expr) {
                assert!(names[..i].contains(&r), "variable {name} uses {r}, which is not defined before it");
            }
        }
        let mut used: Vec<&str> = VARIABLES.iter().flat_map(|(_, e)| references(e)).chain(references(MUTATION)).collect();
        used.sort_unstable();
        used.dedup();
        for r in &used {
            assert!(names.contains(r), "the mutation uses undefined variables.{r}");
        }
        for n in &names {
            assert!(used.contains(n), "variable {n} is never used");
        }
    }

    #[test]
    fn policy_and_binding_have_the_webhooks_settings() {
        let o = objects();
        let p = o.policy();
        assert_eq!(p["spec"]["failurePolicy"], "Ignore");
        assert_eq!(p["spec"]["reinvocationPolicy"], "IfNeeded");
        assert_eq!(p["spec"]["matchConstraints"]["resourceRules"][0]["operations"], json!(["CREATE"]));
        assert_eq!(p["spec"]["variables"].as_array().unwrap().len(), VARIABLES.len());
        let b = o.binding();
        assert_eq!(b["spec"]["paramRef"], json!({"name": "safe-termination", "namespace": "st", "parameterNotFoundAction": "Allow"}));
        let excluded = &b["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"];
        assert_eq!(excluded, &json!(["kube-system", "st"]));
        assert!(b["metadata"].get("ownerReferences").is_none());
        let owned = PolicyObjects { owner: Some(json!({"kind": "ClusterRole", "name": "x", "uid": "u", "apiVersion": "rbac.authorization.k8s.io/v1"})), ..o };
        assert_eq!(owned.policy()["metadata"]["ownerReferences"][0]["kind"], "ClusterRole");
    }
}
