//! Which admission backend mutates pods: `--admission-backend webhook | policy | auto`.

use serde::Serialize;

/// The `--admission-backend` setting (chart value `admission.backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendSetting {
    /// The mutating webhook only (the operator serves `/mutate`; the chart registers it).
    Webhook,
    /// The MutatingAdmissionPolicy only; the operator fails at start when the API server does
    /// not serve `admissionregistration.k8s.io/v1` `mutatingadmissionpolicies`.
    Policy,
    /// The policy where the API server serves MutatingAdmissionPolicy v1 (Kubernetes 1.36+),
    /// the webhook otherwise.
    Auto,
}

/// The backend in use after `auto` is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ActiveBackend {
    /// The mutating webhook.
    Webhook,
    /// The MutatingAdmissionPolicy.
    Policy,
}

impl ActiveBackend {
    /// `webhook` or `policy`, as in the policy status, the log and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ActiveBackend::Webhook => "webhook",
            ActiveBackend::Policy => "policy",
        }
    }
}

/// Why `--admission-backend policy` cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--admission-backend policy: the API server does not serve admissionregistration.k8s.io/v1 mutatingadmissionpolicies (GA in Kubernetes 1.36); use --admission-backend webhook or auto"
)]
pub struct PolicyUnavailable;

/// Resolves the setting against what the API server serves (`serves_policy_v1`: discovery
/// lists `mutatingadmissionpolicies` in `admissionregistration.k8s.io/v1`).
///
/// Errors: `policy` asked for and not served ([`PolicyUnavailable`]).
pub fn resolve(setting: BackendSetting, serves_policy_v1: bool) -> Result<ActiveBackend, PolicyUnavailable> {
    match (setting, serves_policy_v1) {
        (BackendSetting::Webhook, _) | (BackendSetting::Auto, false) => Ok(ActiveBackend::Webhook),
        (BackendSetting::Policy | BackendSetting::Auto, true) => Ok(ActiveBackend::Policy),
        (BackendSetting::Policy, false) => Err(PolicyUnavailable),
    }
}

/// What the startup log says of discovery: `served` or `not served` when the API server was
/// asked (`serves_policy_v1` `Some`), `not asked` when `--admission-backend webhook` needs no
/// answer (`None`): a value the operator did not discover is never logged as discovered.
pub fn discovery_note(serves_policy_v1: Option<bool>) -> &'static str {
    match serves_policy_v1 {
        Some(true) => "served",
        Some(false) => "not served",
        None => "not asked (--admission-backend webhook)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_says_discovered_only_what_was_asked() {
        assert_eq!(discovery_note(Some(true)), "served");
        assert_eq!(discovery_note(Some(false)), "not served");
        assert_eq!(discovery_note(None), "not asked (--admission-backend webhook)");
    }

    #[test]
    fn auto_follows_discovery_and_policy_insists() {
        assert_eq!(resolve(BackendSetting::Auto, true), Ok(ActiveBackend::Policy));
        assert_eq!(resolve(BackendSetting::Auto, false), Ok(ActiveBackend::Webhook));
        assert_eq!(resolve(BackendSetting::Webhook, true), Ok(ActiveBackend::Webhook));
        assert_eq!(resolve(BackendSetting::Policy, true), Ok(ActiveBackend::Policy));
        assert_eq!(resolve(BackendSetting::Policy, false), Err(PolicyUnavailable));
        assert!(PolicyUnavailable.to_string().contains("mutatingadmissionpolicies"));
    }
}
