//! Command-line adapters: argument types and the code behind each subcommand. `src/main.rs`
//! only parses and dispatches.

pub mod analyze;
pub mod mutate;
pub mod run;
pub mod webhook;

use crate::crd::TerminationPolicySpec;

/// Output format of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Human-readable text.
    Text,
    /// JSON (camelCase fields).
    Json,
    /// YAML (same fields as JSON).
    Yaml,
}

/// Reads a TerminationPolicy (YAML or JSON; the whole object with `kind: TerminationPolicy`)
/// and returns its spec with defaults filled in and validated.
///
/// Errors name the file and what is wrong (unreadable, not YAML, wrong kind, an invalid field, a
/// field the TerminationPolicy schema does not have: a typo is refused rather than ignored, see
/// [`crate::crd::unknown_fields`]).
pub fn load_policy_spec(path: &str) -> Result<TerminationPolicySpec, String> {
    let text = crate::sources::read_file(path).map_err(|e| e.to_string())?;
    let value: serde_json::Value = serde_saphyr::from_str(&text).map_err(|e| format!("{path}: not valid YAML or JSON: {e}"))?;
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    if kind != "TerminationPolicy" {
        return Err(format!("{path}: expected kind TerminationPolicy, found {kind:?}"));
    }
    let unknown = crate::crd::unknown_fields(&value);
    if !unknown.is_empty() {
        return Err(format!("{path}: {}", unknown.join("; ")));
    }
    let spec_value = value.get("spec").cloned().unwrap_or(serde_json::Value::Object(Default::default()));
    let spec: TerminationPolicySpec =
        serde_json::from_value(spec_value).map_err(|e| format!("{path}: invalid spec: {e}"))?;
    spec.validate().map_err(|errs| format!("{path}: {}", errs.join("; ")))?;
    Ok(spec)
}
