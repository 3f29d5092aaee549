//! `safe-termination analyze` as a user runs it: the built binary on the shared scrapes
//! (tests/data/metrics), the example policies in config/, files, stdin, NODE= prefixes, two
//! scrapes of one node, and kube-proxy metrics URLs served by a small local HTTP server.
//!
//! Exit codes: 0 success, 1 bad input (the message names the file, family and line), 2 usage.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const V1_29: &str = "tests/data/metrics/kube-proxy-v1.29-iptables-excerpt.txt";
const V1_13: &str = "tests/data/metrics/kube-proxy-v1.13-legacy-microseconds.txt";
const V1_8: &str = "tests/data/metrics/kube-proxy-v1.8-legacy-nan-excerpt.txt";
const TRUNCATED: &str = "tests/data/metrics/kube-proxy-windows-truncated.txt";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_safe-termination"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c.env_remove("RUST_LOG");
    c
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn finish(out: Output) -> Run {
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn run(args: &[&str]) -> Run {
    finish(bin().args(args).output().expect("run the binary"))
}

/// Runs `analyze --output json ARGS`, asserts exit 0 and returns the document.
fn json(args: &[&str]) -> Value {
    let mut all = vec!["analyze", "--output", "json"];
    all.extend_from_slice(args);
    let r = run(&all);
    assert_eq!(r.code, 0, "analyze {args:?} failed: {}", r.stderr);
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.stdout))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[track_caller]
fn approx(actual: f64, expected: f64) {
    support::approx(actual, expected, 1e-9);
}

/// W, the p99 of the window distribution (src/core/window_distribution.rs), found by bisection to
/// 1e-6 s; the expected values come from an independent implementation of the same model,
/// tests/reference/window_distribution_reference.py.
#[track_caller]
fn approx_window(actual: f64, expected: f64) {
    support::approx(actual, expected, 1e-5);
}

fn reasons(doc: &Value) -> Vec<String> {
    doc["advice"].as_array().unwrap().iter().map(|a| a["reason"].as_str().unwrap().to_string()).collect()
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A later scrape of the v1.29 kube-proxy: 100 more syncs, all in (0.128, 0.256].
fn v1_29_later() -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(V1_29)).unwrap();
    let sync = "kubeproxy_sync_proxy_rules_duration_seconds";
    text.lines()
        .map(|line| {
            let bump = |n: &str| (n.parse::<u64>().unwrap() + 100).to_string();
            if let Some(rest) = line.strip_prefix(&format!("{sync}_bucket{{le=\"")) {
                let (le, n) = rest.split_once("\"} ").unwrap();
                let big = le == "+Inf" || le.parse::<f64>().unwrap() >= 0.256;
                format!("{sync}_bucket{{le=\"{le}\"}} {}\n", if big { bump(n) } else { n.to_string() })
            } else if let Some(n) = line.strip_prefix(&format!("{sync}_count ")) {
                format!("{sync}_count {}\n", bump(n))
            } else {
                format!("{line}\n")
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// the shared scrapes

#[test]
fn v1_29_json_report() {
    let doc = json(&[V1_29]);
    assert_eq!(doc["interval"], "lifetime");
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n["node"], "kube-proxy-v1.29-iptables-excerpt"); // named after the file
    assert_eq!(n["interval"], "lifetime");
    assert_eq!(n["mode"], "iptables");
    assert_eq!(n["modeSource"], "metric families");
    assert_eq!(n["kubernetesVersion"], "v1.29.0");
    assert_eq!(f(&n["syncSamples"]), 4.0);
    approx(f(&n["syncP99"]["seconds"]), 0.12672);
    assert_eq!(n["syncP99"]["beyondTopBucket"], false);
    approx(f(&n["networkProgrammingP99"]["seconds"]), 4.98);
    assert_eq!(n["basis"], "LowSampleCount");
    assert_eq!(f(&n["iptablesRulesTotal"]), 38.0);

    assert_eq!(doc["worstNode"], "kube-proxy-v1.29-iptables-excerpt");
    approx(f(&doc["syncP99Seconds"]), 0.12672);
    approx(f(&doc["networkProgrammingP99Seconds"]), 4.98);
    // W = max(the window p99 of the 4 syncs with minSyncPeriod 1 s = 1.154 s, NP p99 4.98 - 1 s
    // trigger-time resolution) = 3.98
    approx(f(&doc["propagationWindowSeconds"]), 3.98);
    assert_eq!(f(&doc["minSyncPeriodSeconds"]), 1.0);
    assert_eq!(doc["minSyncPeriodSource"], "default");
    let rec = &doc["recommendation"];
    assert_eq!(rec["preStopSeconds"], 10);
    assert_eq!(rec["terminationGracePeriodSeconds"], 40);
    assert_eq!(rec["reason"], "LowSampleCount");
    assert!(rec["arithmetic"].as_str().unwrap().contains("ceil(3.980 s x 1.25 + 0 s) = 5 s"));
    assert_eq!(doc["proxy"]["mode"], "iptables");
    assert_eq!(doc["proxy"]["actualRules"], 38);
    assert_eq!(doc["proxy"]["services"], Value::Null);
    assert_eq!(reasons(&doc), ["LowSampleCount"]);
    let a = &doc["advice"][0];
    assert_eq!(a["severity"], "Info");
    assert_eq!(a["threshold"], "samples < 5");
    assert!(a["message"].as_str().unwrap().contains("only 4 syncs in the analysed interval"), "{a}");
}

/// The JSON keys are exactly the schema documented in README.md ("JSON output").
#[test]
fn json_keys_are_the_documented_schema() {
    let doc = json(&["--services", "1000", "--endpoints", "20", V1_29]);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(&doc),
        [
            "advice",
            "coverage",
            "histogramKind",
            "interval",
            "minSyncPeriodSeconds",
            "minSyncPeriodSource",
            "networkProgrammingP99Seconds",
            "nodes",
            "propagationWindowSeconds",
            "proxy",
            "recommendation",
            "syncP99Seconds",
            "worstNode"
        ]
    );
    assert_eq!(keys(&doc["coverage"]), ["lowestNode", "lowestNodeRatio", "nodes", "preStopSeconds", "ratio"]);
    // 10 s covers every window of these 4 syncs (at most 1 s + 2 x 0.128 s) and every network
    // programming observation (at most 5 s)
    assert_eq!(doc["coverage"]["ratio"], 1.0);
    assert_eq!(doc["coverage"]["preStopSeconds"], 10);
    assert_eq!(
        keys(&doc["nodes"][0]),
        [
            "basis",
            "histogramKind",
            "interval",
            "iptablesRulesTotal",
            "kubernetesVersion",
            "mode",
            "modeSource",
            "networkProgrammingP99",
            "node",
            "propagationWindowSeconds",
            "staleSeconds",
            "syncFromLegacyMicroseconds",
            "syncP99",
            "syncSamples"
        ]
    );
    assert_eq!(keys(&doc["nodes"][0]["syncP99"]), ["beyondTopBucket", "kind", "samples", "seconds"]);
    // a text scrape carries classic buckets only
    assert_eq!(doc["histogramKind"], "classic");
    assert_eq!(doc["nodes"][0]["syncP99"]["kind"], "classic");
    assert_eq!(keys(&doc["recommendation"]), ["arithmetic", "preStopSeconds", "reason", "terminationGracePeriodSeconds"]);
    assert_eq!(keys(&doc["proxy"]), ["actualRules", "endpoints", "estimatedRules", "mode", "services"]);
    assert_eq!(doc["proxy"]["estimatedRules"], 2 * 1000 + 2 * 20);
    // per-node advice carries `node`; cluster-wide advice carries `to` instead
    let migrate = doc["advice"].as_array().unwrap().iter().find(|a| a["reason"] == "MigrateProxyMode").unwrap();
    assert_eq!(keys(migrate), ["message", "reason", "severity", "threshold", "to"]);
    assert_eq!(migrate["to"], "nftables");
    let low = doc["advice"].as_array().unwrap().iter().find(|a| a["reason"] == "LowSampleCount").unwrap();
    assert_eq!(keys(low), ["message", "node", "reason", "severity", "threshold"]);
}

#[test]
fn v1_13_microseconds_json_with_null_network_programming() {
    let doc = json(&[V1_13]);
    let p99 = (32000.0 + 32000.0 * (2642.31 - 2534.0) / 126.0) * 1e-6;
    approx(f(&doc["syncP99Seconds"]), p99);
    assert!(f(&doc["syncP99Seconds"]) < 0.1);
    assert_eq!(doc["networkProgrammingP99Seconds"], Value::Null);
    assert_eq!(doc["nodes"][0]["networkProgrammingP99"], Value::Null);
    assert_eq!(doc["nodes"][0]["syncFromLegacyMicroseconds"], true);
    assert_eq!(doc["nodes"][0]["mode"], "unknown");
    assert_eq!(doc["nodes"][0]["kubernetesVersion"], "v1.13.4");
    assert_eq!(doc["nodes"][0]["staleSeconds"], Value::Null);
    assert_eq!(doc["nodes"][0]["iptablesRulesTotal"], Value::Null);
    assert_eq!(doc["recommendation"]["preStopSeconds"], 3);
    assert_eq!(doc["recommendation"]["terminationGracePeriodSeconds"], 33);
    assert_eq!(doc["recommendation"]["reason"], "Measured");
    assert_eq!(doc["advice"], Value::Array(vec![]));
    assert_eq!(doc["proxy"]["actualRules"], Value::Null);
}

#[test]
fn v1_8_nan_file_analyses() {
    let doc = json(&[V1_8]);
    approx(f(&doc["syncP99Seconds"]), 0.24288);
    assert_eq!(doc["recommendation"]["preStopSeconds"], 3);
}

#[test]
fn text_report_shows_table_arithmetic_and_advice() {
    let r = run(&["analyze", V1_29]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let out = r.stdout;
    assert!(out.starts_with("Interval: since each kube-proxy started"), "{out}");
    for col in ["NODE", "MODE", "VERSION", "SAMPLES", "SYNC_P99", "NP_P99", "WINDOW", "STALE", "BASIS", "HISTOGRAM"] {
        assert!(out.contains(col), "missing column {col}: {out}");
    }
    let row = out.lines().find(|l| l.starts_with("kube-proxy-v1.29-iptables-excerpt")).expect("node row");
    for cell in ["iptables", "v1.29.0", "0.127s", "4.980s", "3.980s", "LowSampleCount", "classic", "Lifetime"] {
        assert!(row.contains(cell), "missing {cell} in {row:?}");
    }
    // columns stay aligned with a node name longer than the default column width
    let header = out.lines().find(|l| l.starts_with("NODE")).unwrap();
    assert_eq!(header.find("MODE"), row.find(" iptables ").map(|i| i + 1), "\n{header}\n{row}");
    assert_eq!(header.find("BASIS"), row.find("LowSampleCount"), "\n{header}\n{row}");
    assert!(out.contains("Worst node: kube-proxy-v1.29-iptables-excerpt  window W = 3.980s from classic histograms  (W = max(p99 of a removal's window from the sync histogram and minSyncPeriod 1s [default], NP p99 - 1s))"), "{out}");
    assert!(out.contains("Recommendation (LowSampleCount): preStop sleep 10 s, terminationGracePeriodSeconds 40 s"), "{out}");
    assert!(out.contains("grace = max(30 s default, min(10 + 30 s, 600 s), 10 s) = 40 s"), "{out}");
    assert!(out.contains("Proxy: mode iptables") && out.contains("actual rules 38"), "{out}");
    assert!(out.contains("- LowSampleCount [Info] (samples < 5)"), "{out}");
    // YAML output carries the same document
    let r = run(&["analyze", "-o", "yaml", V1_29]);
    assert_eq!(r.code, 0);
    let yaml: Value = serde_saphyr::from_str(&r.stdout).unwrap();
    assert_eq!(yaml["recommendation"]["preStopSeconds"], 10);
}

// ---------------------------------------------------------------------------------------------
// errors and exit codes

#[test]
fn truncated_scrape_exits_1_naming_file_family_and_line() {
    let r = run(&["analyze", TRUNCATED]);
    assert_eq!(r.code, 1);
    assert_eq!(r.stdout, "");
    assert!(r.stderr.contains(&format!("{TRUNCATED}:17:")), "{}", r.stderr);
    assert!(r.stderr.contains("kubeproxy_sync_proxy_rules_duration_seconds"), "{}", r.stderr);
    assert!(r.stderr.contains("cut off"), "{}", r.stderr);
    // a good file beside it does not hide the error
    let r = run(&["analyze", "--output", "json", V1_29, TRUNCATED]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains(TRUNCATED));
}

/// A scrape cut inside a family we do not read loses every family after it: exit 1 naming the
/// file, line and family (it was "NoData", exit 0). A valid scrape that simply has no kube-proxy
/// family is still analysed as NoData.
#[test]
fn scrape_cut_inside_an_unrelated_family_exits_1() {
    let dir = tmp();
    let full = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(V1_13)).unwrap();
    let at = full.find("go_gc_duration_seconds{quantile=\"0.25\"}").unwrap() + "go_gc_duration_seconds{quantile=\"0.2".len();
    let cut = write(dir.path(), "cut.txt", &full[..at]);
    let r = run(&["analyze", cut.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.stdout, "");
    assert_eq!(
        r.stderr,
        format!(
            "error: {}:10: go_gc_duration_seconds: label quantile value is cut off (no closing quote), and the last line has no terminating line feed: the scrape was cut off\n",
            cut.display()
        )
    );

    let garbled = write(dir.path(), "garbled.txt", &full.replacen("# HELP go_goroutines", "  # HELP go_goroutines\n   !!", 1));
    let r = run(&["analyze", garbled.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.stderr, format!("error: {}:17: expected a metric name or a comment, found '!'\n", garbled.display()));

    let unrelated: String = full.split_inclusive('\n').take(18).collect();
    let unrelated = write(dir.path(), "go-only.txt", &unrelated);
    let doc = json(&[unrelated.to_str().unwrap()]);
    assert_eq!(doc["recommendation"]["reason"], "NoData");
    assert_eq!(doc["recommendation"]["preStopSeconds"], 10);
}

/// Bytes that are not UTF-8: exit 1 naming the file, the line and the byte offset.
#[test]
fn non_utf8_scrape_exits_1_naming_file_line_and_offset() {
    let dir = tmp();
    let mut bytes = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(V1_29)).unwrap();
    let line3 = bytes.iter().enumerate().filter(|(_, b)| **b == b'\n').nth(1).unwrap().0 + 1;
    bytes[line3 + 5] = 0xff;
    let bad = dir.path().join("latin1.txt");
    std::fs::write(&bad, &bytes).unwrap();
    let r = run(&["analyze", bad.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.stderr, format!("error: {}:3: invalid UTF-8 at byte offset {} (byte 6 of line 3): the input must be UTF-8 text\n", bad.display(), line3 + 5));
    // the same on standard input
    let mut child = bin().args(["analyze", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let r = finish(child.wait_with_output().unwrap());
    assert_eq!(r.code, 1);
    assert!(r.stderr.starts_with(&format!("error: <stdin>:3: invalid UTF-8 at byte offset {}", line3 + 5)), "{}", r.stderr);
}

#[test]
fn unreadable_input_exits_1() {
    let r = run(&["analyze", "tests/data/metrics/no-such-file.txt"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("no-such-file.txt"), "{}", r.stderr);
}

/// A bad --kubernetes-version is a usage error (exit 2) found at argument parsing: it used to
/// exit 1, and only after every URL had been fetched (a hanging URL delayed it to the timeout).
#[test]
fn a_bad_kubernetes_version_is_a_usage_error_before_any_fetch() {
    // accepts connections (the kernel backlog) and never answers
    let hanging = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metrics", hanging.local_addr().unwrap());
    let start = std::time::Instant::now();
    let r = run(&["analyze", "--timeout-seconds", "30", "--kubernetes-version", "latest", &url]);
    let took = start.elapsed();
    assert_eq!((r.code, r.stdout.as_str()), (2, ""), "{}", r.stderr);
    assert_eq!(
        r.stderr.lines().next(),
        Some(
            "error: invalid value 'latest' for '--kubernetes-version <KUBERNETES_VERSION>': expected a Kubernetes version like v1.33.2 or 1.33 (MAJOR.MINOR, optional v prefix, patch and suffix)"
        )
    );
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    drop(hanging);
    // the accepted forms still reach the advisor
    for (v, note) in [
        ("1.30", " This cluster runs 1.30, where nftables is alpha: upgrade to 1.33+ first."),
        ("v1.32.1", " This cluster runs 1.32, where nftables is beta: 1.33+ is recommended."),
        ("v1.35.2-eks-1234", ""),
    ] {
        let doc = json(&["--mode", "ipvs", "--kubernetes-version", v, V1_29]);
        let m = doc["advice"].as_array().unwrap().iter().find(|a| a["reason"] == "MigrateProxyMode").expect("IPVS advice");
        assert!(m["message"].as_str().unwrap().ends_with(&format!("at large scale.{note}")), "{v}: {}", m["message"]);
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["analyze", "--no-such-flag", V1_29][..],
        &["analyze"][..],
        &["analyze", "--mode", "userspace", V1_29][..],
        &["analyze", "--output", "xml", V1_29][..],
        &["analyze", "--services", "many", V1_29][..],
        &["analyze", "--min-sync-period-seconds", "NaN", V1_29][..],
        &["no-such-command"][..],
    ] {
        let r = run(args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(!r.stderr.is_empty());
        assert_eq!(r.stdout, "");
    }
}

/// NaN, infinite, negative and absurd values of number and duration flags are usage errors
/// (exit 2) naming the flag and the accepted range, in every command; they used to be accepted
/// (a NaN threshold silently disabled its advice).
#[test]
fn out_of_range_flag_values_exit_2_naming_flag_and_range() {
    let cases: [(&[&str], &str); 21] = [
        (
            &["analyze", "--max-body-bytes", "100", V1_29],
            "invalid value '100' for '--max-body-bytes <MAX_BODY_BYTES>': expected a whole number of bytes from 1024 to 1073741824",
        ),
        (
            &["analyze", "--max-body-bytes", "-1", V1_29],
            "invalid value '-1' for '--max-body-bytes <MAX_BODY_BYTES>': expected a whole number of bytes from 1024 to 1073741824",
        ),
        (&["analyze", "--services", "NaN", V1_29], "invalid value 'NaN' for '--services <SERVICES>': expected a whole number of Services from 0 to 100000000"),
        (
            &["analyze", "--endpoints", "-1", V1_29],
            "invalid value '-1' for '--endpoints <ENDPOINTS>': expected a whole number of endpoints from 0 to 100000000",
        ),
        (
            &["analyze", "--iptables-services-threshold", "0", V1_29],
            "invalid value '0' for '--iptables-services-threshold <IPTABLES_SERVICES_THRESHOLD>': expected a whole number of Services from 1 to 100000000",
        ),
        (
            &["analyze", "--sync-slow-seconds", "NaN", V1_29],
            "invalid value 'NaN' for '--sync-slow-seconds <SYNC_SLOW_SECONDS>': expected a number of seconds above 0 and at most 3600",
        ),
        (
            &["analyze", "--sync-slow-seconds", "-1", V1_29],
            "invalid value '-1' for '--sync-slow-seconds <SYNC_SLOW_SECONDS>': expected a number of seconds above 0 and at most 3600",
        ),
        (
            &["analyze", "--sync-slow-seconds=0", V1_29],
            "invalid value '0' for '--sync-slow-seconds <SYNC_SLOW_SECONDS>': expected a number of seconds above 0 and at most 3600",
        ),
        (
            &["analyze", "--stale-seconds", "inf", V1_29],
            "invalid value 'inf' for '--stale-seconds <STALE_SECONDS>': expected a number of seconds above 0 and at most 86400",
        ),
        (
            &["analyze", "--min-sync-period-seconds", "1e9", V1_29],
            "invalid value '1e9' for '--min-sync-period-seconds <MIN_SYNC_PERIOD_SECONDS>': expected a number of seconds from 0 to 300",
        ),
        (
            &["analyze", "--min-sync-period-seconds", "-0.5", V1_29],
            "invalid value '-0.5' for '--min-sync-period-seconds <MIN_SYNC_PERIOD_SECONDS>': expected a number of seconds from 0 to 300",
        ),
        (&["analyze", "--conntrack-usage", "1.5", V1_29], "invalid value '1.5' for '--conntrack-usage <CONNTRACK_USAGE>': expected a ratio from 0 to 1"),
        (
            &["analyze", "--timeout-seconds", "0", V1_29],
            "invalid value '0' for '--timeout-seconds <TIMEOUT_SECONDS>': expected a whole number of seconds from 1 to 3600",
        ),
        (
            &["analyze", "--timeout-seconds", "-3", V1_29],
            "invalid value '-3' for '--timeout-seconds <TIMEOUT_SECONDS>': expected a whole number of seconds from 1 to 3600",
        ),
        (
            &["run", "--scrape-interval-seconds", "0"],
            "invalid value '0' for '--scrape-interval-seconds <SCRAPE_INTERVAL_SECONDS>': expected a whole number of seconds from 1 to 3600",
        ),
        (&["run", "--window-seconds", "5"], "invalid value '5' for '--window-seconds <WINDOW_SECONDS>': expected a whole number of seconds from 60 to 86400"),
        (
            &["run", "--stale-seconds", "NaN"],
            "invalid value 'NaN' for '--stale-seconds <STALE_SECONDS>': expected a number of seconds above 0 and at most 86400",
        ),
        (&["run", "--drain-seconds", "-1"], "invalid value '-1' for '--drain-seconds <DRAIN_SECONDS>': expected a whole number of seconds from 0 to 3600"),
        (
            &["webhook", "--request-timeout-ms", "60000"],
            "invalid value '60000' for '--request-timeout-ms <REQUEST_TIMEOUT_MS>': expected a whole number of milliseconds from 1 to 30000",
        ),
        (
            &["webhook", "--pre-stop-seconds", "-5"],
            "invalid value '-5' for '--pre-stop-seconds <PRE_STOP_SECONDS>': expected a whole number of seconds from 0 to 3600",
        ),
        (
            &["mutate", "--pre-stop-seconds", "99999", "tests/data/pods/hostnetwork-deployment.yaml"],
            "invalid value '99999' for '--pre-stop-seconds <PRE_STOP_SECONDS>': expected a whole number of seconds from 0 to 3600",
        ),
    ];
    for (args, message) in cases {
        let r = run(args);
        assert_eq!((r.code, r.stdout.as_str()), (2, ""), "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().next(), Some(format!("error: {message}").as_str()), "{args:?}");
    }
    // the same check for a value from the environment
    let r = finish(bin().args(["run"]).env("SAFE_TERMINATION_SYNC_SLOW_SECONDS", "NaN").output().unwrap());
    assert_eq!(r.code, 2);
    assert_eq!(
        r.stderr.lines().next(),
        Some("error: invalid value 'NaN' for '--sync-slow-seconds <SYNC_SLOW_SECONDS>': expected a number of seconds above 0 and at most 3600")
    );
    // the bounds themselves are accepted
    let doc = json(&["--sync-slow-seconds", "3600", "--stale-seconds", "0.5", "--min-sync-period-seconds", "0", "--conntrack-usage", "1", V1_29]);
    assert_eq!(doc["minSyncPeriodSeconds"], 0.0);
}

// ---------------------------------------------------------------------------------------------
// flags

#[test]
fn flags_feed_the_advisor_and_the_model() {
    // --mode overrides inference; IPVS is flagged at any size
    let doc = json(&["--mode", "ipvs", "--services", "1", V1_29]);
    assert_eq!(doc["nodes"][0]["mode"], "ipvs");
    assert_eq!(doc["nodes"][0]["modeSource"], "flag");
    let m = doc["advice"].as_array().unwrap().iter().find(|a| a["reason"] == "MigrateProxyMode").expect("IPVS advice");
    assert_eq!(m["to"], "nftables");
    // iptables at 999 / 1000 Services
    assert!(!reasons(&json(&["--services", "999", V1_29])).contains(&"MigrateProxyMode".to_string()));
    assert!(reasons(&json(&["--services", "1000", V1_29])).contains(&"MigrateProxyMode".to_string()));
    // thresholds are flags too
    assert!(reasons(&json(&["--services", "500", "--iptables-services-threshold", "500", V1_29])).contains(&"MigrateProxyMode".to_string()));
    // minSyncPeriod 5 s: the window p99 of the same 4 syncs, above NP p99 4.98 - 1 s
    let doc = json(&["--min-sync-period-seconds", "5", V1_29]);
    approx_window(f(&doc["propagationWindowSeconds"]), 5.085527);
    assert_eq!(doc["minSyncPeriodSource"], "flag");
    // --kubernetes-version overrides kubernetes_build_info in the nftables note
    let doc = json(&["--services", "1000", "--kubernetes-version", "v1.31.4", V1_29]);
    let m = doc["advice"].as_array().unwrap().iter().find(|a| a["reason"] == "MigrateProxyMode").unwrap();
    assert!(m["message"].as_str().unwrap().contains("1.31, where nftables is beta"), "{m}");
}

/// kubeadm's `config.conf` before 1.37 (tests/data/SOURCES.md): `mode: ""`, every duration `0s`.
const KUBEADM_CONFIG: &str = "tests/data/kube-proxy-config/kubeadm-1.31-config.conf";

/// The text of the advice for a mode left to kube-proxy's default, on the v1.29 scrape (its
/// `kubernetes_build_info` says 1.29, hence the last sentence).
const DEFAULTED_ADVICE: &str = "- ProxyModeDefaulted [Info] (mode empty in kube-proxy's configuration, Kubernetes < 1.40): kube-proxy's configuration leaves `mode` empty, so kube-proxy runs its default, iptables; from Kubernetes 1.40 the default is nftables (KEP-5343), so these nodes change mode at that upgrade unless `mode` is set (kube-proxy 1.37+ warns at start, event KubeProxyDefaultMode). Set `mode` explicitly: `mode: nftables`, the migration target (nftables mode (GA in Kubernetes 1.33, needs kernel 5.13+ on every node)), or `mode: iptables` to keep today's mode through the upgrade. Not `mode: ipvs`: deprecated since 1.35, 1.40 turns it off by default (kube-proxy then exits in ipvs mode unless the KubeProxyIPVS feature gate is enabled) and 1.43 removes it (KEP-5495). This cluster runs 1.29, where nftables is alpha: upgrade to 1.33+ first.";

/// A saved `config.conf` that leaves `mode` empty: `analyze` prints the advice to set it, and
/// takes the file's minSyncPeriod (0s, kube-proxy's 1 s) with the file named as its source.
#[test]
fn a_kube_proxy_config_with_an_empty_mode_gets_the_advice_to_set_it() {
    let r = run(&["analyze", "--kube-proxy-config", KUBEADM_CONFIG, V1_29]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.lines().any(|l| l == DEFAULTED_ADVICE), "{}", r.stdout);
    assert!(r.stdout.contains(&format!("minSyncPeriod 1s [KubeProxyConfiguration {KUBEADM_CONFIG}]")), "{}", r.stdout);
    let doc = json(&["--kube-proxy-config", KUBEADM_CONFIG, V1_29]);
    let a = doc["advice"].as_array().unwrap().iter().find(|a| a["reason"] == "ProxyModeDefaulted").expect("the advice");
    assert_eq!((a["severity"].as_str(), a["to"].as_str()), (Some("Info"), Some("nftables")));
    assert_eq!(doc["minSyncPeriodSource"], format!("KubeProxyConfiguration {KUBEADM_CONFIG}"));
    approx(f(&doc["minSyncPeriodSeconds"]), 1.0);
}

/// The same file with `mode: iptables` (what kubeadm 1.37 writes), and a saved `/configz` (whose
/// mode kube-proxy has already defaulted, so it cannot say): no such advice.
#[test]
fn a_kube_proxy_config_that_sets_the_mode_or_a_configz_gets_no_such_advice() {
    let dir = tmp();
    let kubeadm = std::fs::read_to_string(KUBEADM_CONFIG).unwrap();
    assert_eq!(kubeadm.matches("\nmode: \"\"\n").count(), 1);
    let explicit = write(dir.path(), "config.conf", &kubeadm.replace("\nmode: \"\"\n", "\nmode: iptables\n"));
    let configz = write(
        dir.path(),
        "configz.json",
        r#"{"kubeproxy.config.k8s.io":{"Mode":"iptables","MetricsBindAddress":"0.0.0.0:10249","SyncPeriod":"30s","MinSyncPeriod":"2s","ConfigSyncPeriod":"15m0s"}}"#,
    );
    for file in [&explicit, &configz] {
        let r = run(&["analyze", "--kube-proxy-config", file.to_str().unwrap(), V1_29]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert!(!r.stdout.contains("ProxyModeDefaulted"), "{}", r.stdout);
        assert!(!r.stdout.contains("mode` empty"), "{}", r.stdout);
    }
    let doc = json(&["--kube-proxy-config", configz.to_str().unwrap(), V1_29]);
    assert_eq!(doc["minSyncPeriodSource"], format!("configz {}", configz.display()));
    approx(f(&doc["minSyncPeriodSeconds"]), 2.0);
    // --min-sync-period-seconds still wins over the file's
    let doc = json(&["--kube-proxy-config", configz.to_str().unwrap(), "--min-sync-period-seconds", "3", V1_29]);
    assert_eq!((doc["minSyncPeriodSource"].as_str(), doc["minSyncPeriodSeconds"].as_f64()), (Some("flag"), Some(3.0)));
    // a file that is neither form: exit 1 naming it and the field
    let bad = write(dir.path(), "bad.conf", "mode: userspace\n");
    let r = run(&["analyze", "--kube-proxy-config", bad.to_str().unwrap(), V1_29]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains(&format!("{}: mode \"userspace\" is not iptables, ipvs, nftables or kernelspace", bad.display())), "{}", r.stderr);
}

// ---------------------------------------------------------------------------------------------
// --policy and the examples in config/

#[test]
fn example_policies_size_the_recommendation() {
    // the default example spells out the defaults: identical to no policy
    let none = json(&[V1_29]);
    let default = json(&["--policy", "config/terminationpolicy-default.yaml", V1_29]);
    assert_eq!(default["recommendation"], none["recommendation"]);
    let default13 = json(&["--policy", "config/terminationpolicy-default.yaml", V1_13]);
    assert_eq!(default13["recommendation"], json(&[V1_13])["recommendation"]);

    // NLB path: extraSeconds 90, default 100, bounds [10, 180]
    let doc = json(&["--policy", "config/terminationpolicy-ingress.yaml", V1_29]);
    // LowSampleCount: max(default 100, ceil(3.98 x 1.25 + 90 = 94.975) = 95) = 100; grace 100 + 30
    assert_eq!(doc["recommendation"]["preStopSeconds"], 100);
    assert_eq!(doc["recommendation"]["terminationGracePeriodSeconds"], 130);
    let doc = json(&["--policy", "config/terminationpolicy-ingress.yaml", V1_13]);
    // Measured: ceil(1.119 x 1.25 + 90 = 91.399) = 92
    assert_eq!(doc["recommendation"]["preStopSeconds"], 92);
    assert_eq!(doc["recommendation"]["terminationGracePeriodSeconds"], 122);
    assert!(doc["recommendation"]["arithmetic"].as_str().unwrap().contains("+ 90 s"));

    // audit changes what the webhook does, not the sizing
    let doc = json(&["--policy", "config/terminationpolicy-audit.yaml", V1_29]);
    assert_eq!(doc["recommendation"], none["recommendation"]);
}

/// Every field the examples set exists in the CRD schema (serde would silently ignore a typo),
/// and every example passes the spec validation.
#[test]
fn example_policies_only_use_schema_fields() {
    let crd: Value = serde_saphyr::from_str(&safe_termination::core::crd::crd_yaml()).unwrap();
    let spec_schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    fn check(path: &str, value: &Value, schema: &Value) {
        let Some(obj) = value.as_object() else { return };
        let Some(props) = schema["properties"].as_object() else {
            return; // free-form map (matchLabels)
        };
        for (k, v) in obj {
            let sub = props.get(k).unwrap_or_else(|| panic!("{path}.{k} is not in the CRD schema"));
            check(&format!("{path}.{k}"), v, sub);
        }
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("terminationpolicy-") {
            continue;
        }
        let doc: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["apiVersion"], "safetermination.io/v1alpha1", "{name}");
        assert_eq!(doc["kind"], "TerminationPolicy", "{name}");
        assert!(doc["metadata"]["name"].is_string(), "{name}");
        check(&format!("{name}: spec"), &doc["spec"], spec_schema);
        safe_termination::cli::load_policy_spec(path.to_str().unwrap()).unwrap_or_else(|e| panic!("{e}"));
        seen += 1;
    }
    assert!(seen >= 3, "expected the default, ingress and audit examples in config/");
}

#[test]
fn the_default_example_spells_out_every_field_with_a_comment() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/terminationpolicy-default.yaml")).unwrap();
    let doc: Value = serde_saphyr::from_str(&text).unwrap();
    let spec: safe_termination::core::crd::TerminationPolicySpec = serde_json::from_value(doc["spec"].clone()).unwrap();
    let defaults = safe_termination::core::crd::TerminationPolicySpec::default();
    assert_eq!(spec.pre_stop, defaults.pre_stop);
    assert_eq!(spec.grace, defaults.grace);
    assert_eq!(spec.mode, defaults.mode);
    assert_eq!(spec.scope, defaults.scope);
    // every spec field of the Rust type appears in the file, each preceded by a comment line
    let full = serde_json::to_value(&defaults).unwrap();
    let mut fields: Vec<String> = full.as_object().unwrap().keys().cloned().collect();
    fields.push("podSelector".into());
    for section in ["preStop", "grace"] {
        fields.extend(full[section].as_object().unwrap().keys().cloned());
    }
    let lines: Vec<&str> = text.lines().collect();
    for field in fields {
        let i = lines
            .iter()
            .position(|l| l.trim_start().starts_with(&format!("{field}:")))
            .unwrap_or_else(|| panic!("{field} missing from config/terminationpolicy-default.yaml"));
        if !["preStop", "grace"].contains(&field.as_str()) {
            assert!(lines[i - 1].trim_start().starts_with('#'), "{field} has no comment above it");
        }
    }
}

#[test]
fn bad_policies_exit_1_naming_the_field() {
    let dir = tmp();
    let bad = write(
        dir.path(),
        "bad.yaml",
        "apiVersion: safetermination.io/v1alpha1\nkind: TerminationPolicy\nmetadata:\n  name: bad\nspec:\n  preStop:\n    minSeconds: 90\n    maxSeconds: 30\n    defaultSeconds: 30\n",
    );
    let r = run(&["analyze", "--policy", bad.to_str().unwrap(), V1_29]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("spec.preStop.minSeconds (90) is above maxSeconds (30)"), "{}", r.stderr);
    assert!(r.stderr.contains("bad.yaml"), "{}", r.stderr);

    // each policy file refused with exit 1 and a message naming the file and what is wrong
    // (a type error names its field; several documents are refused with what to do)
    for (file, text, want) in [
        ("pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n", "expected kind TerminationPolicy"),
        (
            "t.yaml",
            "kind: TerminationPolicy\nspec:\n  preStop:\n    safetyFactor: lots\n",
            "t.yaml: invalid spec: spec.preStop.safetyFactor: invalid type: string \"lots\"",
        ),
        (
            "n.yaml",
            "kind: TerminationPolicy\nspec:\n  preStop:\n    minSeconds: -5\n",
            "n.yaml: invalid spec: spec.preStop.minSeconds: invalid value: integer `-5`, expected u32",
        ),
        ("two.yaml", "---\n---\n", "two.yaml: holds more than one YAML document: give one TerminationPolicy per file"),
    ] {
        let path = write(dir.path(), file, text);
        let r = run(&["analyze", "--policy", path.to_str().unwrap(), V1_29]);
        assert_eq!(r.code, 1, "{file}: {}", r.stderr);
        assert!(r.stderr.contains(want), "{file}: {}", r.stderr);
    }

    let r = run(&["analyze", "--policy", "config/no-such-policy.yaml", V1_29]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("no-such-policy.yaml"), "{}", r.stderr);
}

/// A field the TerminationPolicy schema does not have is refused, naming it (serde used to drop a
/// typo such as `safetyFactr` and size with the default); free-form maps (matchLabels) and a
/// `kubectl get -o yaml` object (metadata, status) stay accepted.
#[test]
fn unknown_policy_fields_exit_1_naming_the_field() {
    let dir = tmp();
    let policy = |name: &str, body: &str| {
        let p = write(dir.path(), name, &format!("apiVersion: safetermination.io/v1alpha1\nkind: TerminationPolicy\nmetadata:\n  name: p\n{body}"));
        p.to_str().unwrap().to_string()
    };
    let pre_stop_fields = "defaultSeconds, execImages, extraSeconds, handler, maxSeconds, minSamples, minSeconds, safetyFactor";
    let cases = [
        (
            policy("typo.yaml", "spec:\n  preStop:\n    safetyFactr: 3\n"),
            format!("unknown field spec.preStop.safetyFactr (known in spec.preStop: {pre_stop_fields})"),
        ),
        (
            policy("top.yaml", "specs:\n  mode: Audit\n"),
            "unknown field specs (known here: apiVersion, kind, metadata, spec, status)".to_string(),
        ),
        (
            policy("two.yaml", "spec:\n  grace:\n    maxSecond: 60\n  podSelector:\n    matchExpressions:\n    - key: app\n      operator: In\n      value: [web]\n"),
            "unknown field spec.grace.maxSecond (known in spec.grace: appShutdownSeconds, maxSeconds); unknown field spec.podSelector.matchExpressions[0].value (known in spec.podSelector.matchExpressions[0]: key, operator, values)".to_string(),
        ),
    ];
    for (path, message) in &cases {
        let r = run(&["analyze", "--policy", path, V1_29]);
        assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{}", r.stderr);
        assert_eq!(r.stderr, format!("error: {path}: {message}\n"));
    }
    // the same check wherever --policy is read
    let r = run(&["mutate", "--policy", &cases[0].0, "tests/data/pods/hostnetwork-deployment.yaml"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.stderr, format!("error: {}: {}\n", cases[0].0, cases[0].1));

    let ok = policy(
        "ok.yaml",
        "  namespace: demo\n  labels: {team: a}\nspec:\n  podSelector:\n    matchLabels: {app: web, any-key: x}\n  preStop:\n    safetyFactor: 2\nstatus:\n  observedGeneration: 1\n  conditions: []\n",
    );
    let doc = json(&["--policy", &ok, V1_29]);
    assert_eq!(doc["recommendation"]["preStopSeconds"], 10); // max(default 10, ceil(3.98 x 2) = 8)
}

// ---------------------------------------------------------------------------------------------
// several nodes, two scrapes of one node, stdin

#[test]
fn node_prefixes_name_the_nodes_and_the_worst_one() {
    let dir = tmp();
    let slow = write(
        dir.path(),
        "slow.txt",
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"2\"} 98\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"2.2\"} 100\nkubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 100\n",
    );
    let doc = json(&[&format!("node-a={V1_13}"), &format!("node-b={}", slow.display()), &format!("node-c={V1_8}")]);
    let names: Vec<&str> = doc["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
    assert_eq!(names, ["node-a", "node-b", "node-c"]);
    assert_eq!(doc["worstNode"], "node-b");
    // 98 syncs in (0, 2], 2 in (2, 2.2], minSyncPeriod 1 s
    approx_window(f(&doc["propagationWindowSeconds"]), 4.295744);
    approx(f(&doc["syncP99Seconds"]), 2.1);
    assert_eq!(doc["recommendation"]["preStopSeconds"], 6); // ceil(4.296 x 1.25 = 5.37)
    let slow_advice = doc["advice"].as_array().unwrap().iter().find(|a| a["reason"] == "ProxySyncSlow").unwrap();
    assert_eq!(slow_advice["node"], "node-b");
}

#[test]
fn two_scrapes_of_one_node_are_analysed_over_the_interval() {
    let dir = tmp();
    let later = write(dir.path(), "later.txt", &v1_29_later());
    let later = later.to_str().unwrap();
    let p99 = 0.128 + 0.128 * 0.99;

    // the same NODE twice: first is earlier
    let doc = json(&[&format!("n1={V1_29}"), &format!("n1={later}")]);
    assert_eq!(doc["interval"], "betweenScrapes");
    assert_eq!(doc["nodes"][0]["interval"], "betweenScrapes");
    assert_eq!(f(&doc["nodes"][0]["syncSamples"]), 100.0);
    approx(f(&doc["syncP99Seconds"]), p99);
    assert_eq!(doc["networkProgrammingP99Seconds"], Value::Null); // none in the interval
    assert_eq!(doc["recommendation"]["reason"], "Measured");
    assert_eq!(doc["recommendation"]["preStopSeconds"], 3);

    // --earlier with a single source
    let doc2 = json(&["--earlier", V1_29, later]);
    assert_eq!(doc2["nodes"][0]["interval"], "betweenScrapes");
    assert_eq!(doc2["recommendation"], doc["recommendation"]);

    // --earlier NODE=FILE among several nodes; the other node stays lifetime
    let doc3 = json(&["--earlier", &format!("n1={V1_29}"), &format!("n1={later}"), &format!("n2={V1_13}")]);
    assert_eq!(doc3["interval"], "mixed");
    assert_eq!(doc3["nodes"][0]["interval"], "betweenScrapes");
    assert_eq!(doc3["nodes"][1]["interval"], "lifetime");

    // swapped: the "later" scrape has lower counts -> a restart, analysed on its own
    let doc4 = json(&["--earlier", later, V1_29]);
    assert_eq!(doc4["nodes"][0]["interval"], "sinceRestart");
    assert_eq!(f(&doc4["nodes"][0]["syncSamples"]), 4.0);

    // an --earlier that pairs with no one node is a usage error (docs/analyze.md: exit 2)
    let r = run(&["analyze", "--earlier", V1_29, &format!("a={later}"), &format!("b={V1_13}")]);
    assert_eq!((r.code, r.stdout.as_str()), (2, ""), "{}", r.stderr);
    assert_eq!(r.stderr, format!("error: --earlier {V1_29}: name the node (NODE=FILE) it belongs to\n"));
    // a node given three times as a source is a usage error (exit 2, as for --earlier)
    let r = run(&["analyze", &format!("n={V1_29}"), &format!("n={later}"), &format!("n={V1_29}")]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("more than twice"), "{}", r.stderr);

    // a named --earlier must name a source's node, with one source as with several (with one it
    // used to pair with whatever the only source was)
    for sources in [&[format!("n1={later}")][..], &[format!("n1={later}"), format!("n2={V1_13}")][..]] {
        let mut args = vec!["analyze".to_string(), "--earlier".into(), format!("other={V1_29}")];
        args.extend_from_slice(sources);
        let r = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!((r.code, r.stdout.as_str()), (2, ""), "{sources:?}: {}", r.stderr);
        let nodes = if sources.len() == 1 { "n1" } else { "n1, n2" };
        assert_eq!(
            r.stderr,
            format!("error: --earlier other={V1_29}: no source is node \"other\" (the nodes are: {nodes}): name the node (NODE=FILE) it belongs to\n")
        );
    }
    // the matching name still pairs with one source
    let doc5 = json(&["--earlier", &format!("n1={V1_29}"), &format!("n1={later}")]);
    assert_eq!(doc5["nodes"][0]["interval"], "betweenScrapes");
    assert_eq!(f(&doc5["nodes"][0]["syncSamples"]), 100.0);
}

/// Names that come from the path (file stem, host:port) never pair two sources: two different
/// nodes' scrapes saved as a/metrics.txt and b/metrics.txt were merged into one node and analysed
/// "between scrapes". Only the same NODE= twice (or --earlier) pairs scrapes.
#[test]
fn colliding_implicit_node_names_exit_1_naming_both_sources() {
    let dir = tmp();
    for sub in ["a", "b"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
    }
    let a = write(&dir.path().join("a"), "metrics.txt", &shared(V1_29));
    let b = write(&dir.path().join("b"), "metrics.txt", &v1_29_later());
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let hint = "(a source without NODE= is named after its file stem or host:port): name each node, e.g. node-a=FILE node-b=FILE; to compare two scrapes of one node, give both the same NODE= (first is earlier) or use --earlier";

    // usage errors (exit 2): the arguments do not fit together, as with --earlier
    let r = run(&["analyze", a, b]);
    assert_eq!((r.code, r.stdout.as_str()), (2, ""), "{}", r.stderr);
    assert_eq!(r.stderr, format!("error: {a} and {b} are both node \"metrics\" {hint}\n"));
    // an implicit name meeting an explicit one, and the same file twice without NODE=
    let r = run(&["analyze", &format!("metrics={a}"), b]);
    assert_eq!(r.code, 2);
    assert_eq!(r.stderr, format!("error: metrics={a} and {b} are both node \"metrics\" {hint}\n"));
    let r = run(&["analyze", V1_29, V1_29]);
    assert_eq!(r.code, 2);
    assert_eq!(r.stderr, format!("error: {V1_29} and {V1_29} are both node \"kube-proxy-v1.29-iptables-excerpt\" {hint}\n"));

    // named: two nodes, each over its lifetime
    let doc = json(&[&format!("node-a={a}"), &format!("node-b={b}")]);
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(nodes.iter().map(|n| n["node"].as_str().unwrap()).collect::<Vec<_>>(), ["node-a", "node-b"]);
    assert_eq!(nodes.iter().map(|n| f(&n["syncSamples"])).collect::<Vec<_>>(), [4.0, 104.0]);
    assert_eq!(doc["interval"], "lifetime");
    // the same NODE= twice still pairs them
    let doc = json(&[&format!("n={a}"), &format!("n={b}")]);
    assert_eq!(doc["interval"], "betweenScrapes");
    assert_eq!(f(&doc["nodes"][0]["syncSamples"]), 100.0);
}

/// Kubernetes node names are DNS subdomains (`ip-10-0-0-1.ec2.internal`): a `NODE=` prefix with
/// dots names the node (it used to be read as part of a file path: "No such file or
/// directory"). A prefix with `/`, `\` or `:` is part of the path; `./` keeps a file whose name
/// contains `=` a file.
#[test]
fn node_names_with_dots_are_node_prefixes() {
    let doc = json(&[&format!("ip-10-0-0-1.ec2.internal={V1_29}"), &format!("node-2.example.com={V1_13}")]);
    let names: Vec<&str> = doc["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
    assert_eq!(names, ["ip-10-0-0-1.ec2.internal", "node-2.example.com"]);
    assert_eq!(f(&doc["nodes"][0]["syncSamples"]), 4.0);
    // the same dotted NODE twice pairs two scrapes
    let dir = tmp();
    let later = write(dir.path(), "later.txt", &v1_29_later());
    let doc = json(&[&format!("a.b={V1_29}"), &format!("a.b={}", later.display())]);
    assert_eq!(doc["nodes"][0]["node"], "a.b");
    assert_eq!(doc["nodes"][0]["interval"], "betweenScrapes");
    assert_eq!(f(&doc["nodes"][0]["syncSamples"]), 100.0);
    // a dotted NODE before a URL
    let base = serve(shared(V1_29), 200, Some("iptables"));
    let doc = json(&[&format!("worker.internal={base}/metrics")]);
    assert_eq!(doc["nodes"][0]["node"], "worker.internal");
    // a path containing '=' after a '/' is a file, named after its stem
    let odd = write(dir.path(), "x.y=z.txt", &shared(V1_29));
    let doc = json(&[odd.to_str().unwrap()]);
    assert_eq!(doc["nodes"][0]["node"], "x.y=z");
    let doc = json(&["--earlier", &format!("a.b={V1_29}"), &format!("a.b={}", later.display())]);
    assert_eq!(doc["nodes"][0]["interval"], "betweenScrapes");
}

#[test]
fn stdin_source() {
    let text = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(V1_29)).unwrap();
    let mut child = bin().args(["analyze", "-o", "json", "worker-1=-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(&text).unwrap();
    let r = finish(child.wait_with_output().unwrap());
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["worstNode"], "worker-1");
    assert_eq!(doc["recommendation"]["preStopSeconds"], 10);

    // a cut stdin names <stdin>
    let cut = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(TRUNCATED)).unwrap();
    let mut child = bin().args(["analyze", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(&cut).unwrap();
    let r = finish(child.wait_with_output().unwrap());
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("<stdin>:17: kubeproxy_sync_proxy_rules_duration_seconds"), "{}", r.stderr);
}

// ---------------------------------------------------------------------------------------------
// URL sources: a local stand-in for kube-proxy's metrics server

/// Serves `/metrics` and `/proxyMode` (404 when `proxy_mode` is None) on 127.0.0.1 until the
/// test process exits; one request per connection. Returns the base URL.
fn serve(metrics: String, metrics_status: u16, proxy_mode: Option<&'static str>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let _ = respond(stream, &metrics, metrics_status, proxy_mode);
        }
    });
    format!("http://{addr}")
}

fn respond(mut stream: TcpStream, metrics: &str, metrics_status: u16, proxy_mode: Option<&str>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = match (path, proxy_mode) {
        ("/metrics", _) => (metrics_status, metrics.to_string()),
        ("/proxyMode", Some(mode)) => (200, mode.to_string()),
        _ => (404, "404 page not found\n".to_string()),
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        _ => "Internal Server Error",
    };
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()?;
    // drain anything else the client sent before closing
    let mut sink = [0u8; 256];
    stream.set_read_timeout(Some(std::time::Duration::from_millis(50)))?;
    let _ = stream.read(&mut sink);
    Ok(())
}

fn shared(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn url_source_reads_the_mode_from_proxy_mode() {
    // the v1.29 families say iptables; /proxyMode says nftables and wins
    let base = serve(shared(V1_29), 200, Some("nftables"));
    let doc = json(&[&format!("{base}/metrics")]);
    let n = &doc["nodes"][0];
    assert_eq!(n["node"], base.trim_start_matches("http://"));
    assert_eq!(n["mode"], "nftables");
    assert_eq!(n["modeSource"], "proxyMode endpoint");
    approx(f(&doc["syncP99Seconds"]), 0.12672);
    assert_eq!(doc["recommendation"]["preStopSeconds"], 10);

    // a v1.13 scrape has no mode-specific family: only /proxyMode can tell, and IPVS is flagged
    let base = serve(shared(V1_13), 200, Some("ipvs\n"));
    let doc = json(&[&format!("worker-7={base}/metrics")]);
    assert_eq!(doc["nodes"][0]["node"], "worker-7");
    assert_eq!(doc["nodes"][0]["mode"], "ipvs");
    assert_eq!(doc["proxy"]["mode"], "ipvs");
    let m = doc["advice"].as_array().unwrap().iter().find(|a| a["reason"] == "MigrateProxyMode").expect("IPVS advice");
    assert_eq!(m["to"], "nftables");

    // no /proxyMode (404): inferred from the families
    let base = serve(shared(V1_29), 200, None);
    let doc = json(&[&format!("{base}/metrics")]);
    assert_eq!(doc["nodes"][0]["mode"], "iptables");
    assert_eq!(doc["nodes"][0]["modeSource"], "metric families");

    // URL and file for the same node: an interval analysis
    let dir = tmp();
    let later = write(dir.path(), "later.txt", &v1_29_later());
    let base = serve(std::fs::read_to_string(&later).unwrap(), 200, Some("iptables"));
    let doc = json(&["--earlier", V1_29, &format!("{base}/metrics")]);
    assert_eq!(doc["nodes"][0]["interval"], "betweenScrapes");
    assert_eq!(f(&doc["nodes"][0]["syncSamples"]), 100.0);
}

#[test]
fn url_errors_exit_1() {
    // a cut body names the URL, family and line
    let base = serve(shared(TRUNCATED), 200, Some("kernelspace"));
    let url = format!("{base}/metrics");
    let r = run(&["analyze", &url]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains(&format!("{url}:17: kubeproxy_sync_proxy_rules_duration_seconds")), "{}", r.stderr);

    // HTTP 500
    let base = serve("oops\n".into(), 500, None);
    let r = run(&["analyze", &format!("{base}/metrics")]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("HTTP 500"), "{}", r.stderr);
}

/// A `/metrics` body over `--max-body-bytes` is an error naming the URL and the limit; the
/// default limit is the operator's 32 MiB.
#[test]
fn a_body_over_max_body_bytes_exits_1_naming_url_and_limit() {
    let base = serve(shared(V1_29), 200, Some("iptables"));
    let url = format!("{base}/metrics");
    let r = run(&["analyze", "--max-body-bytes", "4096", &url]);
    assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{}", r.stderr);
    assert_eq!(r.stderr, format!("error: {url}: body larger than 4096 bytes (--max-body-bytes): stopped reading\n"));
    // a limit the body fits in
    let doc = json(&["--max-body-bytes", &shared(V1_29).len().to_string(), &url]);
    assert_eq!(doc["nodes"][0]["syncSamples"], 4.0);
    let help = run(&["analyze", "--help"]).stdout;
    assert!(help.contains("[default: 33554432]"), "{help}");
}

#[test]
fn refused_connection_exits_1_with_the_metrics_bind_address_hint_on_kube_proxys_port_only() {
    // kube-proxy's port on a loopback address of its own, checked free by binding it first
    drop(TcpListener::bind("127.0.0.2:10249").expect("127.0.0.2:10249 free for this test"));
    let url = "http://127.0.0.2:10249/metrics";
    let r = run(&["analyze", "--timeout-seconds", "5", url]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains(url), "{}", r.stderr);
    assert!(r.stderr.to_lowercase().contains("refused"), "{}", r.stderr);
    assert!(r.stderr.contains("metricsBindAddress: 0.0.0.0:10249"), "{}", r.stderr);
    // another port: the refusal without the kube-proxy hint
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/metrics");
    let r = run(&["analyze", "--timeout-seconds", "5", &url]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.to_lowercase().contains("refused"), "{}", r.stderr);
    assert!(!r.stderr.contains("metricsBindAddress"), "{}", r.stderr);
}

/// A listening socket whose accept queue is full (backlog 0, one connection queued and never
/// accepted): further connections get no SYN-ACK, so connecting times out as behind a firewall
/// that drops packets. Returns the port and what must stay open.
fn full_backlog() -> (u16, (i32, TcpStream)) {
    // SAFETY: plain socket calls on a descriptor this function owns; the address is a valid
    // sockaddr_in for the duration of the calls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len), 0);
        assert_eq!(libc::listen(fd, 0), 0);
        let mut bound: libc::sockaddr_in = std::mem::zeroed();
        let mut blen = len;
        assert_eq!(libc::getsockname(fd, &mut bound as *mut _ as *mut libc::sockaddr, &mut blen), 0);
        let port = u16::from_be(bound.sin_port);
        let queued = TcpStream::connect(("127.0.0.1", port)).unwrap();
        (port, (fd, queued))
    }
}

/// The firewall hint is for a connection that never completes, and names the URL's port; a
/// server that accepts and never answers gets no such hint (it used to get "is a NetworkPolicy
/// or host firewall blocking port 10249?" whatever the port).
#[test]
fn timeout_hints_say_what_timed_out_and_name_the_real_port() {
    // accepted (kernel backlog), never answered
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metrics", silent.local_addr().unwrap());
    let r = run(&["analyze", "--timeout-seconds", "1", &url]);
    assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{}", r.stderr);
    assert!(r.stderr.starts_with(&format!("error: {url}: ")), "{}", r.stderr);
    assert!(r.stderr.ends_with(" (timed out after connecting: no complete answer in time; is kube-proxy overloaded?)\n"), "{}", r.stderr);
    assert!(!r.stderr.contains("firewall"), "{}", r.stderr);

    // the connection itself never completes
    let (port, held) = full_backlog();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let r = run(&["analyze", "--timeout-seconds", "1", &url]);
    assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{}", r.stderr);
    assert!(r.stderr.starts_with(&format!("error: {url}: ")), "{}", r.stderr);
    assert!(r.stderr.ends_with(&format!(" (timed out connecting: is a NetworkPolicy or host firewall blocking port {port}?)\n")), "{}", r.stderr);
    // SAFETY: closes the descriptor full_backlog opened
    unsafe { libc::close(held.0) };
}

/// No message echoes a URL's password: userinfo is shown as `***@` (it used to be printed as
/// given, `http://user:secret@host/...`).
#[test]
fn url_userinfo_is_redacted_in_every_message() {
    let secret = |r: &Run| assert!(!r.stderr.contains("secret") && !r.stderr.contains("user:"), "{}", r.stderr);
    let with_auth = |base: &str| base.replacen("http://", "http://user:secret@", 1);
    let shown = |base: &str| base.replacen("http://", "http://***@", 1);

    // HTTP status, a cut body (parse error), a body over the limit
    let base = serve("oops\n".into(), 500, None);
    let r = run(&["analyze", &format!("{}/metrics", with_auth(&base))]);
    assert_eq!(r.stderr, format!("error: {}/metrics: HTTP 500 Internal Server Error\n", shown(&base)));
    let base = serve(shared(TRUNCATED), 200, None);
    let r = run(&["analyze", &format!("{}/metrics", with_auth(&base))]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.starts_with(&format!("error: {}/metrics:17: kubeproxy_sync_proxy_rules_duration_seconds", shown(&base))), "{}", r.stderr);
    secret(&r);
    let base = serve(shared(V1_29), 200, None);
    let r = run(&["analyze", "--max-body-bytes", "1024", &format!("{}/metrics", with_auth(&base))]);
    assert_eq!(r.stderr, format!("error: {}/metrics: body larger than 1024 bytes (--max-body-bytes): stopped reading\n", shown(&base)));

    // reqwest's own message quotes the URL without userinfo (it moves it to the Authorization
    // header): still none in the whole message (refused connection)
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let r = run(&["analyze", &format!("http://user:secret@127.0.0.1:{port}/metrics")]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.starts_with(&format!("error: http://***@127.0.0.1:{port}/metrics: ")), "{}", r.stderr);
    secret(&r);

    // two URLs of one host:port, and a named --earlier that matches no node
    let a = format!("{}/metrics", with_auth(&base));
    let r = run(&["analyze", &a, &a]);
    assert_eq!(r.code, 2);
    let host = base.trim_start_matches("http://");
    assert!(r.stderr.starts_with(&format!("error: {0}/metrics and {0}/metrics are both node \"{host}\"", shown(&base))), "{}", r.stderr);
    secret(&r);
    let r = run(&["analyze", "--earlier", &format!("other={a}"), V1_29]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.starts_with(&format!("error: --earlier other={}/metrics: no source is node", shown(&base))), "{}", r.stderr);
    secret(&r);

    // the credentials still reach the server: a working source is analysed
    let doc = json(&[&a]);
    assert_eq!(doc["nodes"][0]["node"], host);
}

/// URL schemes are case-insensitive (`HTTP://` was read as a file path: "No such file or
/// directory"); a scheme other than http(s) is an error naming it (`ftp://` was a file path too).
#[test]
fn url_schemes_are_case_insensitive_and_others_are_named() {
    let base = serve(shared(V1_29), 200, Some("iptables"));
    let upper = format!("{}/metrics", base.replacen("http://", "HTTP://", 1));
    let doc = json(&[&upper]);
    assert_eq!(doc["nodes"][0]["node"], base.trim_start_matches("http://"));
    assert_eq!(doc["nodes"][0]["modeSource"], "proxyMode endpoint");
    assert_eq!(f(&doc["nodes"][0]["syncSamples"]), 4.0);
    let doc = json(&[&format!("worker-1={upper}")]);
    assert_eq!(doc["nodes"][0]["node"], "worker-1");

    for (source, scheme) in [("ftp://10.0.0.1/metrics", "ftp"), ("FILE:///tmp/metrics.txt", "FILE"), ("n1=gopher://h/x", "gopher")] {
        let r = run(&["analyze", source]);
        assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{source}: {}", r.stderr);
        let shown = source.trim_start_matches("n1=");
        assert_eq!(
            r.stderr,
            format!("error: {shown}: unsupported URL scheme \"{scheme}\": a source is a file, - (standard input) or an http:// or https:// URL\n")
        );
    }
}

/// Valid exposition text without kube-proxy's families (another component's /metrics) is not an
/// error: the report says NoData, and standard error says why, naming the source.
#[test]
fn a_scrape_without_kube_proxy_families_is_no_data_with_a_warning_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("apiserver.txt");
    std::fs::write(&path, "# TYPE go_goroutines gauge\ngo_goroutines 12\n").unwrap();
    let r = run(&["analyze", path.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("Recommendation (NoData): preStop sleep 10 s"), "{}", r.stdout);
    assert_eq!(
        r.stderr,
        format!(
            "warning: {}: no kube-proxy sync metrics (kubeproxy_sync_proxy_rules_*, kubeproxy_network_programming_duration_seconds): is this kube-proxy's /metrics (port 10249)?\n",
            path.display()
        )
    );
    // a kube-proxy scrape gets no such warning, and a measured basis is spelled like the others
    let r = run(&["analyze", "tests/data/metrics/kube-proxy-v1.13-legacy-microseconds.txt"]);
    assert_eq!((r.code, r.stderr.as_str()), (0, ""));
    assert!(r.stdout.contains("Recommendation (Measured): "), "{}", r.stdout);
}

/// An empty source (0 bytes, or only blank lines) is an error naming it, exit 1: a failed
/// capture, not a kube-proxy without syncs (it was "NoData", exit 0, with the families warning).
#[test]
fn an_empty_scrape_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for (file, body) in [("empty.txt", ""), ("blank.txt", "\n\n  \n")] {
        let path = dir.path().join(file);
        std::fs::write(&path, body).unwrap();
        let r = run(&["analyze", path.to_str().unwrap()]);
        assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{}", r.stderr);
        assert_eq!(r.stderr, format!("error: {}: empty ({} bytes): no metrics to read; was the capture cut off?\n", path.display(), body.len()), "{file}");
    }
}

/// A source that names no file says how it was read: `NODE=FILE` split at the first `=` (the
/// `./` rule for file names with `=`), and an empty node name.
#[test]
fn a_missing_source_says_how_the_argument_was_read() {
    let dir = tempfile::tempdir().unwrap();
    let r = finish(bin().current_dir(dir.path()).args(["analyze", "a=b.txt"]).output().unwrap());
    assert_eq!(r.code, 1);
    assert_eq!(
        r.stderr,
        "error: b.txt: No such file or directory (os error 2) (read as node \"a\", file \"b.txt\"; for a file named \"a=b.txt\", write ./a=b.txt)\n"
    );
    let r = finish(bin().current_dir(dir.path()).args(["analyze", "=x.txt"]).output().unwrap());
    assert_eq!(r.code, 1);
    assert_eq!(r.stderr, "error: =x.txt: No such file or directory (os error 2) (an empty node name: write NODE=x.txt, or ./=x.txt for a file of that name)\n");
    // the ./ form reads the file named with `=`
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/metrics/kube-proxy-v1.29-iptables-excerpt.txt"), dir.path().join("a=b.txt")).unwrap();
    let r = finish(bin().current_dir(dir.path()).args(["analyze", "./a=b.txt"]).output().unwrap());
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("\na=b  "), "node named after the file stem: {}", r.stdout);
}

/// `--earlier` pairings come from the arguments alone, so a wrong one is a usage error (exit 2,
/// as docs/analyze.md says) reported before any source is fetched (here a URL that would hang
/// for the whole timeout).
#[test]
fn a_wrong_earlier_pairing_is_reported_before_any_fetch() {
    // accepts connections (the kernel backlog) and never answers
    let hanging = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metrics", hanging.local_addr().unwrap());
    let start = std::time::Instant::now();
    let r = run(&["analyze", "--timeout-seconds", "30", &format!("n1={url}"), "--earlier", &format!("other={V1_29}")]);
    assert_eq!((r.code, r.stdout.as_str()), (2, ""), "{}", r.stderr);
    assert_eq!(r.stderr, format!("error: --earlier other={V1_29}: no source is node \"other\" (the nodes are: n1): name the node (NODE=FILE) it belongs to\n"));
    assert!(start.elapsed() < std::time::Duration::from_secs(10), "{:?}", start.elapsed());
    // a node given twice already has its earlier scrape
    let r = run(&["analyze", &format!("n1={V1_29}"), &format!("n1={V1_29}"), "--earlier", &format!("n1={V1_29}"), "--timeout-seconds", "30"]);
    assert_eq!((r.code, r.stdout.as_str()), (2, ""), "{}", r.stderr);
    assert_eq!(r.stderr, format!("error: --earlier n1={V1_29}: node n1 already has an earlier scrape\n"));
    drop(hanging);
}

/// A full disk (`/dev/full`) or a reader that closed the pipe ends the command with exit code 1,
/// never a panic (exit 101): the output could not be written, and a full disk says so.
#[test]
fn an_output_that_cannot_be_written_is_an_error_not_a_panic() {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let out = bin().args(["analyze", "tests/data/metrics/kube-proxy-v1.29-iptables-excerpt.txt"]).stdout(full).output().unwrap();
    let r = finish(out);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("cannot write the output") && r.stderr.contains("No space left on device"), "{}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);

    // the pipe's reader gone before the output (several pipe buffers of manifests) is written
    let dir = tmp();
    let pod = std::fs::read_to_string(
        "tests/data/pods/".to_string() + &std::fs::read_dir("tests/data/pods").unwrap().flatten().next().unwrap().file_name().to_string_lossy(),
    )
    .unwrap();
    let many = write(dir.path(), "many.yaml", &vec![pod; 400].join("\n---\n"));
    let mut child = bin().args(["mutate"]).arg(&many).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let r = finish(out);
    assert_eq!(r.code, 1, "{}", r.stderr);
    // the same input to a reader is fine: exit 1 above is the closed pipe, said quietly
    assert_eq!(run(&["mutate", many.to_str().unwrap()]).code, 0);
    assert!(!r.stderr.contains("panicked") && !r.stderr.contains("error:"), "{}", r.stderr);
}

/// `mutate` says when there was nothing to mutate, in the text output; JSON keeps an empty
/// `results`. An empty file is bad input, as for `analyze` (docs/cli.md "Exit codes").
#[test]
fn mutate_says_when_there_is_nothing_to_mutate() {
    let dir = tmp();
    let empty = write(dir.path(), "empty.yaml", "# nothing here\n---\n");
    let service = write(dir.path(), "svc.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {selector: {app: web}}\n");
    let list = write(dir.path(), "list.yaml", "apiVersion: v1\nkind: List\nitems: []\n");
    let r = run(&["mutate", list.to_str().unwrap(), service.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        format!("nothing to mutate: {} (no document), {} (1 document(s), only Services and TerminationPolicies)\n", list.display(), service.display())
    );
    let r = run(&["mutate", "--output", "json", service.to_str().unwrap()]);
    assert_eq!(serde_json::from_str::<Value>(&r.stdout).unwrap()["results"], serde_json::json!([]), "{}", r.stdout);
    let r = run(&["mutate", empty.to_str().unwrap(), service.to_str().unwrap()]);
    assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{}", r.stderr);
    assert_eq!(r.stderr, format!("error: {}: empty (19 bytes, no YAML document): nothing to read; is this the right file?\n", empty.display()));
}

/// `mutate` names the Services and TerminationPolicies it read but did not mutate (a Service
/// beside a Deployment was left out of the output without a word), and refuses a document that
/// is not a Kubernetes object (a Markdown file was "skipped: document has no kind", exit 0).
#[test]
fn mutate_names_what_it_read_and_refuses_what_is_not_an_object() {
    let dir = tmp();
    let both = write(
        dir.path(),
        "web.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: nginx}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {selector: {app: web}}\n",
    );
    let r = run(&["mutate", both.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.starts_with(&format!("{}#0 Deployment/web\n  decision: Mutated\n", both.display())), "{}", r.stdout);
    assert!(
        r.stdout.ends_with(&format!(
            "{}#1 Service/web\n  read, not mutated (Services define scope ServiceBacked; TerminationPolicies serve their namespace)\n",
            both.display()
        )),
        "{}",
        r.stdout
    );
    let r = run(&["mutate", "--output", "json", both.to_str().unwrap()]);
    let doc: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["read"], serde_json::json!([format!("{}#1 Service/web", both.display())]));
    assert_eq!(doc["results"].as_array().unwrap().len(), 1);

    for (file, body, what) in [
        ("notes.md", "# Notes\n\nSome text.\n", "document 0 is a string"),
        ("list.yaml", "- a\n- b\n", "document 0 is a sequence"),
        ("second.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n42\n", "document 1 is a number"),
    ] {
        let path = write(dir.path(), file, body);
        let r = run(&["mutate", path.to_str().unwrap()]);
        assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{file}: {}", r.stderr);
        assert_eq!(r.stderr, format!("error: {}: {what}, not a Kubernetes object (a mapping with apiVersion and kind)\n", path.display()), "{file}");
    }
}

/// `mutate` prints its warnings whole (there is no API server to cut them); the webhook's answer
/// (`review`) cuts each at 119 characters, and the figures come first so that a cut loses only
/// the container's name. The name is 63 characters (a DNS label's limit): the kept-sleep
/// warning is 144. A fresh user's trial found `review` had cut "of 1s, below the recommended
/// 10s" off the end.
#[test]
fn whole_warnings_offline_and_cut_ones_keep_their_figures() {
    let dir = tmp();
    let name = "c".repeat(63);
    let pod = write(
        dir.path(),
        "pod.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, labels: {{app: web}}}}\nspec:\n  containers:\n  - name: {name}\n    image: nginx\n    lifecycle: {{preStop: {{sleep: {{seconds: 1}}}}}}\n"
        ),
    );
    let r = run(&["mutate", "--pre-stop-seconds", "10", pod.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let whole = format!("  warning: safe-termination: preStop sleep 1s kept, below the recommended 10s, in container {name}\n");
    assert!(r.stdout.contains(&whole), "{}", r.stdout);
    assert_eq!(whole.trim().chars().count() - "warning: ".len(), 144);
    // the same pod through the webhook's answer
    let pod_json: Value = serde_json::from_str(&run(&["mutate", "--output", "json", "--pre-stop-seconds", "10", pod.to_str().unwrap()]).stdout).unwrap();
    let review = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"}, "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE", "namespace": "default", "object": pod_json["results"][0]["pod"]}});
    let file = write(dir.path(), "review.json", &review.to_string());
    let r = run(&["review", "--pre-stop-seconds", "10", file.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let answer: Value = serde_json::from_str(&r.stdout).unwrap();
    let w = answer["response"]["warnings"][0].as_str().unwrap_or_default();
    assert!(w.chars().count() <= 119 && w.starts_with("safe-termination: preStop sleep 1s kept, below the recommended 10s, in container ccc"), "{answer}");
}

/// `mutate` takes the TerminationPolicies among its inputs as the cluster would: each serves its
/// namespace ahead of the default, with its own defaultSeconds and grace rules; an invalid one is
/// an error naming the document. The demo's policy (defaultSeconds 10, appShutdownSeconds 20)
/// gives its Deployment a 10 s sleep and no grace operation (10 + 20 = 30 s, the default grace);
/// the same Deployment (and its Service) in another namespace gets the static default policy.
#[test]
fn mutate_uses_the_termination_policies_in_its_inputs() {
    let r = run(&["mutate", "--output", "json", "config/demo/app.yaml"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).unwrap();
    let results = doc["results"].as_array().unwrap();
    assert!(results.iter().all(|x| !x["source"].as_str().unwrap().contains("TerminationPolicy/")), "{doc}");
    let web = results.iter().find(|x| x["source"].as_str().unwrap().ends_with("Deployment/web")).expect("the Deployment");
    let ops = web["patch"].as_array().unwrap();
    assert!(ops.iter().any(|o| o["value"]["preStop"]["sleep"]["seconds"] == 10), "{web}");
    assert!(!ops.iter().any(|o| o["path"] == "/spec/terminationGracePeriodSeconds"), "{web}");
    assert_eq!(web["pod"]["metadata"]["annotations"]["safetermination.io/policy"], "demo/web", "{web}");

    // the same Deployment in a namespace without a policy: the static default
    let dir = tmp();
    // (the Service and the Deployment move; the policy stays in demo)
    let text = std::fs::read_to_string("config/demo/app.yaml")
        .unwrap()
        .replace("namespace: demo\nspec:\n  replicas", "namespace: other\nspec:\n  replicas")
        .replace("namespace: demo\nspec:\n  selector", "namespace: other\nspec:\n  selector");
    let moved = write(dir.path(), "moved.yaml", &text);
    let r = run(&["mutate", "--output", "json", moved.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).unwrap();
    let web = doc["results"].as_array().unwrap().iter().find(|x| x["source"].as_str().unwrap().ends_with("Deployment/web")).cloned().unwrap();
    assert_eq!(web["pod"]["metadata"]["namespace"], "other", "{web}");
    assert_eq!(web["pod"]["metadata"]["annotations"]["safetermination.io/policy"], "static", "{web}");

    // an invalid policy in the inputs is an error naming it
    let bad = write(dir.path(), "bad.yaml", &std::fs::read_to_string("config/demo/app.yaml").unwrap().replace("maxSeconds: 60", "maxSeconds: 1"));
    let r = run(&["mutate", bad.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stderr.contains("TerminationPolicy/web"), "{}", r.stderr);
}

/// A file or standard input larger than 64 MiB is refused with a message naming it, without
/// reading it whole (`/dev/zero` never ends).
#[test]
fn an_endless_input_is_refused_at_the_file_limit() {
    let r = run(&["analyze", "/dev/zero"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("/dev/zero: larger than 67108864 bytes"), "{}", r.stderr);
    assert!(r.stderr.contains("(a kube-proxy scrape is about 80 KB)"), "{}", r.stderr);
    // the same reader, cap and message for manifests and reviews, without the scrape's hint
    for command in ["mutate", "review"] {
        let r = run(&[command, "/dev/zero"]);
        assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{command}: {}", r.stderr);
        assert_eq!(r.stderr, "error: /dev/zero: larger than 67108864 bytes, the limit on a file or standard input: is this the right file?\n", "{command}");
    }
    // standard input too, named as such
    let mut child = bin().args(["review", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b' '; 1 << 20];
        // the reader stops after the limit and exits: the pipe then breaks
        for _ in 0..80 {
            if stdin.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let r = finish(child.wait_with_output().unwrap());
    writer.join().unwrap();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.starts_with("error: <stdin>: larger than 67108864 bytes"), "{}", r.stderr);
}

/// One exit-code rule for every command (docs/cli.md "Exit codes"): 0 done, 1 bad input (a
/// missing or unreadable file the user named, an empty input, each named in the message), 2
/// usage. The webhook exited 2 for a missing `--policy` file where `analyze` exited 1, and
/// `mutate` exited 0 on an empty input where `analyze` exited 1.
#[test]
fn every_command_follows_one_exit_code_rule() {
    let dir = tmp();
    let empty = write(dir.path(), "empty", "\n\n");
    let empty = empty.to_str().unwrap();
    let webhook = ["webhook", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];
    // a missing file the user named: 1, naming it
    for args in [
        &["analyze", "/nonexistent/scrape.txt"][..],
        &["mutate", "/nonexistent/scrape.txt"][..],
        &["review", "/nonexistent/scrape.txt"][..],
        &["analyze", "--policy", "/nonexistent/scrape.txt", V1_29][..],
        &["mutate", "--policy", "/nonexistent/scrape.txt", "tests/data/pods/hostnetwork-deployment.yaml"][..],
        &["review", "--policy", "/nonexistent/scrape.txt", "tests/data/admission/admissionreview-pod-create.json"][..],
        &[&webhook[..], &["--policy", "/nonexistent/scrape.txt"]].concat()[..],
    ] {
        let r = run(args);
        assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{args:?}: {}", r.stderr);
        let last = r.stderr.lines().last().unwrap_or("");
        assert!(last.starts_with("error: /nonexistent/scrape.txt: No such file or directory"), "{args:?}: {}", r.stderr);
    }
    // a file that is not an AdmissionReview: review's 1 names it
    let r = run(&["review", "tests/data/pods/hostnetwork-deployment.yaml"]);
    assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{}", r.stderr);
    assert!(r.stderr.starts_with("error: tests/data/pods/hostnetwork-deployment.yaml: bad AdmissionReview: body is not JSON"), "{}", r.stderr);
    // an empty input: 1, naming the file or standard input
    for command in ["analyze", "mutate", "review"] {
        let r = run(&[command, empty]);
        assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{command}: {}", r.stderr);
        assert!(r.stderr.starts_with(&format!("error: {empty}: empty (2 bytes")), "{command}: {}", r.stderr);
        let mut child = bin().args([command, "-"]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdin.take());
        let r = finish(child.wait_with_output().unwrap());
        assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{command} -: {}", r.stderr);
        assert!(r.stderr.starts_with("error: <stdin>: empty (0 bytes"), "{command} -: {}", r.stderr);
    }
    // usage: 2, before any file is read
    for args in [
        &["analyze", "--no-such-flag", V1_29][..],
        &["mutate", "--no-such-flag", "/nonexistent/scrape.txt"][..],
        &["review", "--pre-stop-seconds", "-1", "/nonexistent/scrape.txt"][..],
        &["review"][..],
        &[&webhook[..], &["--max-body-bytes", "1"]].concat()[..],
    ] {
        let r = run(args);
        assert_eq!((r.code, r.stdout.as_str()), (2, ""), "{args:?}: {}", r.stderr);
        assert!(!r.stderr.contains("/nonexistent"), "{args:?}: {}", r.stderr);
    }
    // done: 0
    for args in [
        &["analyze", V1_29][..],
        &["mutate", "tests/data/pods/hostnetwork-deployment.yaml"][..],
        &["review", "tests/data/admission/admissionreview-pod-create.json"][..],
    ] {
        let r = run(args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
        assert!(!r.stdout.is_empty(), "{args:?}");
    }
}

/// `--pre-stop-seconds` above the policy's maxSeconds is capped there, and a warning says so.
#[test]
fn a_pre_stop_above_the_policy_maximum_is_capped_with_a_warning() {
    let r = run(&["mutate", "--output", "json", "--pre-stop-seconds", "3600", "tests/data/pods/hostnetwork-deployment.yaml"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("--pre-stop-seconds 3600 is above the policy's preStop.maxSeconds 60: 60 s is served"), "{}", r.stderr);
    assert!(r.stdout.contains("\"seconds\": 60"), "{}", r.stdout);
}

// ---------------------------------------------------------------------------------------------
// the protobuf exposition (kube-proxy 1.37's native histograms): files, stdin, URLs, --format

mod support;
use safe_termination::core::exposition::format::{ACCEPT_PROTOBUF, ACCEPT_PROTOBUF_FIRST, ACCEPT_TEXT};
use std::sync::{Arc, Mutex};
use support::fake_kube_proxy::{A_PB, A_TXT, PROTOBUF_CT, TEXT_CT, ipv4_only, ipv4_only_text};

fn write_bytes(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// The fields of a node's report that come from classic buckets and scalars alone.
fn classic_fields(doc: &Value) -> Vec<Value> {
    let n = &doc["nodes"][0];
    ["kubernetesVersion", "mode", "syncSamples", "staleSeconds", "iptablesRulesTotal"].iter().map(|k| n[*k].clone()).collect()
}

#[test]
fn protobuf_files_and_stdin_are_detected_and_read_like_their_text() {
    let dir = tmp();
    let pb = write_bytes(dir.path(), "node-a.pb", &ipv4_only(A_PB));
    let txt = write(dir.path(), "node-a.txt", &ipv4_only_text(A_TXT));
    let from_pb = json(&[pb.to_str().unwrap()]);
    let from_txt = json(&[txt.to_str().unwrap()]);
    assert_eq!(from_pb["nodes"][0]["node"], "node-a");
    assert_eq!(classic_fields(&from_pb), classic_fields(&from_txt));
    assert_eq!(from_pb["nodes"][0]["syncSamples"], 2.0);
    // --format protobuf reads it too
    assert_eq!(classic_fields(&json(&["--format", "protobuf", pb.to_str().unwrap()])), classic_fields(&from_txt));

    // standard input
    let mut child = bin().args(["analyze", "--output", "json", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(&ipv4_only(A_PB)).unwrap();
    let r = finish(child.wait_with_output().unwrap());
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(classic_fields(&serde_json::from_str(&r.stdout).unwrap()), classic_fields(&from_txt));

    // a cut protobuf file names the file, the message and the byte
    let bytes = ipv4_only(A_PB);
    let cut = write_bytes(dir.path(), "cut.pb", &bytes[..bytes.len() - 3]);
    let r = run(&["analyze", cut.to_str().unwrap()]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains(&format!("{}: protobuf message ", cut.display())) && r.stderr.contains("cut off"), "{}", r.stderr);
}

#[test]
fn format_flag_refuses_a_source_in_the_other_format() {
    let dir = tmp();
    let pb = write_bytes(dir.path(), "node-a.pb", &ipv4_only(A_PB));
    let r = run(&["analyze", "--format", "text", pb.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("--format text, but this is the protobuf exposition") && r.stderr.contains("node-a.pb"), "{}", r.stderr);
    let r = run(&["analyze", "--format", "protobuf", V1_29]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains(&format!("{V1_29}: --format protobuf, but this is text")), "{}", r.stderr);
    // an empty file is an error under either format (an_empty_scrape_is_an_error_naming_it), and
    // an unknown format is a usage error
    let empty = write(dir.path(), "empty.txt", "");
    for format in ["text", "protobuf"] {
        let r = run(&["analyze", "--format", format, empty.to_str().unwrap()]);
        assert_eq!(r.code, 1, "{}", r.stderr);
        assert!(r.stderr.contains("empty (0 bytes): no metrics to read"), "{}", r.stderr);
    }
    assert_eq!(run(&["analyze", "--format", "json", V1_29]).code, 2);
}

/// A kube-proxy on 127.0.0.1 answering `/metrics` with `pb` (its real Content-Type) when the
/// request's Accept names protobuf and `text` otherwise (always `text` when `text_only`),
/// recording each Accept header; `/proxyMode` is 404. Returns the base URL.
fn serve_negotiating(pb: Vec<u8>, text: String, text_only: bool) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let (mut request_line, mut accept) = (String::new(), String::new());
            let _ = reader.read_line(&mut request_line);
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':')
                    && name.eq_ignore_ascii_case("accept")
                {
                    accept = value.trim().to_string();
                }
            }
            let (status, ct, body): (&str, &str, &[u8]) = if !request_line.starts_with("GET /metrics ") {
                ("404 Not Found", TEXT_CT, b"404 page not found\n")
            } else {
                recorded.lock().unwrap().push(accept.clone());
                if !text_only && accept.contains("application/vnd.google.protobuf") {
                    ("200 OK", PROTOBUF_CT, &pb)
                } else {
                    ("200 OK", TEXT_CT, text.as_bytes())
                }
            };
            let head = format!("HTTP/1.1 {status}\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(body)).and_then(|_| stream.flush());
        }
    });
    (format!("http://{addr}"), seen)
}

#[test]
fn url_sources_ask_for_protobuf_first_and_read_either_answer() {
    let txt_doc = {
        let dir = tmp();
        json(&[write(dir.path(), "node-a.txt", &ipv4_only_text(A_TXT)).to_str().unwrap()])
    };
    // auto: protobuf first; the protobuf answer is read
    let (base, seen) = serve_negotiating(ipv4_only(A_PB), ipv4_only_text(A_TXT), false);
    let doc = json(&[&format!("{base}/metrics")]);
    assert_eq!(seen.lock().unwrap().as_slice(), [ACCEPT_PROTOBUF_FIRST]);
    assert_eq!(classic_fields(&doc), classic_fields(&txt_doc));
    // --format text asks for text only, --format protobuf for protobuf only
    json(&["--format", "text", &format!("{base}/metrics")]);
    json(&["--format", "protobuf", &format!("{base}/metrics")]);
    assert_eq!(seen.lock().unwrap().as_slice(), [ACCEPT_PROTOBUF_FIRST, ACCEPT_TEXT, ACCEPT_PROTOBUF]);

    // a server that answers text to the protobuf-first Accept is read as text
    let (base, seen) = serve_negotiating(Vec::new(), ipv4_only_text(A_TXT), true);
    assert_eq!(classic_fields(&json(&[&format!("{base}/metrics")])), classic_fields(&txt_doc));
    assert_eq!(seen.lock().unwrap().as_slice(), [ACCEPT_PROTOBUF_FIRST]);
    // ... and refused under --format protobuf, saying what came back
    let r = run(&["analyze", "--format", "protobuf", &format!("{base}/metrics")]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("--format protobuf, but the server answered in the text exposition (Content-Type text/plain; version=0.0.4"), "{}", r.stderr);
}

#[test]
fn the_real_protobuf_capture_is_read_like_its_text_capture_needs_native_add() {
    let pb = json(&["tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.pb"]);
    let txt = json(&["tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.txt"]);
    assert_eq!(classic_fields(&pb), classic_fields(&txt));
    // --histograms classic: the protobuf capture's classic p99 and W equal the text capture's
    // (shared/cases/README.md: the classic p99 from both formats must be equal); the native
    // p99 from the same protobuf scrape is lower (9%-wide buckets against doubling ones)
    let case = |f: &str| format!("tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.{f}");
    let classic_pb = json(&["--histograms", "classic", &case("pb")]);
    let classic_txt = json(&["--histograms", "classic", &case("txt")]);
    for doc in [&classic_pb, &classic_txt] {
        assert_eq!(doc["nodes"][0]["histogramKind"], "classic", "{doc}");
    }
    let p99 = |d: &Value| d["nodes"][0]["syncP99"]["seconds"].as_f64().unwrap();
    assert_eq!(p99(&classic_pb), p99(&classic_txt));
    assert_eq!(classic_pb["propagationWindowSeconds"], classic_txt["propagationWindowSeconds"]);
    assert!((p99(&classic_pb) - 0.254).abs() < 0.0005, "{}", p99(&classic_pb));
    assert!(p99(&pb) < p99(&classic_pb), "native {} vs classic {}", p99(&pb), p99(&classic_pb));
    assert_eq!(pb["nodes"][0]["histogramKind"], "native");
    // an earlier text scrape and a later protobuf one of the same idle proxy: no new sync in
    // between, so the lifetime fallback reads the later scrape alone, natively
    let both = json(&[&format!("a={}", case("txt")), &format!("a={}", case("pb"))]);
    assert_eq!(both["nodes"][0]["interval"], "lifetimeFallback", "{both}");
    assert_eq!(both["nodes"][0]["histogramKind"], "native", "{both}");
    assert_eq!(p99(&both), p99(&pb));
}

/// YAML errors name the file, the position and what is wrong in the project's words, never the
/// parser's settings or Rust types (it said `duplicate mapping key: name, set
/// DuplicateKeyPolicy in Options if acceptable`, `non-finite float `.nan` rejected by the
/// configured policy`, `budget breached: Depth { depth: 65 }`).
#[test]
fn yaml_errors_are_in_the_users_words() {
    let dir = tmp();
    let dup = write(dir.path(), "dup.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  name: b\n");
    let policy = std::fs::read_to_string("config/terminationpolicy-default.yaml").unwrap();
    assert!(policy.contains("    safetyFactor: 1.25\n"));
    let nan = write(dir.path(), "nan.yaml", &policy.replace("safetyFactor: 1.25", "safetyFactor: .nan"));
    let line = policy.lines().position(|l| l.contains("safetyFactor")).unwrap() + 1;
    let deep = write(dir.path(), "deep.yaml", &format!("a: {}{}\n", "[".repeat(70), "]".repeat(70)));
    let cut = write(dir.path(), "cut.yaml", "a: [1, 2\n");
    for (args, message) in [
        (vec!["mutate", dup.to_str().unwrap()], format!("{}: line 5, column 3: duplicate key `name`", dup.display())),
        (
            vec!["analyze", "--policy", nan.to_str().unwrap(), V1_29],
            format!("{}: line {line}, column 19: `safetyFactor` must be a finite number, not `.nan`", nan.display()),
        ),
        (
            vec!["mutate", "--policy", nan.to_str().unwrap(), dup.to_str().unwrap()],
            format!("{}: line {line}, column 19: `safetyFactor` must be a finite number, not `.nan`", nan.display()),
        ),
        (vec!["mutate", deep.to_str().unwrap()], format!("{}: line 1, column 67: nested deeper than 64 levels", deep.display())),
        (vec!["mutate", cut.to_str().unwrap()], format!("{}: not valid YAML or JSON: unclosed bracket '[' at line 1, column 4", cut.display())),
    ] {
        let r = run(&args);
        assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr, format!("error: {message}\n"), "{args:?}");
    }
}

/// The size message fits the command: `analyze` adds how large a kube-proxy scrape is; `mutate`
/// and `review` (manifests, AdmissionReviews) do not speak of scrapes.
#[test]
fn the_size_message_fits_the_command() {
    let r = run(&["analyze", "/dev/zero"]);
    assert_eq!(
        r.stderr,
        "error: /dev/zero: larger than 67108864 bytes, the limit on a file or standard input: is this the right file? (a kube-proxy scrape is about 80 KB)\n"
    );
    for command in ["mutate", "review"] {
        assert!(!run(&[command, "/dev/zero"]).stderr.contains("kube-proxy"), "{command}");
    }
}

/// Under `--format auto`, a binary body that neither exposition reads says so with both
/// reasons: a corrupt first length prefix (2^62) was reported as bad UTF-8 text only.
#[test]
fn a_body_neither_exposition_reads_gives_both_reasons() {
    let dir = tmp();
    // varint 2^62, then a MetricFamily name field, then bytes that are not UTF-8
    let mut body = vec![0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40, 0x0a, 0x05];
    body.extend_from_slice(b"abcde");
    body.extend(0x80u8..0xa6);
    let path = dir.path().join("corrupt.pb");
    std::fs::write(&path, &body).unwrap();
    let p = path.to_str().unwrap();
    let r = run(&["analyze", p]);
    assert_eq!((r.code, r.stdout.as_str()), (1, ""), "{}", r.stderr);
    assert_eq!(
        r.stderr,
        format!(
            "error: {p}: neither exposition reads it (--format auto): as protobuf, protobuf message 1 at byte 0: the message declares 4611686018427387904 bytes but only 45 remain: the scrape was cut off; as text, line 1: invalid UTF-8 at byte offset 0 (byte 1 of line 1): the input must be UTF-8 text\n"
        )
    );
    // named formats keep their single reason
    let r = run(&["analyze", "--format", "protobuf", p]);
    assert_eq!(
        r.stderr,
        format!("error: {p}: protobuf message 1 at byte 0: the message declares 4611686018427387904 bytes but only 45 remain: the scrape was cut off\n")
    );
}

/// A typed list as the API server returns it (`DeploymentList`, items without a kind) is
/// expanded like kubectl's `kind: List`: each item mutated as the list's kind.
#[test]
fn a_typed_list_is_expanded_like_a_list() {
    let dir = tmp();
    let list = write(
        dir.path(),
        "deployments.yaml",
        "apiVersion: apps/v1\nkind: DeploymentList\nitems:\n- metadata: {name: web}\n  spec:\n    template:\n      spec: {containers: [{name: web, image: nginx}]}\n- metadata: {name: api}\n  spec:\n    template:\n      spec: {containers: [{name: api, image: nginx}]}\n",
    );
    let r = run(&["mutate", "--output", "json", list.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).unwrap();
    let results = doc["results"].as_array().unwrap();
    let sources: Vec<&str> = results.iter().map(|x| x["source"].as_str().unwrap()).collect();
    assert_eq!(sources, [format!("{}#0 Deployment/web", list.display()), format!("{}#1 Deployment/api", list.display())]);
    assert!(results.iter().all(|x| x["reason"] == "Mutated"), "{results:?}");
}

/// A huge sample count (text counts are floats) prints in scientific notation, not as a
/// 309-digit integer.
#[test]
fn huge_counts_print_in_scientific_notation() {
    let dir = tmp();
    let text: String = std::fs::read_to_string(V1_29)
        .unwrap()
        .lines()
        .map(|l| match l.strip_prefix("kubeproxy_sync_proxy_rules_duration_seconds_") {
            Some(rest) if (rest.starts_with("bucket") && !rest.contains("le=\"0.0")) || rest.starts_with("count") => {
                format!("{} 1e308\n", l.rsplit_once(' ').unwrap().0)
            }
            _ => format!("{l}\n"),
        })
        .collect();
    let huge = write(dir.path(), "huge.txt", &text);
    let r = run(&["analyze", huge.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let row = r.stdout.lines().find(|l| l.starts_with("huge ")).unwrap();
    assert!(row.contains(" 1.000e308 "), "{row}");
    assert!(!r.stdout.contains("0000000000"), "{}", r.stdout);
}

/// Text output never carries a raw bidirectional override or control character from a name (a
/// node named `a\u{202e}b` reordered the rest of its table row on a terminal): it is written
/// as `\u{202e}`. JSON keeps the name as it is (escaped by JSON's own rules where needed).
#[test]
fn text_output_escapes_bidirectional_and_control_characters() {
    let node = format!("ev\u{202e}il={V1_29}");
    let r = run(&["analyze", &node]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stdout.contains('\u{202e}'), "{}", r.stdout);
    assert!(r.stdout.contains("ev\\u{202e}il "), "{}", r.stdout);
    let doc = json(&[&node]);
    assert_eq!(doc["nodes"][0]["node"], "ev\u{202e}il");
    let dir = tmp();
    let pod =
        write(dir.path(), "pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: \"a\\u202Eb\\u0007\"}\nspec: {containers: [{name: web, image: nginx}]}\n");
    let r = run(&["mutate", pod.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("Pod/a\\u{202e}b\\u{7}\n"), "{}", r.stdout);
}
