//! `safe-termination analyze [NODE=]SOURCE...`: measure the propagation window from kube-proxy
//! scrapes and print the recommendation and advice.

use crate::cli::{Error, OutputFormat, load_policy_spec, number_in, whole_in};
use crate::core::advisor::{ClusterFacts, Thresholds, parse_version};
use crate::core::analysis::{AnalysisOptions, AnalysisReport, DEFAULT_MIN_SYNC_PERIOD_SECONDS, analyze};
use crate::core::exposition::{Format, accept_header};
use crate::core::model::{Basis, NodeInput, ProxyMode};
use crate::core::proxyconfig::{self, ConfigForm, ProxyConfig};
use crate::sources;
use std::fmt::Write as _;
use std::io::Write;
use std::time::Duration;

/// Arguments of `analyze`.
#[derive(Debug, clap::Args)]
pub struct AnalyzeArgs {
    /// Scrapes to analyse: a file, `-` for standard input, or a kube-proxy metrics URL
    /// (`http://NODE_IP:10249/metrics`; http or https, in any case). Prefix `NODE=` to name the node (else a file is named
    /// after its stem, a URL after host:port; two sources may not get the same such name); the
    /// same NODE given twice is analysed over the interval between its two scrapes (first =
    /// earlier). The text before the first `=` is a NODE unless it contains `/`, `\` or `:`
    /// (node names such as ip-10-0-0-1.ec2.internal are fine); write ./FILE for a file in the
    /// current directory whose name contains `=`.
    #[arg(required = true, value_name = "[NODE=]SOURCE")]
    pub sources: Vec<String>,
    /// An earlier scrape of a node (`[NODE=]FILE`); NODE must be the node of a source; without
    /// NODE it pairs with the only source.
    #[arg(long, value_name = "[NODE=]FILE")]
    pub earlier: Vec<String>,
    /// A TerminationPolicy YAML/JSON whose spec sizes the recommendation (defaults otherwise).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<String>,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Proxy mode, overriding /proxyMode and inference: iptables, nftables, ipvs, kernelspace, ebpf.
    #[arg(long, value_parser = crate::cli::parse_proxy_mode)]
    pub mode: Option<ProxyMode>,
    /// Number of Services in the cluster (for the mode advisor).
    #[arg(long, allow_negative_numbers = true, value_parser = whole_in(0u64, 100_000_000, "a whole number of Services"))]
    pub services: Option<u64>,
    /// Number of Service ports (defaults to --services) for the rule estimate.
    #[arg(long, allow_negative_numbers = true, value_parser = whole_in(0u64, 100_000_000, "a whole number of Service ports"))]
    pub service_ports: Option<u64>,
    /// Number of endpoints in the cluster.
    #[arg(long, allow_negative_numbers = true, value_parser = whole_in(0u64, 100_000_000, "a whole number of endpoints"))]
    pub endpoints: Option<u64>,
    /// Kubernetes version (e.g. v1.33.2 or 1.33); defaults to kube-proxy's kubernetes_build_info.
    #[arg(long, value_parser = parse_kubernetes_version)]
    pub kubernetes_version: Option<String>,
    /// kube-proxy's configuration, saved: the kube-proxy ConfigMap's `config.conf` (a
    /// KubeProxyConfiguration, YAML or JSON) or a `/configz` body. Gives minSyncPeriod (unless
    /// --min-sync-period-seconds), the mode of a node that reports none, and whether `mode` is
    /// set or left to kube-proxy's default (advice ProxyModeDefaulted).
    #[arg(long, value_name = "FILE")]
    pub kube_proxy_config: Option<String>,
    /// kube-proxy minSyncPeriod in seconds, 0 to 300 [default: 1, kube-proxy's iptables default, or the --kube-proxy-config's].
    #[arg(long, allow_negative_numbers = true, value_parser = number_in(0.0, 300.0, false, "a number of seconds"))]
    pub min_sync_period_seconds: Option<f64>,
    /// conntrack entries / nf_conntrack_max on the worst node (0 to 1), if known.
    #[arg(long, allow_negative_numbers = true, value_parser = number_in(0.0, 1.0, false, "a ratio"))]
    pub conntrack_usage: Option<f64>,
    /// ProxySyncSlow threshold, seconds (above 0, at most 3600).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true, value_parser = number_in(0.0, 3600.0, true, "a number of seconds"))]
    pub sync_slow_seconds: f64,
    /// iptables -> nftables migration threshold, Services (1 to 100,000,000).
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true, value_parser = whole_in(1u64, 100_000_000, "a whole number of Services"))]
    pub iptables_services_threshold: u64,
    /// eBPF dataplane threshold, Services (1 to 100,000,000).
    #[arg(long, default_value_t = 8000, allow_negative_numbers = true, value_parser = whole_in(1u64, 100_000_000, "a whole number of Services"))]
    pub ebpf_services_threshold: u64,
    /// ProxyStale threshold (how long changes have waited for a sync), seconds (above 0, at most 86400).
    #[arg(long, default_value_t = 30.0, allow_negative_numbers = true, value_parser = number_in(0.0, 86400.0, true, "a number of seconds"))]
    pub stale_seconds: f64,
    /// Per-URL timeout, seconds (1 to 3600).
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = whole_in(1u64, 3600, "a whole number of seconds"))]
    pub timeout_seconds: u64,
    /// Exposition of the scrapes: `auto` reads a URL's answer as its Content-Type says (asking
    /// for protobuf first, text as the fallback) and a file or standard input as its first bytes
    /// say; `text` or `protobuf` asks a URL for that one only and refuses a source in the other.
    #[arg(long, value_enum, default_value_t = ScrapeFormat::Auto)]
    pub format: ScrapeFormat,
    /// Histograms the p99s come from: `native` reads kube-proxy's native histogram where a
    /// protobuf scrape carries one (9%-wide buckets) and the classic buckets otherwise;
    /// `classic` reads the classic buckets only (the same scrape's classic p99, to compare).
    #[arg(long, value_enum, default_value_t = Histograms::Native)]
    pub histograms: Histograms,
    /// Largest `/metrics` body read from a URL, bytes (1024 to 1073741824); a larger body is an
    /// error naming the URL and the limit. `/proxyMode` is capped at 64 KiB.
    #[arg(long, default_value_t = sources::DEFAULT_MAX_BODY_BYTES, allow_negative_numbers = true, value_parser = whole_in(1024usize, 1 << 30, "a whole number of bytes"))]
    pub max_body_bytes: usize,
}

/// `--format`: which exposition a source is read as.
/// `--histograms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Histograms {
    /// The native histogram where the scrape carries one, else the classic buckets.
    Native,
    /// The classic buckets only.
    Classic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScrapeFormat {
    /// A URL's Content-Type, a file's first bytes.
    Auto,
    /// The Prometheus text format.
    Text,
    /// The protobuf exposition (length-delimited MetricFamily messages; native histograms).
    Protobuf,
}

impl ScrapeFormat {
    /// The one format asked for, `None` for `auto`.
    fn only(self) -> Option<Format> {
        match self {
            Self::Auto => None,
            Self::Text => Some(Format::Text),
            Self::Protobuf => Some(Format::Protobuf),
        }
    }
}

/// The format a saved scrape (`bytes` of the file or standard input `name`) is read in under
/// `--format wanted`. Errors: a protobuf body under `--format text`, a text body (UTF-8 that
/// [`Format::detect`] does not take for protobuf) under `--format protobuf`.
fn file_format(name: &str, bytes: &[u8], wanted: ScrapeFormat) -> Result<Format, Error> {
    let detected = Format::detect(bytes);
    match (wanted, detected) {
        (ScrapeFormat::Auto, f) => Ok(f),
        (ScrapeFormat::Text, Format::Protobuf) => Err(Error::Input(format!(
            "{name}: --format text, but this is the protobuf exposition (length-delimited MetricFamily messages): use --format protobuf or --format auto"
        ))),
        (ScrapeFormat::Protobuf, Format::Text) if !bytes.is_empty() && std::str::from_utf8(bytes).is_ok() => Err(Error::Input(format!(
            "{name}: --format protobuf, but this is text, not the protobuf exposition (length-delimited MetricFamily messages): use --format text or --format auto"
        ))),
        (w, _) => Ok(w.only().unwrap_or(detected)),
    }
}

/// The format of a URL's answer (`content_type`, from `name`) under `--format wanted`. Errors: a
/// content type that is not read, or an answer in the other format than `--format` asked for.
fn url_format(name: &str, content_type: Option<&str>, wanted: ScrapeFormat) -> Result<Format, Error> {
    let got = Format::from_content_type(content_type).map_err(|e| Error::Input(e.at(name)))?;
    match wanted.only() {
        Some(want) if want != got => Err(Error::Input(format!(
            "{name}: --format {}, but the server answered in the {} exposition (Content-Type {}): use --format {} or --format auto",
            want.as_str(),
            got.as_str(),
            content_type.unwrap_or("absent"),
            got.as_str()
        ))),
        _ => Ok(got),
    }
}

/// Checks a `--kubernetes-version` at argument parsing (a usage error, exit 2, before any URL is
/// fetched): MAJOR.MINOR as [`parse_version`] reads it, optionally `v`-prefixed, with a patch or
/// a suffix.
fn parse_kubernetes_version(s: &str) -> Result<String, Error> {
    match parse_version(s) {
        Some(_) => Ok(s.to_string()),
        None => Err(Error::Usage("expected a Kubernetes version like v1.33.2 or 1.33 (MAJOR.MINOR, optional v prefix, patch and suffix)".into())),
    }
}

/// Splits `NODE=SOURCE` into the node, the source and whether the node was named (`true`). The
/// text before the first `=` is a NODE when it is not empty and has no `/`, `\` or `:` (so a
/// Kubernetes node name, a DNS subdomain such as `ip-10-0-0-1.ec2.internal`, is one; a path with
/// a directory or a URL is not); a URL source never has one. A source without `NODE=` is named
/// after itself: a file after its stem, a URL after `host:port`.
fn split_node(arg: &str) -> (String, String, bool) {
    if let Some((node, src)) = arg.split_once('=')
        && !node.is_empty()
        && !node.contains(['/', '\\', ':'])
        && !sources::is_url(arg)
    {
        return (node.to_string(), src.to_string(), true);
    }
    let name = if sources::is_url(arg) {
        reqwest::Url::parse(arg).ok().and_then(|u| {
            u.host_str().map(|h| match u.port() {
                Some(p) => format!("{h}:{p}"),
                None => h.to_string(),
            })
        })
    } else {
        std::path::Path::new(arg).file_stem().map(|s| s.to_string_lossy().into_owned())
    };
    (name.unwrap_or_else(|| arg.to_string()), arg.to_string(), false)
}

/// The node each `--earlier` argument pairs with, from the arguments alone (`source_nodes`: the
/// node of each source, in order). `NODE=` must name a source's node, even when there is only
/// one source; an unnamed `--earlier` pairs with the only node. Errors: no such node (listing
/// the nodes), an unnamed `--earlier` with several nodes, a node that already has an earlier
/// scrape (given twice as a source, or by a previous `--earlier`), or a node given more than
/// twice as a source (at most an earlier and a later scrape). Each is a usage error (exit
/// 2, docs/analyze.md): the flag's value does not fit the other arguments, and no file is read.
fn earlier_nodes(source_nodes: &[String], earlier: &[String]) -> Result<Vec<String>, Error> {
    let mut nodes: Vec<&str> = Vec::new();
    let mut twice: Vec<&str> = Vec::new();
    for n in source_nodes {
        if twice.contains(&n.as_str()) {
            return Err(Error::Usage(format!("node {n} is given more than twice (at most an earlier and a later scrape)")));
        }
        if nodes.contains(&n.as_str()) {
            twice.push(n);
        } else {
            nodes.push(n);
        }
    }
    let mut targets: Vec<String> = Vec::new();
    for raw in earlier {
        let (node, _, explicit) = split_node(raw);
        let arg = sources::redact(raw);
        let target = if explicit {
            if !nodes.contains(&node.as_str()) {
                return Err(Error::Usage(format!(
                    "--earlier {arg}: no source is node {node:?} (the nodes are: {}): name the node (NODE=FILE) it belongs to",
                    nodes.join(", ")
                )));
            }
            node
        } else if let [only] = nodes.as_slice() {
            (*only).to_string()
        } else {
            return Err(Error::Usage(format!("--earlier {arg}: name the node (NODE=FILE) it belongs to")));
        };
        if twice.contains(&target.as_str()) || targets.contains(&target) {
            return Err(Error::Usage(format!("--earlier {arg}: node {target} already has an earlier scrape")));
        }
        targets.push(target);
    }
    Ok(targets)
}

/// `e` for the source argument `arg`, with how `arg` was read when that may be the problem: a
/// file that does not exist after a `NODE=` split (the argument may be a file name with `=`),
/// or an argument starting with `=` (an empty node name).
fn source_hint(e: Error, arg: &str, node: &str, src: &str, explicit: bool) -> Error {
    let missing = |path: &str| sources::url_scheme(path).is_none() && path != "-" && !std::path::Path::new(path).exists();
    if explicit && missing(src) {
        Error::Input(format!("{} (read as node {node:?}, file {src:?}; for a file named {arg:?}, write ./{arg})", e))
    } else if arg.starts_with('=') && missing(arg) {
        Error::Input(format!("{} (an empty node name: write NODE{arg}, or ./{arg} for a file of that name)", e))
    } else {
        e
    }
}

/// One source read and parsed: a URL (asked for as `format` says, read as its answer's
/// Content-Type says), a file or `-` (read as its first bytes say, or as `format` insists).
async fn load(
    source: &str,
    client: &reqwest::Client,
    max_body_bytes: usize,
    format: ScrapeFormat,
) -> Result<(crate::core::exposition::KubeProxyScrape, Option<ProxyMode>), Error> {
    let name = if source == "-" { "<stdin>".into() } else { sources::redact(source) };
    let input = |e: sources::SourceError| Error::Input(e.to_string());
    let (bytes, read_as, proxy_mode) = if let Some(scheme) = sources::url_scheme(source)
        && !sources::is_url(source)
    {
        return Err(Error::Input(format!(
            "{}: unsupported URL scheme {scheme:?}: a source is a file, - (standard input) or an http:// or https:// URL",
            sources::redact(source)
        )));
    } else if sources::is_url(source) {
        let fetched = sources::fetch_url(client, source, max_body_bytes, accept_header(format.only())).await.map_err(input)?;
        let read_as = url_format(&name, fetched.content_type.as_deref(), format)?;
        (fetched.body, read_as, fetched.proxy_mode)
    } else {
        let bytes = sources::read_file_bytes(source).map_err(|e| match e {
            sources::SourceError::FileTooLarge { .. } => Error::Input(format!("{e} (a kube-proxy scrape is about 80 KB)")),
            e => input(e),
        })?;
        let read_as = file_format(&name, &bytes, format)?;
        (bytes, read_as, None)
    };
    // under --format auto, a body that cannot begin a text exposition (its first byte is neither
    // printable ASCII nor a blank), is not UTF-8, and that detection did not take for protobuf
    // (a corrupt first length, say) is tried as protobuf too; when neither reader takes it, the
    // error gives both reasons (the text reader's alone blamed the encoding of what is binary).
    // A text file with a stray Latin-1 byte keeps the text reader's error alone.
    let binary = format == ScrapeFormat::Auto
        && read_as == Format::Text
        && bytes.first().is_some_and(|b| !(b.is_ascii_graphic() || b.is_ascii_whitespace()))
        && std::str::from_utf8(&bytes).is_err();
    let mut scrape = if binary {
        match sources::read_scrape_as(&name, bytes.clone(), Format::Protobuf) {
            Ok(scrape) => scrape,
            Err(protobuf) => {
                let text = sources::read_scrape_as(&name, bytes, Format::Text).err().map(|e| e.to_string()).unwrap_or_default();
                // each reader's message without the file name it starts with (`NAME:LINE: ...`
                // becomes `line LINE: ...`)
                let reason = |e: String| -> String {
                    let Some(rest) = e.strip_prefix(name.as_str()) else { return e };
                    match rest.strip_prefix(':').and_then(|r| r.split_once(':')) {
                        Some((line, message)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => format!("line {line}:{message}"),
                        _ => rest.trim_start_matches(':').trim_start().to_string(),
                    }
                };
                return Err(Error::Input(format!(
                    "{name}: neither exposition reads it (--format auto): as protobuf, {}; as text, {}",
                    reason(protobuf.to_string()),
                    reason(text)
                )));
            }
        }
    } else {
        sources::read_scrape_as(&name, bytes, read_as).map_err(input)?
    };
    // when it was taken, which a pending change's wait is measured to: now for a URL; unknown
    // for a file or standard input (a checkout or copy resets a file's modification time), so
    // a capture with changes pending reports no wait rather than a wrong one
    if sources::is_url(source) {
        scrape.scraped_at_unix_seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs_f64());
    }
    if scrape.sync.is_none() && scrape.network_programming.is_none() && scrape.last_sync_timestamp_seconds.is_none() {
        // valid text, but nothing of kube-proxy's: the report will say NoData; say why here
        // (a closed standard error loses the warning, never panics)
        let _ = writeln!(
            std::io::stderr().lock(),
            "warning: {name}: no kube-proxy sync metrics (kubeproxy_sync_proxy_rules_*, kubeproxy_network_programming_duration_seconds): is this kube-proxy's /metrics (port 10249)?"
        );
    }
    Ok((scrape, proxy_mode))
}

/// Runs `analyze`; returns the rendered report or an input error.
pub async fn run(args: &AnalyzeArgs) -> Result<String, Error> {
    let spec = match &args.policy {
        Some(p) => load_policy_spec(p)?,
        None => Default::default(),
    };
    // node names come from the arguments: a wrong --earlier pairing is reported before any fetch
    let source_nodes: Vec<String> = args.sources.iter().map(|a| split_node(a).0).collect();
    let earlier_nodes = earlier_nodes(&source_nodes, &args.earlier)?;
    let client = sources::http_client(Duration::from_secs(args.timeout_seconds));
    let mut inputs: Vec<NodeInput> = Vec::new();
    // per node: the first source and whether NODE= named it. Only a NODE= given twice pairs two
    // scrapes of one node; an implicit name (file stem, host:port) that meets another name is an
    // error, never a silent "between scrapes" of two different nodes.
    let mut named: Vec<(String, String, bool)> = Vec::new();
    for arg in &args.sources {
        let (node, src, explicit) = split_node(arg);
        if let Some((_, first, first_explicit)) = named.iter().find(|(n, _, _)| *n == node)
            && !(explicit && *first_explicit)
        {
            let how = |src: &str, explicit: bool| if explicit { format!("{node}={}", sources::redact(src)) } else { sources::redact(src) };
            // the arguments do not fit together: a usage error (exit 2), as for --earlier
            return Err(Error::Usage(format!(
                "{} and {} are both node {node:?} (a source without NODE= is named after its file stem or host:port): name each node, e.g. node-a=FILE node-b=FILE; to compare two scrapes of one node, give both the same NODE= (first is earlier) or use --earlier",
                how(first, *first_explicit),
                how(&src, explicit)
            )));
        }
        named.push((node.clone(), src.clone(), explicit));
        let (scrape, proxy_mode) = load(&src, &client, args.max_body_bytes, args.format).await.map_err(|e| source_hint(e, arg, &node, &src, explicit))?;
        match inputs.iter_mut().find(|i| i.node == node) {
            // a third scrape of a node was refused by earlier_nodes
            Some(existing) => {
                let earlier = std::mem::replace(&mut existing.later, scrape);
                existing.earlier = Some(earlier);
                existing.proxy_mode = proxy_mode.or(existing.proxy_mode);
            }
            None => inputs.push(NodeInput { node, later: scrape, earlier: None, proxy_mode }),
        }
    }
    for (raw, node) in args.earlier.iter().zip(earlier_nodes) {
        let src = split_node(raw).1;
        let Some(target) = inputs.iter_mut().find(|i| i.node == node) else {
            return Err(Error::Input(format!("--earlier {}: internal error: node {node:?} was not loaded", sources::redact(raw))));
        };
        target.earlier = Some(load(&src, &client, args.max_body_bytes, args.format).await?.0);
    }
    let config = args.kube_proxy_config.as_deref().map(read_kube_proxy_config).transpose()?;
    let (min_sync_period_seconds, min_sync_period_source) = match (args.min_sync_period_seconds, &config) {
        (Some(flag), _) => (flag, "flag".to_string()),
        (None, Some((source, c))) => (c.min_sync_period_seconds, source.clone()),
        (None, None) => (DEFAULT_MIN_SYNC_PERIOD_SECONDS, "default".to_string()),
    };
    let opts = AnalysisOptions {
        min_sync_period_seconds,
        min_sync_period_source,
        mode: args.mode,
        configured_mode: config.as_ref().map(|(_, c)| c.mode),
        facts: ClusterFacts {
            mode: ProxyMode::Unknown,
            mode_origin: config.as_ref().map(|(_, c)| c.mode_origin),
            services: args.services,
            service_ports: args.service_ports,
            endpoints: args.endpoints,
            kubernetes_version: args.kubernetes_version.as_deref().and_then(parse_version),
            conntrack_usage_ratio: args.conntrack_usage,
            other_modes: Vec::new(),
            observed_p99_by_data_plane: Vec::new(),
        },
        thresholds: Thresholds {
            sync_slow_seconds: args.sync_slow_seconds,
            iptables_services: args.iptables_services_threshold,
            ebpf_services: args.ebpf_services_threshold,
            conntrack_usage_ratio: 0.8,
            stale_seconds: args.stale_seconds,
        },
        histograms: match args.histograms {
            Histograms::Native => crate::core::model::HistogramPreference::NativeFirst,
            Histograms::Classic => crate::core::model::HistogramPreference::ClassicOnly,
        },
        // saved scrapes hold no deletion: the control plane's part is measured by the operator's
        // watches only (network programming stands in for it here)
        control_plane_lag: None,
        observed: None,
        observed_by_data_plane: Vec::new(),
    };
    let report = analyze(&inputs, &opts, &spec);
    Ok(match args.output {
        OutputFormat::Json => serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
        OutputFormat::Yaml => serde_saphyr::to_string(&report).unwrap_or_default(),
        OutputFormat::Text => crate::cli::printable(render_text(&report)),
    })
}

/// `--kube-proxy-config FILE` read ([`proxyconfig::parse_saved_config`]), with the source the
/// report names (`configz FILE` or `KubeProxyConfiguration FILE`). Errors: the file cannot be
/// read or is neither form (exit 1).
fn read_kube_proxy_config(path: &str) -> Result<(String, ProxyConfig), Error> {
    let text = sources::read_file(path).map_err(|e| Error::Input(e.to_string()))?;
    let config = proxyconfig::parse_saved_config(&text).map_err(|e| Error::Input(format!("{path}: {e}")))?;
    let form = match config.form {
        ConfigForm::Configz => "configz",
        ConfigForm::File => "KubeProxyConfiguration",
    };
    Ok((format!("{form} {path}"), config))
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}s"))
}

/// Renders the human-readable report: the interval, the per-node table, then the cluster's W,
/// the recommendation with its coverage, the proxy and the advice.
pub fn render_text(r: &AnalysisReport) -> String {
    let mut s = String::new();
    let interval = match r.interval {
        "lifetime" => "since each kube-proxy started (one scrape per node: lifetime counters)",
        "betweenScrapes" => "between two scrapes per node",
        _ => "mixed: see the interval column",
    };
    let _ = writeln!(s, "Interval: {interval}");
    render_node_table(&mut s, r);
    let _ = writeln!(s);
    render_recommendation(&mut s, r);
    let p = &r.proxy;
    let _ = writeln!(
        s,
        "Proxy: mode {}, Services {}, endpoints {}, estimated rules {}, actual rules {}",
        p.mode.as_str(),
        p.services.map_or("-".into(), |v| v.to_string()),
        p.endpoints.map_or("-".into(), |v| v.to_string()),
        p.estimated_rules.map_or("-".into(), |v| v.to_string()),
        p.actual_rules.map_or("-".into(), |v| v.to_string()),
    );
    if r.advice.is_empty() {
        let _ = writeln!(s, "Advice: none");
    } else {
        let _ = writeln!(s, "Advice:");
        for a in &r.advice {
            let _ = writeln!(s, "- {:?} [{:?}] ({}): {}", a.reason, a.severity, a.threshold, a.message);
        }
    }
    s
}

/// A sample count (a float in the text exposition) for the table: whole counts below 10^15 as
/// integers, others to three decimals, and from 10^15 on in scientific notation (`1.000e308`:
/// Rust prints a large float's every digit, 309 of them for 1e308).
fn count_text(x: f64) -> String {
    if x.abs() >= 1e15 {
        format!("{x:.3e}")
    } else if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{}", (x * 1000.0).round() / 1000.0)
    }
}

/// One row per node; the node column is as wide as the longest name (file stems and host:port
/// are long).
fn render_node_table(s: &mut String, r: &AnalysisReport) {
    let w = r.nodes.iter().map(|n| n.node.chars().count()).max().unwrap_or(0).max(24);
    let _ = writeln!(
        s,
        "{:<w$} {:<10} {:<9} {:>8} {:>10} {:>10} {:>10} {:>8}  {:<15} {:<14} INTERVAL",
        "NODE", "MODE", "VERSION", "SAMPLES", "SYNC_P99", "NP_P99", "WINDOW", "STALE", "BASIS", "HISTOGRAM"
    );
    for n in &r.nodes {
        let q = |q: Option<crate::core::exposition::Quantile>| match q {
            Some(q) if q.beyond_top_bucket => format!(">{:.3}s", q.seconds),
            Some(q) => format!("{:.3}s", q.seconds),
            None => "-".into(),
        };
        // which kind each p99 came from: sync, then network programming when it differs
        let kinds: Vec<&str> = [n.sync_p99, n.network_programming_p99].iter().flatten().map(|q| q.kind.as_str()).collect();
        let kind = match kinds.as_slice() {
            [] => "-".to_string(),
            [a, b] if a != b => format!("{a}/{b}"),
            [a, ..] => a.to_string(),
        };
        let _ = writeln!(
            s,
            "{:<w$} {:<10} {:<9} {:>8} {:>10} {:>10} {:>10} {:>8}  {:<15} {:<14} {:?}{}",
            n.node,
            n.mode.as_str(),
            n.kubernetes_version.as_deref().unwrap_or("-"),
            count_text(n.sync_samples),
            q(n.sync_p99),
            q(n.network_programming_p99),
            secs(n.propagation_window_seconds),
            n.stale_seconds.map_or("-".into(), |v| format!("{v:.1}s")),
            format!("{:?}", n.basis),
            kind,
            n.interval,
            if n.sync_from_legacy_microseconds { " (legacy microsecond histogram, converted)" } else { "" }
        );
    }
}

/// The worst node's W, the recommendation with its arithmetic, and the share of removal
/// windows the sleep covers.
fn render_recommendation(s: &mut String, r: &AnalysisReport) {
    let _ = writeln!(
        s,
        "Worst node: {}  window W = {}{}  (W = max(p99 of a removal's window from the sync histogram and minSyncPeriod {}s [{}], NP p99 - 1s))",
        r.worst_node.as_deref().unwrap_or("-"),
        secs(r.propagation_window_seconds),
        r.histogram_kind.map_or(String::new(), |k| format!(" from {} histograms", k.as_str())),
        r.min_sync_period_seconds,
        r.min_sync_period_source
    );
    let rec = &r.recommendation;
    let basis = match rec.reason {
        Basis::Measured => "Measured",
        Basis::LowSampleCount => "LowSampleCount",
        Basis::BeyondTopBucket => "BeyondTopBucket",
        Basis::NoData => "NoData",
    };
    let _ = writeln!(
        s,
        "Recommendation ({basis}): preStop sleep {} s, terminationGracePeriodSeconds {} s",
        rec.pre_stop_seconds, rec.termination_grace_period_seconds
    );
    let _ = writeln!(s, "  {}", rec.arithmetic);
    if let Some(c) = &r.coverage {
        let lowest =
            if c.nodes > 1 { format!("; lowest {} on {}", crate::core::analysis::coverage_percent(c.lowest_node_ratio), c.lowest_node) } else { String::new() };
        let _ = writeln!(
            s,
            "  coverage {} of removal windows within {} s ({} node{}{lowest})",
            crate::core::analysis::coverage_percent(c.ratio),
            c.pre_stop_seconds,
            c.nodes,
            if c.nodes == 1 { "" } else { "s" }
        );
    }
}
