//! The plan the webhook serves: which policy applies to a pod, the preStop seconds each policy
//! injects, and what the API server supports. Built by the controller (or from flags for the
//! stand-alone webhook and the `mutate` command) and read from memory on every admission.

use crate::core::crd::TerminationPolicySpec;
use crate::core::selector::Labels;
use crate::core::selector::{selector_matches, specificity};
use crate::core::wait::WaitInjection;
use serde::Serialize;

/// One policy as the webhook applies it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanPolicy {
    /// Namespace of the TerminationPolicy (empty for the cluster default policy).
    pub namespace: String,
    /// Name of the TerminationPolicy.
    pub name: String,
    /// Its spec.
    pub spec: TerminationPolicySpec,
    /// The sized preStop sleep for new pods, seconds (the policy's status recommendation),
    /// already within the policy's bounds ([`crate::core::sizing::clamp_pre_stop`]): the webhook serves
    /// it as it is.
    pub pre_stop_seconds: u32,
}

impl PlanPolicy {
    /// `namespace/name`, or `name` for the cluster default policy (no namespace): the form of the
    /// `safetermination.io/policy` annotation, which both admission backends write.
    pub fn reference(&self) -> String {
        if self.namespace.is_empty() { self.name.clone() } else { format!("{}/{}", self.namespace, self.name) }
    }
}

/// What the API server keeps (rule R4: probed by a server-side dry run, never guessed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// `lifecycle.preStop.sleep` survives a dry-run create (gate PodLifecycleSleepAction on).
    pub native_sleep: bool,
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Namespaced policies.
    pub policies: Vec<PlanPolicy>,
    /// Policy for namespaces that have none (off unless configured).
    pub default_policy: Option<PlanPolicy>,
    /// API server capabilities.
    pub capabilities: Capabilities,
    /// Where `Wait` policies' pods find the waiter and the operator.
    pub wait: WaitInjection,
}

impl Default for Plan {
    /// An empty plan: no policy, so nothing is mutated.
    fn default() -> Self {
        Self { policies: Vec::new(), default_policy: None, capabilities: Capabilities { native_sleep: false }, wait: WaitInjection::default() }
    }
}

/// The policy chosen for a pod, and the other policies that also selected it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved<'a> {
    /// The winning policy.
    pub policy: &'a PlanPolicy,
    /// Other policies of the namespace that also select the pod (a conflict to report).
    pub also_matched: Vec<&'a str>,
}

impl Plan {
    /// Picks the policy for a pod in `namespace` with `labels`: among the namespace's policies
    /// whose podSelector matches, the most specific (most matchLabels plus matchExpressions
    /// terms) wins, then the alphabetically first name. Namespaces with no policy at all fall back
    /// to the default policy; a namespace whose policies all miss the pod gets none.
    pub fn resolve(&self, namespace: &str, labels: &Labels) -> Option<Resolved<'_>> {
        let in_ns: Vec<&PlanPolicy> = self.policies.iter().filter(|p| p.namespace == namespace).collect();
        if in_ns.is_empty() {
            return self
                .default_policy
                .as_ref()
                .filter(|p| p.spec.pod_selector.as_ref().is_none_or(|s| selector_matches(s, labels)))
                .map(|policy| Resolved { policy, also_matched: Vec::new() });
        }
        let mut matching: Vec<&PlanPolicy> = in_ns.into_iter().filter(|p| p.spec.pod_selector.as_ref().is_none_or(|s| selector_matches(s, labels))).collect();
        matching.sort_by(|a, b| specificity(b.spec.pod_selector.as_ref()).cmp(&specificity(a.spec.pod_selector.as_ref())).then_with(|| a.name.cmp(&b.name)));
        let (first, rest) = matching.split_first()?;
        Some(Resolved { policy: first, also_matched: rest.iter().map(|p| p.name.as_str()).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    #[test]
    fn the_default_policy_honours_its_pod_selector() {
        let spec = TerminationPolicySpec {
            pod_selector: Some(LabelSelector { match_labels: Some([("app".to_string(), "web".to_string())].into()), match_expressions: None }),
            ..TerminationPolicySpec::default()
        };
        let plan = Plan {
            policies: vec![],
            default_policy: Some(PlanPolicy { namespace: String::new(), name: "d".into(), spec, pre_stop_seconds: 10 }),
            capabilities: Capabilities { native_sleep: true },
            wait: WaitInjection::default(),
        };
        assert!(plan.resolve("ns", &[("app".to_string(), "web".to_string())].into()).is_some());
        assert!(plan.resolve("ns", &[("app".to_string(), "db".to_string())].into()).is_none());
    }
}
