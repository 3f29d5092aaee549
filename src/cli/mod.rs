//! Command-line adapters: argument types and the code behind each subcommand. `src/main.rs`
//! only parses and dispatches.

pub mod agent;
pub mod analyze;
pub mod mutate;
pub mod run;
pub mod webhook;

use crate::core::crd::TerminationPolicySpec;
use crate::core::model::ProxyMode;

/// How a command failed; [`Error::exit_code`] tells the shell which kind. One rule for every
/// command (docs/cli.md "Exit codes"): 0 done, 1 bad input or a failed run, 2 usage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Usage: a flag's value out of its range or form, flags that contradict each other, a
    /// missing flag (exit 2). Never a file's contents: those are [`Error::Input`].
    #[error("{0}")]
    Usage(String),
    /// Bad input: a file or standard input the user named (a scrape, manifest, review or policy
    /// file) that is missing, unreadable, larger than the limit, empty or not valid (exit 1).
    #[error("{0}")]
    Input(String),
    /// A listener, the Kubernetes client, leader election or a task of a server failed (exit 1).
    #[error("{0}")]
    Io(String),
    /// A server was stopped by a second signal (exit 130).
    #[error("aborted by a second signal")]
    Aborted,
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::Input(_) | Error::Io(_) => 1,
            Error::Aborted => 130,
        }
    }
}

/// Text output as it may reach a terminal: every control character but the line break and tab,
/// every line or paragraph separator and every bidirectional override or isolate (U+200E,
/// U+200F, U+202A-U+202E, U+2066-U+2069) written as `\u{..}`, so that a file, node or container
/// name cannot reorder or hide what is printed around it. Other text is unchanged.
pub fn printable(text: String) -> String {
    let escaped = |c: char| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(escaped) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// A clap value parser for `--proxy-mode`.
pub fn parse_proxy_mode(s: &str) -> Result<ProxyMode, Error> {
    ProxyMode::parse(s).ok_or_else(|| Error::Usage(format!("unknown proxy mode {s:?}: use iptables, nftables, ipvs, kernelspace or ebpf")))
}

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
/// [`crate::core::crd::unknown_fields`]).
pub fn load_policy_spec(path: &str) -> Result<TerminationPolicySpec, Error> {
    load_policy(path).map(|(spec, _)| spec)
}

/// [`load_policy_spec`], with the policy's `metadata.name` when the file gives one (a bare spec
/// has none).
pub fn load_policy(path: &str) -> Result<(TerminationPolicySpec, Option<String>), Error> {
    let text = crate::sources::read_file(path).map_err(|e| Error::Input(e.to_string()))?;
    let value: serde_json::Value = serde_saphyr::from_str(&text).map_err(|e| {
        // the parser's own hint names its Rust API; say what to do with the file instead
        if e.to_string().contains("multiple YAML documents") {
            Error::Input(format!("{path}: holds more than one YAML document: give one TerminationPolicy per file"))
        } else {
            Error::Input(yaml_error(path, &text, &e))
        }
    })?;
    let name = value.pointer("/metadata/name").and_then(serde_json::Value::as_str).map(str::to_string);
    Ok((policy_spec_of(&value, path)?, name))
}

/// A YAML (or JSON) parse error of the file `path` (contents `text`) in the project's words:
/// `PATH: line L, column C: WHAT`, where WHAT is `duplicate key `name``, ``safetyFactor` must be
/// a finite number, not `.nan`` (the key read from the error's line), `nested deeper than 64
/// levels`, `more than 1024 YAML documents`, `more than 250000 YAML nodes (values, sequences and
/// mappings)`, or the parser's user-facing message for anything else (never its Rust API names
/// or settings). The bounds are serde-saphyr's default budget (docs/cli.md "Input limits").
pub fn yaml_error(path: &str, text: &str, e: &serde_saphyr::Error) -> String {
    use serde_saphyr::Error as E;
    use serde_saphyr::budget::BudgetBreach as B;
    let mut inner = e;
    while let E::WithSnippet { error, .. } = inner {
        inner = error;
    }
    let at = inner.location().filter(|l| l.line() > 0).map(|l| format!("line {}, column {}: ", l.line(), l.column())).unwrap_or_default();
    // the key of a `key: value` line (a sequence item's `- key: value` too), for a message
    // about its value
    let key_on_line = |line: u64| -> Option<String> {
        let l = text.lines().nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
        let key = l.trim_start().trim_start_matches("- ").split(':').next()?.trim().trim_matches(['"', '\'']);
        (!key.is_empty() && !key.contains([' ', '{', '['])).then(|| key.to_string())
    };
    let what = match inner {
        E::DuplicateMappingKey { key: Some(k), .. } => format!("duplicate key `{k}`"),
        E::DuplicateMappingKey { key: None, .. } => "duplicate key".to_string(),
        E::NonFiniteFloat { value, .. } => match inner.location().and_then(|l| key_on_line(l.line())) {
            Some(key) => format!("`{key}` must be a finite number, not `{value}`"),
            None => format!("a value must be a finite number, not `{value}`"),
        },
        E::Budget { breach, .. } => match breach {
            B::Depth { .. } => "nested deeper than 64 levels".to_string(),
            B::Documents { .. } => "more than 1024 YAML documents".to_string(),
            B::Nodes { .. } => "more than 250000 YAML nodes (values, sequences and mappings)".to_string(),
            B::Aliases { .. } | B::Anchors { .. } => "more than 50000 YAML aliases or anchors".to_string(),
            _ => format!("too large or too complex for YAML ({})", inner.render_with_formatter(&serde_saphyr::UserMessageFormatter)),
        },
        _ => return format!("{path}: not valid YAML or JSON: {}", inner.render_with_formatter(&serde_saphyr::UserMessageFormatter)),
    };
    format!("{path}: {at}{what}")
}

/// The spec of a TerminationPolicy document, checked as the API server and the operator check
/// it; `path` names the document in errors. Errors: another kind, unknown fields, an invalid
/// spec ([`TerminationPolicySpec::validate`]).
pub fn policy_spec_of(value: &serde_json::Value, path: &str) -> Result<TerminationPolicySpec, Error> {
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    if kind != "TerminationPolicy" {
        return Err(Error::Input(format!("{path}: expected kind TerminationPolicy, found {kind:?}")));
    }
    let unknown = crate::core::crd::unknown_fields(value);
    if !unknown.is_empty() {
        return Err(Error::Input(format!("{path}: {}", unknown.join("; "))));
    }
    let spec_value = value.get("spec").cloned().unwrap_or(serde_json::Value::Object(Default::default()));
    // a type error names its field (`spec.preStop.minSeconds: invalid value: integer `-5`,
    // expected u32`)
    let spec: TerminationPolicySpec = serde_path_to_error::deserialize(spec_value).map_err(|e| {
        let field = e.path().to_string();
        let at = if field == "." { "spec".to_string() } else { format!("spec.{field}") };
        Error::Input(format!("{path}: invalid spec: {at}: {}", e.inner()))
    })?;
    spec.validate().map_err(|errs| Error::Input(format!("{path}: {errs}")))?;
    Ok(spec)
}

/// A clap value parser for a number flag (seconds, a ratio): finite, at least `min` (above it
/// when `min_exclusive`) and at most `max`. NaN, infinities, negative and absurd values are
/// refused with a message giving `what` is expected and the accepted range; clap prefixes it
/// with the flag and the value (`invalid value 'NaN' for '--stale-seconds <STALE_SECONDS>': ...`).
pub fn number_in(min: f64, max: f64, min_exclusive: bool, what: &'static str) -> impl Fn(&str) -> Result<f64, Error> + Clone + Send + Sync {
    move |s: &str| {
        let v = s.trim().parse::<f64>().ok().filter(|v| v.is_finite());
        match v {
            Some(v) if (if min_exclusive { v > min } else { v >= min }) && v <= max => Ok(v),
            _ if min_exclusive => Err(Error::Usage(format!("expected {what} above {min} and at most {max}"))),
            _ => Err(Error::Usage(format!("expected {what} from {min} to {max}"))),
        }
    }
}

/// A clap value parser for a whole-number flag: from `min` to `max`; anything else (negative,
/// fractional, out of range) is refused with a message giving `what` is expected and the range.
pub fn whole_in<T>(min: T, max: T, what: &'static str) -> impl Fn(&str) -> Result<T, Error> + Clone + Send + Sync
where
    T: std::str::FromStr + PartialOrd + Copy + std::fmt::Display + Send + Sync,
{
    move |s: &str| match s.trim().parse::<T>() {
        Ok(v) if v >= min && v <= max => Ok(v),
        _ => Err(Error::Usage(format!("expected {what} from {min} to {max}"))),
    }
}
