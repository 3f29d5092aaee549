//! The annotations safe-termination reads and writes on pods: the opt-outs a user sets, and the
//! record of what the webhook did, which the controller reads back to count mutated and stale
//! pods; and the one opt-out label. Shared names, no logic.

/// Pod annotation: `"true"` opts the pod out.
pub const ANNOTATION_SKIP: &str = "safetermination.io/skip";
/// Pod annotation: comma-separated container names to leave alone.
pub const ANNOTATION_SKIP_CONTAINERS: &str = "safetermination.io/skip-containers";
/// Pod annotation written on mutation: the injected sleep, seconds.
pub const ANNOTATION_PRESTOP_SECONDS: &str = "safetermination.io/prestop-seconds";
/// Pod annotation written on mutation or audit: `namespace/name` of the policy applied.
pub const ANNOTATION_POLICY: &str = "safetermination.io/policy";
/// Pod annotation written in Audit mode: the sleep that would have been injected, seconds.
pub const ANNOTATION_AUDIT_PRESTOP_SECONDS: &str = "safetermination.io/audit-prestop-seconds";
/// Annotation the kubelet puts on mirror pods of static pods.
pub const ANNOTATION_MIRROR: &str = "kubernetes.io/config.mirror";
/// Label on a pod or a namespace: `"true"` keeps the admission (the webhook configuration's and
/// the policy binding's selectors) away from it (a label, because selectors match labels only).
pub const LABEL_IGNORE: &str = "safetermination.io/ignore";
