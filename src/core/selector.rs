//! Which pods a selector picks: Kubernetes label-selector semantics for a policy's
//! `podSelector`, the precedence of selectors, and the Service index that answers "is this pod
//! behind a Service?". Pure; shared by the webhook (choosing a pod's policy) and the controller
//! (counting a policy's pods, reporting conflicts).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use std::collections::BTreeMap;

/// Pod labels.
pub type Labels = BTreeMap<String, String>;

/// Number of terms in a selector (0 for none or empty).
pub fn specificity(sel: Option<&LabelSelector>) -> usize {
    sel.map_or(0, |s| s.match_labels.as_ref().map_or(0, BTreeMap::len) + s.match_expressions.as_ref().map_or(0, Vec::len))
}

/// Kubernetes label-selector semantics: all matchLabels equal, and every expression holds
/// (`In`, `NotIn`, `Exists`, `DoesNotExist`; an unknown operator never matches). An empty
/// selector matches everything.
pub fn selector_matches(sel: &LabelSelector, labels: &Labels) -> bool {
    let labels_ok = sel.match_labels.as_ref().is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
    labels_ok && sel.match_expressions.as_ref().is_none_or(|e| e.iter().all(|r| requirement_matches(r, labels)))
}

fn requirement_matches(r: &LabelSelectorRequirement, labels: &Labels) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    let got = labels.get(&r.key);
    match r.operator.as_str() {
        "In" => got.is_some_and(|v| values.contains(v)),
        "NotIn" => got.is_none_or(|v| !values.contains(v)),
        "Exists" => got.is_some(),
        "DoesNotExist" => got.is_none(),
        _ => false,
    }
}

/// Answers "does some Service in this namespace select a pod with these labels?" for scope
/// ServiceBacked. The controller implements it over a watch of Services; tests and the `mutate`
/// command use [`StaticServiceIndex`].
pub trait ServiceIndex: Send + Sync {
    /// True when at least one Service in `namespace` has a non-empty selector that is a subset
    /// of `labels`.
    fn selects(&self, namespace: &str, labels: &Labels) -> bool;
}

/// A fixed list of Service selectors, by namespace.
#[derive(Debug, Clone, Default)]
pub struct StaticServiceIndex {
    /// `(namespace, selector)` pairs; selectors with no entries are ignored (such Services
    /// select no pods; their endpoints are managed by hand).
    pub services: Vec<(String, Labels)>,
}

/// Whether a Service's `spec.selector` (a map of labels, all of which must be equal) selects a
/// pod with `labels`. An empty selector selects nothing: such a Service's endpoints are managed by
/// hand (Kubernetes "Services without selectors").
pub fn service_selects(selector: &Labels, labels: &Labels) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl ServiceIndex for StaticServiceIndex {
    fn selects(&self, namespace: &str, labels: &Labels) -> bool {
        self.services.iter().any(|(ns, sel)| ns == namespace && service_selects(sel, labels))
    }
}

/// A Service index that treats every pod as service-backed (for offline checks where the
/// Services are not known).
#[derive(Debug, Clone, Copy, Default)]
pub struct AssumeServiceBacked;

impl ServiceIndex for AssumeServiceBacked {
    fn selects(&self, _: &str, _: &Labels) -> bool {
        true
    }
}
