//! kube-proxy's configuration as the operator needs it: the proxy mode and the `minSyncPeriod`
//! (and `syncPeriod`) of the active mode. Pure: text in, values out.
//!
//! Two inputs, one reader ([`parse_kube_proxy_config`] / [`parse_configz`]):
//!
//! - a `KubeProxyConfiguration` file (`kubeproxy.config.k8s.io/v1alpha1`, YAML or JSON), as kubeadm
//!   stores it in ConfigMap `kube-system/kube-proxy` key `config.conf` and EKS in
//!   `kube-system/kube-proxy-config` key `config`. Field names are camelCase; `syncPeriod` /
//!   `minSyncPeriod` live in the section of the active mode (`iptables`, `ipvs`, `nftables`).
//!   This is kube-proxy's *input*, before defaulting, so kube-proxy's defaults are applied here
//!   (`pkg/proxy/apis/config/v1alpha1/defaults.go`): a zero or missing `syncPeriod` is 30 s; a
//!   zero or missing `iptables.minSyncPeriod` is 1 s (since 1.19, kubernetes PR 92836) and the
//!   same is assumed for `nftables`; IPVS has no default, so its zero stays zero. kubeadm writes
//!   every duration as `0s` and EKS ships `iptables.minSyncPeriod: 0s`: both therefore run with
//!   1 s in iptables mode.
//! - the JSON of kube-proxy's `/configz` endpoint (metrics port, 10249). kube-proxy registers
//!   it with `configz.New(kubeproxyconfig.GroupName)` (`cmd/kube-proxy/app/server.go`), so the
//!   top-level key is `"kubeproxy.config.k8s.io"`, and its value is the *internal*
//!   `KubeProxyConfiguration`, which has no JSON tags: field names are the Go names (`Mode`,
//!   `IPTables`, `MinSyncPeriod`, ...). Since about 1.31 the internal type holds `SyncPeriod` and
//!   `MinSyncPeriod` at the top level (converted from the active mode's section); older
//!   releases keep them in `IPTables` / `IPVS`. These are the effective values (already
//!   defaulted, flags applied), so zeros are taken literally.
//!
//! Keys are matched case-insensitively, a mode section's value wins over a top-level one, and
//! `mode: ""` means iptables (the Linux default up to Kubernetes 1.39).
//!
//! Whether the mode was set or left to kube-proxy's default ([`ModeOrigin`]) matters from
//! Kubernetes 1.40, whose kube-proxy defaults an empty mode to nftables instead of iptables
//! ([KEP-5343](https://github.com/kubernetes/enhancements/issues/5343)); kube-proxy 1.37 warns
//! at start when its mode was only defaulted, and kubeadm 1.37 writes `mode: iptables` into the
//! ConfigMap it renders. A file says it: an empty or absent `mode` is defaulted. `/configz` does
//! not: kube-proxy fills in the default before it publishes its configuration
//! (`cmd/kube-proxy/app`, 1.29 to 1.37: `Options.Complete` calls `platformApplyDefaults`, which
//! sets `Mode` to iptables when empty, before `newProxyServer` sets the configz), so its
//! `Mode` is what kube-proxy runs, set or not; only an empty one there says defaulted.

use crate::core::model::ProxyMode;
use serde::Serialize;

/// The `/configz` top-level key under which kube-proxy publishes its configuration.
pub const CONFIGZ_KEY: &str = "kubeproxy.config.k8s.io";

/// kube-proxy's default `syncPeriod`, seconds.
pub const DEFAULT_SYNC_PERIOD_SECONDS: f64 = 30.0;

/// kube-proxy's default `minSyncPeriod` in iptables (and nftables) mode, seconds; also the
/// value the operator uses when no configuration can be read.
pub const DEFAULT_MIN_SYNC_PERIOD_SECONDS: f64 = 1.0;

/// The largest `time.Duration` in nanoseconds, `1<<63 - 1` (Go's `math.MaxInt64`, written
/// `2562047h47m16.854775807s`; as an f64 it rounds to `2^63`). `time.ParseDuration` accepts a
/// magnitude of `1<<63` only for a negative duration, which is refused here anyway.
pub const GO_DURATION_MAX_NANOS: f64 = i64::MAX as f64;

/// A Go duration string that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {message} (expected a Go duration such as \"1s\", \"500ms\", \"1m0s\" or \"2h45m\")")]
pub struct DurationError {
    /// The text given.
    pub input: String,
    /// What is wrong with it.
    pub message: String,
}

/// Seconds per unit of a Go duration (`time.ParseDuration`'s `unitMap`: ns, us/µs/μs, ms, s,
/// m, h); None for anything else.
pub fn go_duration_unit_seconds(unit: &str) -> Option<f64> {
    match unit {
        "ns" => Some(1e-9),
        "us" | "µs" | "μs" => Some(1e-6),
        "ms" => Some(1e-3),
        "s" => Some(1.0),
        "m" => Some(60.0),
        "h" => Some(3600.0),
        _ => None,
    }
}

/// Parses a Go duration (`time.ParseDuration`, the form `metav1.Duration` is written in) into
/// seconds: an optional sign, then one or more `<decimal><unit>` pairs with units `ns`, `us`
/// (`µs`, `μs`), `ms`, `s`, `m`, `h`; `"0"` alone is zero. Examples: `"1s"` = 1.0, `"500ms"` =
/// 0.5, `"1m0s"` = 60.0, `"2h45m"` = 9900.0, `"1.5s"` = 1.5, `"-1s"` = -1.0.
///
/// Errors: empty text, a missing or unknown unit, a number without digits, anything else, and a
/// duration outside Go's `time.Duration` (int64 nanoseconds, [`GO_DURATION_MAX_NANOS`], about 292
/// years): `time.ParseDuration` rejects those as overflow, so kube-proxy could never have run
/// with one. The result is always finite.
pub fn parse_go_duration(input: &str) -> Result<f64, DurationError> {
    let err = |message: &str| DurationError { input: input.to_string(), message: message.to_string() };
    let mut s = input;
    let mut sign = 1.0;
    if let Some(rest) = s.strip_prefix('-') {
        sign = -1.0;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Ok(0.0);
    }
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut total = 0.0;
    while !s.is_empty() {
        let num_len = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let num = &s[..num_len];
        if num.is_empty() || !num.bytes().any(|b| b.is_ascii_digit()) {
            return Err(err("expected a number"));
        }
        if num.matches('.').count() > 1 {
            return Err(err("a number has more than one decimal point"));
        }
        let value: f64 = num.strip_suffix('.').unwrap_or(num).parse().map_err(|_| err("expected a number"))?;
        s = &s[num_len..];
        let unit_len = s.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(s.len());
        let unit = &s[..unit_len];
        let scale = match (unit, go_duration_unit_seconds(unit)) {
            (_, Some(scale)) => scale,
            ("", None) => return Err(err("missing unit")),
            (_, None) => return Err(err(&format!("unknown unit {unit:?}"))),
        };
        total += value * scale;
        // Go counts in uint64 nanoseconds and fails on overflow; a number too long for f64
        // (400 nines) is infinite here and fails the same test.
        if !total.is_finite() || total * 1e9 > GO_DURATION_MAX_NANOS {
            return Err(err("out of range: longer than Go's largest duration 2562047h47m16.854775807s (int64 nanoseconds, about 292 years)"));
        }
        s = &s[unit_len..];
    }
    Ok(sign * total)
}

/// Which form a configuration was read from; decides whether kube-proxy's defaults still apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ConfigForm {
    /// A `KubeProxyConfiguration` file (ConfigMap): kube-proxy's input, defaults applied here.
    File,
    /// `/configz`: the effective configuration, taken literally.
    Configz,
}

/// Whether a configuration sets kube-proxy's mode or leaves it to kube-proxy's default (module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ModeOrigin {
    /// `mode` is set (`iptables`, `ipvs`, `nftables`, `kernelspace`): an upgrade keeps it.
    Explicit,
    /// `mode` is empty or absent: kube-proxy takes its default, iptables on Linux up to 1.39 and
    /// nftables from 1.40 (KEP-5343), so the mode changes at that upgrade.
    Defaulted,
    /// `/configz`'s `mode`, which kube-proxy defaults before publishing it: set or defaulted
    /// cannot be told from it.
    Unknown,
}

/// The parts of a KubeProxyConfiguration the operator uses.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfig {
    /// The active proxy mode (`""` or absent = iptables).
    pub mode: ProxyMode,
    /// Whether the configuration sets the mode or leaves it to kube-proxy's default.
    pub mode_origin: ModeOrigin,
    /// `minSyncPeriod` of the active mode, seconds (after kube-proxy's defaulting for files).
    pub min_sync_period_seconds: f64,
    /// `syncPeriod` of the active mode, seconds (after defaulting for files).
    pub sync_period_seconds: f64,
    /// True when `minSyncPeriod` was zero or absent in a file and kube-proxy's default replaced it.
    pub min_sync_period_defaulted: bool,
    /// `metricsBindAddress` as written (`None` when absent or empty, i.e. kube-proxy's default
    /// `127.0.0.1:10249`, which other pods cannot reach).
    pub metrics_bind_address: Option<String>,
    /// Where the values came from.
    pub form: ConfigForm,
}

impl ProxyConfig {
    /// True when the metrics server listens on loopback only (the default): scraping it from
    /// another pod will be refused.
    pub fn metrics_loopback_only(&self) -> bool {
        match self.metrics_bind_address.as_deref() {
            None => true,
            Some(a) => a.starts_with("127.") || a.starts_with("[::1]") || a.starts_with("localhost"),
        }
    }
}

/// Why a configuration could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// Not YAML or JSON.
    #[error("not a valid KubeProxyConfiguration document: {0}")]
    Syntax(String),
    /// The document is not a mapping (or `/configz` has no kube-proxy entry).
    #[error("{0}")]
    Shape(String),
    /// A field has the wrong type or an unreadable value.
    #[error("{field}: {message}")]
    Field {
        /// The field path, e.g. `iptables.minSyncPeriod`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A mode this operator does not know (e.g. the removed `userspace`).
    #[error("mode {0:?} is not iptables, ipvs, nftables or kernelspace")]
    UnknownMode(String),
}

/// Parses a KubeProxyConfiguration file (YAML or JSON; the text of ConfigMap key `config.conf`
/// or `config`) and applies kube-proxy's defaults (see the module docs).
///
/// Errors: invalid YAML, a document that is not a mapping, an unknown mode, a duration that is
/// not a Go duration string (a bare number is rejected, as kube-proxy rejects it), a negative
/// duration.
pub fn parse_kube_proxy_config(text: &str) -> Result<ProxyConfig, ConfigError> {
    let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
    from_value(&value, ConfigForm::File)
}

/// Parses the body of kube-proxy's `/configz` (`{"kubeproxy.config.k8s.io": {...}}`). A body
/// that is the configuration itself (no wrapper) is accepted too.
///
/// Errors: invalid JSON, no kube-proxy entry, and the field errors of [`parse_kube_proxy_config`].
pub fn parse_configz(json: &str) -> Result<ProxyConfig, ConfigError> {
    let value: serde_json::Value = serde_json::from_str(json).map_err(|e| ConfigError::Syntax(e.to_string()))?;
    from_value(configz_entry(&value)?, ConfigForm::Configz)
}

/// A saved configuration in either form: a JSON object with a [`CONFIGZ_KEY`] entry (a body of
/// `/configz`) is read as `/configz`, anything else as a KubeProxyConfiguration file (the
/// ConfigMap's `config.conf`).
///
/// Errors: those of [`parse_configz`] or [`parse_kube_proxy_config`].
pub fn parse_saved_config(text: &str) -> Result<ProxyConfig, ConfigError> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) if get_ci(&value, CONFIGZ_KEY).is_some() => parse_configz(text),
        _ => parse_kube_proxy_config(text),
    }
}

/// The configuration inside a decoded `/configz` body: its [`CONFIGZ_KEY`] entry, or the body
/// itself when it is a configuration (a `mode` or `iptables` key).
fn configz_entry(value: &serde_json::Value) -> Result<&serde_json::Value, ConfigError> {
    let obj = value.as_object().ok_or_else(|| ConfigError::Shape("/configz did not return a JSON object".into()))?;
    match get_ci(value, CONFIGZ_KEY) {
        Some(inner) => Ok(inner),
        None if get_ci(value, MODE).is_some() || get_ci(value, "iptables").is_some() => Ok(value),
        None => {
            let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
            Err(ConfigError::Shape(format!("/configz has no {CONFIGZ_KEY:?} entry (keys: {}): is this kube-proxy?", keys.join(", "))))
        }
    }
}

/// The field names [`from_value`] reads (matched case-insensitively): the mode, the
/// `metricsBindAddress`, and the two periods, at the top level or in a mode's section.
const MODE: &str = "mode";
const MIN_SYNC_PERIOD: &str = "minSyncPeriod";
const SYNC_PERIOD: &str = "syncPeriod";
const METRICS_BIND_ADDRESS: &str = "metricsBindAddress";
/// The mode sections whose periods [`from_value`] may read.
const MODE_SECTIONS: [&str; 3] = ["iptables", "ipvs", "nftables"];

/// The body of `/configz` reduced to what the operator reads, for the node agent to serve:
/// `{"kubeproxy.config.k8s.io": {...}}` holding only the mode, `metricsBindAddress`,
/// `minSyncPeriod` and `syncPeriod` at the top level and in the `iptables`, `ipvs` and
/// `nftables` sections, keys spelt as kube-proxy spelt them. Everything else (the kubeconfig
/// path, host name override, CIDRs, feature gates, ...) is dropped. [`parse_configz`] reads
/// the reduced body exactly as it reads the whole one.
///
/// Errors: those of [`parse_configz`] (the body is checked first, so the agent never serves
/// a configuration the operator would refuse).
pub fn reduce_configz(json: &str) -> Result<String, ConfigError> {
    let value: serde_json::Value = serde_json::from_str(json).map_err(|e| ConfigError::Syntax(e.to_string()))?;
    let config = configz_entry(&value)?;
    from_value(config, ConfigForm::Configz)?;
    let is = |k: &str, names: &[&str]| names.iter().any(|n| k.eq_ignore_ascii_case(n));
    let mut reduced = serde_json::Map::new();
    for (k, v) in config.as_object().into_iter().flatten() {
        if is(k, &[MODE, MIN_SYNC_PERIOD, SYNC_PERIOD, METRICS_BIND_ADDRESS]) {
            reduced.insert(k.clone(), v.clone());
        } else if is(k, &MODE_SECTIONS)
            && let Some(section) = v.as_object()
        {
            let periods = section.iter().filter(|(k, _)| is(k, &[MIN_SYNC_PERIOD, SYNC_PERIOD]));
            reduced.insert(k.clone(), periods.map(|(k, v)| (k.clone(), v.clone())).collect());
        }
    }
    Ok(serde_json::json!({ CONFIGZ_KEY: reduced }).to_string())
}

/// Reads a configuration already decoded into JSON values (either form).
pub fn from_value(config: &serde_json::Value, form: ConfigForm) -> Result<ProxyConfig, ConfigError> {
    if !config.is_object() {
        return Err(ConfigError::Shape("the KubeProxyConfiguration is not a mapping".into()));
    }
    let mode_text = match get_ci(config, MODE) {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => return Err(field_err(MODE, &format!("expected a string, got {other}"))),
    };
    let mode = ProxyMode::parse(&mode_text)
        .filter(|m| matches!(m, ProxyMode::Iptables | ProxyMode::Ipvs | ProxyMode::Nftables | ProxyMode::Kernelspace))
        .ok_or_else(|| ConfigError::UnknownMode(mode_text.clone()))?;
    let mode_origin = match form {
        _ if mode_text.trim().is_empty() => ModeOrigin::Defaulted,
        ConfigForm::File => ModeOrigin::Explicit,
        ConfigForm::Configz => ModeOrigin::Unknown,
    };
    // Windows (kernelspace) reads the iptables section's periods, like the Go conversion's
    // default branch.
    let section = match mode {
        ProxyMode::Ipvs => MODE_SECTIONS[1],
        ProxyMode::Nftables => MODE_SECTIONS[2],
        _ => MODE_SECTIONS[0],
    };
    let period = |name: &str| -> Result<Option<f64>, ConfigError> {
        let in_section = get_ci(config, section).and_then(|s| get_ci(s, name)).filter(|v| !v.is_null());
        let (path, v) = match in_section {
            Some(v) => (format!("{section}.{name}"), Some(v)),
            None => (name.to_string(), get_ci(config, name).filter(|v| !v.is_null())),
        };
        let Some(v) = v else { return Ok(None) };
        let s = v.as_str().ok_or_else(|| field_err(&path, &format!("expected a duration string such as \"1s\", got {v}")))?;
        let secs = parse_go_duration(s).map_err(|e| field_err(&path, &e.to_string()))?;
        if secs < 0.0 {
            return Err(field_err(&path, &format!("negative duration {s:?}")));
        }
        Ok(Some(secs))
    };
    let min = period(MIN_SYNC_PERIOD)?;
    let sync = period(SYNC_PERIOD)?;
    let (min_sync_period_seconds, min_sync_period_defaulted) = match (form, min) {
        (ConfigForm::Configz, Some(v)) => (v, false),
        // IPVS: kube-proxy has no default, a zero stays zero.
        (ConfigForm::File, v) if mode == ProxyMode::Ipvs => (v.unwrap_or(0.0), false),
        (_, Some(v)) if v > 0.0 => (v, false),
        _ => (DEFAULT_MIN_SYNC_PERIOD_SECONDS, true),
    };
    let sync_period_seconds = match sync {
        Some(v) if v > 0.0 || form == ConfigForm::Configz => v,
        _ => DEFAULT_SYNC_PERIOD_SECONDS,
    };
    let metrics_bind_address = get_ci(config, METRICS_BIND_ADDRESS).and_then(|v| v.as_str()).filter(|s| !s.is_empty()).map(str::to_string);
    Ok(ProxyConfig { mode, mode_origin, min_sync_period_seconds, sync_period_seconds, min_sync_period_defaulted, metrics_bind_address, form })
}

fn field_err(field: &str, message: &str) -> ConfigError {
    ConfigError::Field { field: field.to_string(), message: message.to_string() }
}

/// Case-insensitive object lookup (`/configz` uses Go field names, files use camelCase).
fn get_ci<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    let obj = v.as_object()?;
    obj.get(key).or_else(|| obj.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v))
}

/// The minSyncPeriod (and mode) the operator uses, with where it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedProxyConfig {
    /// The configuration read, when one was.
    pub config: Option<ProxyConfig>,
    /// minSyncPeriod to use, seconds ([`DEFAULT_MIN_SYNC_PERIOD_SECONDS`] when nothing was read).
    pub min_sync_period_seconds: f64,
    /// `configz <node>`, `ConfigMap <namespace>/<name>` or `default`.
    pub source: String,
    /// Why the better sources were not used (one line each), for logs and status messages.
    pub notes: Vec<String>,
    /// Set when no kube-proxy runs and another dataplane does the Service load-balancing (a
    /// Cilium agent found without kube-proxy pods).
    pub dataplane: Option<Dataplane>,
}

/// A Service dataplane other than kube-proxy, found because no kube-proxy runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Dataplane {
    /// Its proxy mode (`ebpf` for Cilium's kube-proxy replacement).
    pub mode: ProxyMode,
    /// One sentence for the policy status and logs: what was found, and that sizing uses the
    /// policy default (an eBPF dataplane exports no kube-proxy sync histograms).
    pub note: String,
}

impl Default for ResolvedProxyConfig {
    fn default() -> Self {
        Self { config: None, min_sync_period_seconds: DEFAULT_MIN_SYNC_PERIOD_SECONDS, source: "default".into(), notes: Vec::new(), dataplane: None }
    }
}

impl ResolvedProxyConfig {
    /// A configuration read from `source`.
    pub fn from_config(config: ProxyConfig, source: String, notes: Vec<String>) -> Self {
        Self { min_sync_period_seconds: config.min_sync_period_seconds, config: Some(config), source, notes, dataplane: None }
    }

    /// The mode the configuration names, if one was read, else the detected dataplane's.
    pub fn mode(&self) -> Option<ProxyMode> {
        self.config.as_ref().map(|c| c.mode).or_else(|| self.dataplane.as_ref().map(|d| d.mode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubeadm's `kube-system/kube-proxy` ConfigMap, key `config.conf`, as `kubeadm init` (1.31)
    /// writes it: every duration is `0s` (kube-proxy applies its defaults), `mode: ""`.
    const KUBEADM: &str = include_str!("../../tests/data/kube-proxy-config/kubeadm-1.31-config.conf");

    /// EKS's `kube-system/kube-proxy-config` ConfigMap, key `config`: metrics on 0.0.0.0 and
    /// `minSyncPeriod: 0s`.
    const EKS: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
clientConnection:
  acceptContentTypes: ""
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: /var/lib/kube-proxy/kubeconfig
  qps: 5
clusterCIDR: ""
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 0s
  syncPeriod: 30s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  syncPeriod: 30s
kind: KubeProxyConfiguration
metricsBindAddress: 0.0.0.0:10249
mode: "iptables"
nodePortAddresses: null
oomScoreAdj: -998
portRange: ""
udpIdleTimeout: 250ms
"#;

    #[test]
    fn go_durations() {
        let ok = [
            ("1s", 1.0),
            ("500ms", 0.5),
            ("1m0s", 60.0),
            ("0s", 0.0),
            ("0", 0.0),
            ("2h45m", 9900.0),
            ("1.5s", 1.5),
            ("1h0m0s", 3600.0),
            ("24h0m0s", 86400.0),
            ("250ms", 0.25),
            ("100us", 1e-4),
            ("100µs", 1e-4),
            ("3ns", 3e-9),
            ("-1s", -1.0),
            ("+2s", 2.0),
            (".5s", 0.5),
            ("1.s", 1.0),
        ];
        for (text, secs) in ok {
            let got = parse_go_duration(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!((got - secs).abs() < 1e-12, "{text}: {got} != {secs}");
        }
        for bad in ["", "1", "s", "1x", "1.2.3s", ".s", "1 s", "-", "1s2", "10 "] {
            let e = parse_go_duration(bad).unwrap_err();
            assert_eq!(e.input, bad);
            assert!(e.to_string().contains("Go duration"), "{e}");
        }
        assert!(parse_go_duration("1x").unwrap_err().message.contains("unknown unit"));
        assert!(parse_go_duration("10").unwrap_err().message.contains("missing unit"));
    }

    #[test]
    fn go_durations_beyond_int64_nanoseconds_are_refused() {
        // Go's own bound: 2562047h47m16.854775807s is the largest time.Duration.
        let max = parse_go_duration("2562047h47m16s").unwrap();
        assert_eq!(max, 2_562_047.0 * 3600.0 + 47.0 * 60.0 + 16.0);
        for bad in ["2562048h", "9223372037s", "9300000000000000000ns", "153722868m"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
        let nines = format!("{}s", "9".repeat(400));
        let e = parse_go_duration(&nines).unwrap_err();
        assert_eq!(e.input, nines);
        assert!(e.message.starts_with("out of range: longer than Go's largest duration 2562047h47m16.854775807s"), "{e}");
        let e = parse_go_duration("2562048h").unwrap_err();
        assert!(e.message.starts_with("out of range"), "{e}");
        let e = parse_go_duration("-2562048h").unwrap_err();
        assert!(e.message.starts_with("out of range"), "{e}");
        // Each part is in range, the sum is not.
        assert!(parse_go_duration("2562047h60m").unwrap_err().message.starts_with("out of range"));
    }

    #[test]
    fn absurd_min_sync_period_is_refused_with_the_field_and_value() {
        let nines = format!("{}s", "9".repeat(400));
        let e = parse_kube_proxy_config(&format!("iptables:\n  minSyncPeriod: {nines}\n")).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with(&format!("iptables.minSyncPeriod: invalid duration \"{nines}\": out of range")), "{text}");
        let configz = format!(r#"{{"kubeproxy.config.k8s.io":{{"Mode":"iptables","MinSyncPeriod":"{nines}","SyncPeriod":"30s"}}}}"#);
        let e = parse_configz(&configz).unwrap_err();
        assert!(e.to_string().starts_with(&format!("minSyncPeriod: invalid duration \"{nines}\": out of range")), "{e}");
        let e = parse_configz(r#"{"kubeproxy.config.k8s.io":{"Mode":"iptables","MinSyncPeriod":"1s","SyncPeriod":"3000000h"}}"#).unwrap_err();
        assert!(e.to_string().starts_with("syncPeriod: invalid duration \"3000000h\": out of range"), "{e}");
    }

    #[test]
    fn kubeadm_config_gets_kube_proxy_defaults() {
        let c = parse_kube_proxy_config(KUBEADM).unwrap();
        assert_eq!(c.mode, ProxyMode::Iptables, "mode \"\" is iptables on Linux");
        assert_eq!(c.min_sync_period_seconds, 1.0);
        assert!(c.min_sync_period_defaulted);
        assert_eq!(c.sync_period_seconds, 30.0);
        assert_eq!(c.metrics_bind_address, None);
        assert!(c.metrics_loopback_only());
        assert_eq!(c.form, ConfigForm::File);
    }

    /// A saved `/configz` body is read as one (its values literal), anything else as a file.
    #[test]
    fn a_saved_configuration_is_read_in_its_own_form() {
        let configz = parse_saved_config(r#"{"kubeproxy.config.k8s.io":{"Mode":"iptables","MinSyncPeriod":"0s","SyncPeriod":"30s"}}"#).unwrap();
        assert_eq!((configz.form, configz.min_sync_period_seconds, configz.mode_origin), (ConfigForm::Configz, 0.0, ModeOrigin::Unknown));
        let file = parse_saved_config(KUBEADM).unwrap();
        assert_eq!((file.form, file.min_sync_period_seconds, file.mode_origin), (ConfigForm::File, 1.0, ModeOrigin::Defaulted));
        let json_file = parse_saved_config(r#"{"mode":"nftables","nftables":{"minSyncPeriod":"0s"}}"#).unwrap();
        assert_eq!((json_file.form, json_file.min_sync_period_seconds, json_file.mode_origin), (ConfigForm::File, 1.0, ModeOrigin::Explicit));
        assert!(matches!(parse_saved_config("a: [\n"), Err(ConfigError::Syntax(_))));
    }

    /// A file tells a set mode from a defaulted one; `/configz` holds the mode kube-proxy runs,
    /// already defaulted (module docs), so only an empty one there says defaulted.
    #[test]
    fn the_mode_is_explicit_or_defaulted_in_a_file_and_unknown_in_configz() {
        assert_eq!(parse_kube_proxy_config(KUBEADM).unwrap().mode_origin, ModeOrigin::Defaulted, "kubeadm before 1.37: mode \"\"");
        assert_eq!(parse_kube_proxy_config(EKS).unwrap().mode_origin, ModeOrigin::Explicit, "mode: \"iptables\"");
        let absent = parse_kube_proxy_config("iptables:\n  minSyncPeriod: 2s\n").unwrap();
        assert_eq!((absent.mode, absent.mode_origin), (ProxyMode::Iptables, ModeOrigin::Defaulted));
        let nft = parse_kube_proxy_config("mode: nftables\n").unwrap();
        assert_eq!((nft.mode, nft.mode_origin), (ProxyMode::Nftables, ModeOrigin::Explicit));
        let blank = parse_kube_proxy_config("mode: \" \"\n").unwrap();
        assert_eq!((blank.mode, blank.mode_origin), (ProxyMode::Iptables, ModeOrigin::Defaulted));
        let configz = parse_configz(r#"{"kubeproxy.config.k8s.io":{"Mode":"iptables","MinSyncPeriod":"1s","SyncPeriod":"30s"}}"#).unwrap();
        assert_eq!((configz.mode, configz.mode_origin), (ProxyMode::Iptables, ModeOrigin::Unknown));
        let empty = parse_configz(r#"{"kubeproxy.config.k8s.io":{"Mode":"","MinSyncPeriod":"1s","SyncPeriod":"30s"}}"#).unwrap();
        assert_eq!((empty.mode, empty.mode_origin), (ProxyMode::Iptables, ModeOrigin::Defaulted));
    }

    #[test]
    fn eks_zero_min_sync_period_is_kube_proxys_one_second_in_iptables_mode() {
        let c = parse_kube_proxy_config(EKS).unwrap();
        assert_eq!(c.mode, ProxyMode::Iptables);
        assert_eq!(c.min_sync_period_seconds, 1.0);
        assert!(c.min_sync_period_defaulted);
        assert_eq!(c.sync_period_seconds, 30.0);
        assert_eq!(c.metrics_bind_address.as_deref(), Some("0.0.0.0:10249"));
        assert!(!c.metrics_loopback_only());

        // the same file in IPVS mode: IPVS has no minSyncPeriod default, zero stays zero
        let ipvs = EKS.replace("mode: \"iptables\"", "mode: ipvs");
        let c = parse_kube_proxy_config(&ipvs).unwrap();
        assert_eq!(c.mode, ProxyMode::Ipvs);
        assert_eq!(c.min_sync_period_seconds, 0.0);
        assert!(!c.min_sync_period_defaulted);
    }

    #[test]
    fn min_sync_period_comes_from_the_active_modes_section() {
        let text = "mode: nftables\niptables:\n  minSyncPeriod: 10s\nnftables:\n  minSyncPeriod: 2500ms\n  syncPeriod: 1m0s\n";
        let c = parse_kube_proxy_config(text).unwrap();
        assert_eq!(c.mode, ProxyMode::Nftables);
        assert_eq!(c.min_sync_period_seconds, 2.5);
        assert_eq!(c.sync_period_seconds, 60.0);
        let c = parse_kube_proxy_config("iptables:\n  minSyncPeriod: 10s\nipvs:\n  minSyncPeriod: 5s\n").unwrap();
        assert_eq!((c.mode, c.min_sync_period_seconds), (ProxyMode::Iptables, 10.0));
        let c = parse_kube_proxy_config("{\"mode\": \"ipvs\", \"ipvs\": {\"minSyncPeriod\": \"5s\"}}").unwrap();
        assert_eq!((c.mode, c.min_sync_period_seconds), (ProxyMode::Ipvs, 5.0));
    }

    #[test]
    fn config_errors_are_clear() {
        let e = parse_kube_proxy_config("iptables:\n  minSyncPeriod: 1\n").unwrap_err();
        assert!(e.to_string().starts_with("iptables.minSyncPeriod: expected a duration string"), "{e}");
        let e = parse_kube_proxy_config("iptables:\n  minSyncPeriod: 1 sec\n").unwrap_err();
        assert!(e.to_string().contains("iptables.minSyncPeriod: invalid duration \"1 sec\""), "{e}");
        let e = parse_kube_proxy_config("mode: userspace\n").unwrap_err();
        assert_eq!(e, ConfigError::UnknownMode("userspace".into()));
        assert!(matches!(parse_kube_proxy_config("- a\n- b\n").unwrap_err(), ConfigError::Shape(_)));
        assert!(matches!(parse_kube_proxy_config("a: [\n").unwrap_err(), ConfigError::Syntax(_)));
        let e = parse_kube_proxy_config("iptables:\n  minSyncPeriod: -1s\n").unwrap_err();
        assert!(e.to_string().contains("negative"), "{e}");
    }

    #[test]
    fn configz_of_a_current_kube_proxy_has_top_level_periods_and_go_field_names() {
        // internal KubeProxyConfiguration (1.31+): no JSON tags, SyncPeriod/MinSyncPeriod at the
        // top level, metav1.Duration marshalled as a string.
        let body = r#"{"kubeproxy.config.k8s.io":{"kind":"","apiVersion":"","Linux":{"Conntrack":{"MaxPerCore":32768,"Min":131072,"TCPEstablishedTimeout":"24h0m0s","TCPCloseWaitTimeout":"1h0m0s","TCPBeLiberal":false,"UDPTimeout":"0s","UDPStreamTimeout":"0s"},"MasqueradeAll":false,"OOMScoreAdj":-999},"Windows":{"RunAsService":false},"FeatureGates":{},"ClientConnection":{"Kubeconfig":"/var/lib/kube-proxy/kubeconfig.conf","AcceptContentTypes":"","ContentType":"application/vnd.kubernetes.protobuf","QPS":5,"Burst":10},"HostnameOverride":"kind-worker","BindAddress":"0.0.0.0","HealthzBindAddress":"0.0.0.0:10256","MetricsBindAddress":"0.0.0.0:10249","BindAddressHardFail":false,"EnableProfiling":false,"ShowHiddenMetricsForVersion":"","Mode":"iptables","IPTables":{"MasqueradeBit":14,"LocalhostNodePorts":true},"IPVS":{"Scheduler":"","ExcludeCIDRs":null,"StrictARP":false,"TCPTimeout":"0s","TCPFinTimeout":"0s","UDPTimeout":"0s"},"Winkernel":{"NetworkName":"","SourceVip":"","EnableDSR":false,"RootHnsEndpointName":"","ForwardHealthCheckVip":false},"NFTables":{"MasqueradeBit":14},"DetectLocalMode":"ClusterCIDR","DetectLocal":{"BridgeInterface":"","ClusterCIDRs":["10.244.0.0/16"],"InterfaceNamePrefix":""},"NodePortAddresses":null,"SyncPeriod":"30s","MinSyncPeriod":"1s","ConfigSyncPeriod":"15m0s"}}"#;
        let c = parse_configz(body).unwrap();
        assert_eq!(c.mode, ProxyMode::Iptables);
        assert_eq!(c.min_sync_period_seconds, 1.0);
        assert_eq!(c.sync_period_seconds, 30.0);
        assert!(!c.min_sync_period_defaulted);
        assert_eq!(c.form, ConfigForm::Configz);
        assert_eq!(c.metrics_bind_address.as_deref(), Some("0.0.0.0:10249"));
    }

    #[test]
    fn configz_of_an_older_kube_proxy_keeps_periods_in_the_mode_section_and_zero_is_literal() {
        let body = r#"{"kubeproxy.config.k8s.io":{"Mode":"ipvs","IPTables":{"MasqueradeBit":14,"MasqueradeAll":false,"SyncPeriod":"30s","MinSyncPeriod":"1s"},"IPVS":{"SyncPeriod":"30s","MinSyncPeriod":"0s","Scheduler":"rr"},"MetricsBindAddress":"127.0.0.1:10249"}}"#;
        let c = parse_configz(body).unwrap();
        assert_eq!(c.mode, ProxyMode::Ipvs);
        assert_eq!(c.min_sync_period_seconds, 0.0);
        assert!(c.metrics_loopback_only());
        let e = parse_configz(r#"{"componentconfig":{}}"#).unwrap_err();
        assert!(e.to_string().contains("no \"kubeproxy.config.k8s.io\" entry (keys: componentconfig)"), "{e}");
        assert!(matches!(parse_configz("<html>").unwrap_err(), ConfigError::Syntax(_)));
    }

    #[test]
    fn reduced_configz_keeps_only_what_the_operator_reads_and_reads_the_same() {
        let current = r#"{"kubeproxy.config.k8s.io":{"kind":"","ClientConnection":{"Kubeconfig":"/var/lib/kube-proxy/kubeconfig.conf","QPS":5},"HostnameOverride":"kind-worker","MetricsBindAddress":"0.0.0.0:10249","Mode":"iptables","IPTables":{"MasqueradeBit":14,"LocalhostNodePorts":true},"NFTables":{"MasqueradeBit":14},"DetectLocal":{"ClusterCIDRs":["10.244.0.0/16"]},"SyncPeriod":"30s","MinSyncPeriod":"1s","ConfigSyncPeriod":"15m0s"}}"#;
        let older = r#"{"kubeproxy.config.k8s.io":{"Mode":"ipvs","IPTables":{"MasqueradeBit":14,"SyncPeriod":"30s","MinSyncPeriod":"1s"},"IPVS":{"SyncPeriod":"30s","MinSyncPeriod":"0s","Scheduler":"rr"},"MetricsBindAddress":"127.0.0.1:10249"}}"#;
        let unwrapped = r#"{"mode":"nftables","nftables":{"minSyncPeriod":"2s","masqueradeBit":14},"clusterCIDR":"10.0.0.0/8"}"#;
        for body in [current, older, unwrapped] {
            let reduced = reduce_configz(body).unwrap();
            assert_eq!(parse_configz(&reduced), parse_configz(body), "{reduced}");
            for gone in ["Kubeconfig", "kind-worker", "10.244.0.0/16", "MasqueradeBit", "masqueradeBit", "Scheduler", "ConfigSyncPeriod", "10.0.0.0/8"] {
                assert!(!reduced.contains(gone), "{gone} in {reduced}");
            }
        }
        assert_eq!(
            reduce_configz(older).unwrap(),
            r#"{"kubeproxy.config.k8s.io":{"IPTables":{"MinSyncPeriod":"1s","SyncPeriod":"30s"},"IPVS":{"MinSyncPeriod":"0s","SyncPeriod":"30s"},"MetricsBindAddress":"127.0.0.1:10249","Mode":"ipvs"}}"#
        );
        // what the operator would refuse is refused here too
        assert!(matches!(reduce_configz(r#"{"componentconfig":{}}"#), Err(ConfigError::Shape(_))));
        assert!(matches!(reduce_configz(r#"{"mode":"userspace"}"#), Err(ConfigError::UnknownMode(_))));
        assert!(matches!(reduce_configz("<html>"), Err(ConfigError::Syntax(_))));
    }
}
