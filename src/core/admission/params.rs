//! The `TerminationParameters` custom resource (`safetermination.io/v1alpha1`, namespaced, short
//! name `tparams`): the MutatingAdmissionPolicy's parameters (its `paramKind`), one object in
//! the operator's namespace, written by the leader only.
//!
//! It holds the [`Plan`] as CEL can read it: for each namespace with TerminationPolicies, those
//! policies in the order the webhook resolves them ([`Plan::resolve`]: most specific
//! `podSelector` first, then name), each with its selector, mode, handler, exec allow-list,
//! grace settings and its measured, clamped preStop seconds; and the cluster default policy for
//! the other namespaces. The policy's CEL takes the first entry whose selector matches, so
//! precedence between several policies in a namespace is decided here, once, by the same sort
//! the webhook uses, not by the API server's order of parameters (a binding that selected
//! several parameter objects would run the policy once per object).
//!
//! One cluster-wide object rather than one per namespace: a recommendation change (the window
//! is cluster-wide) is one write, the default policy needs no object in every namespace, and
//! the paramRef names one object, so no namespace can be left with a stale copy.

use crate::core::crd::{EnforcementMode, PreStopHandler};
use crate::core::plan::{Plan, PlanPolicy};
use crate::core::selector::specificity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The parameters: what the policy's CEL reads as `params.spec`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "safetermination.io",
    version = "v1alpha1",
    kind = "TerminationParameters",
    plural = "terminationparameters",
    singular = "terminationparameters",
    shortname = "tparams",
    doc = "The parameters of safe-termination's MutatingAdmissionPolicy: every TerminationPolicy with its measured preStop seconds, in precedence order per namespace. Written by the operator's leader; do not edit.",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct TerminationParametersSpec {
    /// Whether the API server keeps `lifecycle.preStop.sleep` (the capability probe, rule R4).
    pub native_sleep: bool,
    /// Per namespace, its policies in precedence order (the first whose selector matches wins).
    pub namespaces: BTreeMap<String, Vec<PolicyParameters>>,
    /// The cluster default policy (zero or one entry), for namespaces absent from `namespaces`.
    pub default_policies: Vec<PolicyParameters>,
}

/// One TerminationPolicy as the CEL applies it. Every field is always present (empty maps and
/// lists included), so the CEL needs no `has()` on parameters.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyParameters {
    /// `namespace/name` of the TerminationPolicy: the value of the `safetermination.io/policy`
    /// annotation on mutated pods.
    pub policy: String,
    /// The podSelector's matchLabels (empty: every pod).
    pub match_labels: BTreeMap<String, String>,
    /// The podSelector's matchExpressions.
    pub match_expressions: Vec<RequirementParameters>,
    /// Enforce, Audit or Disabled.
    pub mode: EnforcementMode,
    /// The sleep injected into new pods, seconds: the policy's status recommendation, clamped to
    /// its bounds (or its defaultSeconds while unmeasured).
    pub pre_stop_seconds: u32,
    /// Auto, Sleep, Exec or Wait (the policy backend injects the native sleep for Wait).
    pub handler: PreStopHandler,
    /// Images allowed the `exec sleep N` fallback (exact, or a prefix ending in `*`).
    pub exec_images: Vec<String>,
    /// spec.grace.appShutdownSeconds, seconds.
    pub app_shutdown_seconds: u32,
    /// spec.grace.maxSeconds, seconds.
    pub max_grace_seconds: u32,
}

/// One matchExpressions term (Kubernetes label-selector semantics).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequirementParameters {
    /// The label key.
    pub key: String,
    /// In, NotIn, Exists or DoesNotExist (any other never matches, as in the webhook).
    pub operator: String,
    /// The values (empty for Exists and DoesNotExist).
    pub values: Vec<String>,
}

/// The CustomResourceDefinition as YAML, exactly as committed in
/// `crds/terminationparameters.yaml`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    crate::core::crd::generated_yaml(&TerminationParameters::crd(), "cargo run --bin crdgen terminationparameters", "src/core/admission/params.rs")
}

fn entry(p: &PlanPolicy) -> PolicyParameters {
    let selector = p.spec.pod_selector.as_ref();
    PolicyParameters {
        policy: p.reference(),
        match_labels: selector.and_then(|s| s.match_labels.clone()).unwrap_or_default(),
        match_expressions: selector
            .and_then(|s| s.match_expressions.as_ref())
            .map(|e| {
                e.iter()
                    .map(|r| RequirementParameters { key: r.key.clone(), operator: r.operator.clone(), values: r.values.clone().unwrap_or_default() })
                    .collect()
            })
            .unwrap_or_default(),
        mode: p.spec.mode,
        pre_stop_seconds: p.pre_stop_seconds,
        handler: p.spec.pre_stop.handler,
        exec_images: p.spec.pre_stop.exec_images.clone(),
        app_shutdown_seconds: p.spec.grace.app_shutdown_seconds,
        max_grace_seconds: p.spec.grace.max_seconds,
    }
}

/// The parameters for `plan`: its policies grouped by namespace in [`Plan::resolve`]'s order
/// (specificity descending, then name), and its default policy.
pub fn parameters(plan: &Plan) -> TerminationParametersSpec {
    let mut by_namespace: BTreeMap<String, Vec<&PlanPolicy>> = BTreeMap::new();
    for p in &plan.policies {
        by_namespace.entry(p.namespace.clone()).or_default().push(p);
    }
    let namespaces = by_namespace
        .into_iter()
        .map(|(ns, mut policies)| {
            policies
                .sort_by(|a, b| specificity(b.spec.pod_selector.as_ref()).cmp(&specificity(a.spec.pod_selector.as_ref())).then_with(|| a.name.cmp(&b.name)));
            (ns, policies.into_iter().map(entry).collect())
        })
        .collect();
    TerminationParametersSpec { native_sleep: plan.capabilities.native_sleep, namespaces, default_policies: plan.default_policy.iter().map(entry).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::crd::TerminationPolicySpec;
    use crate::core::plan::Capabilities;
    use crate::core::selector::Labels;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    fn policy(ns: &str, name: &str, labels: &[(&str, &str)], exprs: usize, pre_stop: u32) -> PlanPolicy {
        let selector = LabelSelector {
            match_labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            match_expressions: Some((0..exprs).map(|i| LabelSelectorRequirement { key: format!("k{i}"), operator: "Exists".into(), values: None }).collect()),
        };
        PlanPolicy {
            namespace: ns.into(),
            name: name.into(),
            spec: TerminationPolicySpec { pod_selector: Some(selector), ..TerminationPolicySpec::default() },
            pre_stop_seconds: pre_stop,
        }
    }

    #[test]
    fn namespaces_list_policies_in_the_webhooks_precedence_order() {
        let plan = Plan {
            policies: vec![
                policy("a", "zeta", &[("app", "web")], 1, 5),
                policy("a", "alpha", &[], 0, 6),
                policy("a", "beta", &[("app", "web"), ("tier", "fe")], 0, 7),
                policy("a", "gamma", &[("app", "web")], 1, 8),
                policy("b", "only", &[], 0, 9),
            ],
            default_policy: Some(policy("safe-termination", "cluster-default", &[], 0, 11)),
            capabilities: Capabilities { native_sleep: true },
            wait: Default::default(),
        };
        let p = parameters(&plan);
        let order: Vec<&str> = p.namespaces["a"].iter().map(|e| e.policy.as_str()).collect();
        // specificity 2 (beta, gamma, zeta: name order), then 0 (alpha)
        assert_eq!(order, ["a/beta", "a/gamma", "a/zeta", "a/alpha"]);
        assert_eq!(p.namespaces["b"][0].pre_stop_seconds, 9);
        assert_eq!(p.default_policies.len(), 1);
        assert_eq!(p.default_policies[0].policy, "safe-termination/cluster-default");
        assert!(p.native_sleep);
        // the first matching entry (the CEL's rule) is the policy Plan::resolve picks
        for labels in [vec![("app", "web"), ("tier", "fe")], vec![("app", "web"), ("k0", "x")], vec![("app", "db")], vec![]] {
            let labels: Labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let want = plan.resolve("a", &labels).map(|r| format!("a/{}", r.policy.name));
            let got = p.namespaces["a"].iter().find(|e| first_match_rule(e, &labels)).map(|e| e.policy.clone());
            assert_eq!(got, want, "labels {labels:?}");
        }
    }

    /// The selector test the policy's CEL applies to an entry (`matching` in policy.rs).
    fn first_match_rule(e: &PolicyParameters, labels: &Labels) -> bool {
        e.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && e.match_expressions.iter().all(|r| match r.operator.as_str() {
                "In" => labels.get(&r.key).is_some_and(|v| r.values.contains(v)),
                "NotIn" => !labels.get(&r.key).is_some_and(|v| r.values.contains(v)),
                "Exists" => labels.contains_key(&r.key),
                "DoesNotExist" => !labels.contains_key(&r.key),
                _ => false,
            })
    }

    #[test]
    fn every_field_is_serialized_even_when_empty() {
        let plan = Plan {
            policies: vec![policy("a", "p", &[], 0, 4)],
            default_policy: None,
            capabilities: Capabilities { native_sleep: false },
            wait: Default::default(),
        };
        let v = serde_json::to_value(parameters(&plan)).unwrap();
        let e = &v["namespaces"]["a"][0];
        assert_eq!(e["matchLabels"], serde_json::json!({}));
        assert_eq!(e["matchExpressions"], serde_json::json!([]));
        assert_eq!(e["execImages"], serde_json::json!([]));
        assert_eq!(e["mode"], "Enforce");
        assert_eq!(e["handler"], "Auto");
        assert_eq!(e["preStopSeconds"], 4);
        assert_eq!(e["appShutdownSeconds"], 30);
        assert_eq!(e["maxGraceSeconds"], 600);
        assert_eq!(v["defaultPolicies"], serde_json::json!([]));
        assert_eq!(v["nativeSleep"], false);
    }
}
