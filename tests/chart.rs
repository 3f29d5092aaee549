//! Checks of the Helm chart (charts/safe-termination) that need no tool and no cluster: the CRD
//! copy, the values schema against values.yaml, the values table of the chart README, the alert
//! rules and the Grafana dashboard against the metrics the operator really exports, and the
//! Dockerfile's essentials. The checks that need helm or promtool are in tests/chart_render.rs,
//! those that need the local control plane in tests/e2e_chart.rs (run by `make e2e`).

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    root().join("charts/safe-termination")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn yaml(p: &Path) -> Value {
    serde_saphyr::from_str(&read(p)).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn the_charts_crds_are_the_generated_crds() {
    let names = ["terminationparameters.yaml", "terminationpolicy.yaml"];
    for name in names {
        let generated = read(&root().join("crds").join(name));
        let copy = read(&chart().join("crds").join(name));
        assert!(
            copy == generated,
            "charts/safe-termination/crds/{name} differs from crds/{name}: \
             run `cp crds/*.yaml charts/safe-termination/crds/` and commit (and tell users to \
             `kubectl apply --server-side -f crds/` on upgrade: Helm never upgrades crds/)"
        );
    }
    let mut files: Vec<_> = std::fs::read_dir(chart().join("crds")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(files, names, "only the TerminationPolicy and TerminationParameters CRDs in the chart's crds/");
}

#[test]
fn chart_app_version_is_the_crate_version() {
    let chart_yaml = yaml(&chart().join("Chart.yaml"));
    assert_eq!(chart_yaml["apiVersion"], "v2");
    assert_eq!(chart_yaml["name"], "safe-termination");
    assert_eq!(chart_yaml["appVersion"], env!("CARGO_PKG_VERSION"), "Chart.yaml appVersion (the default image tag)");
    let kube = chart_yaml["kubeVersion"].as_str().unwrap();
    assert!(kube.starts_with(">=1.30"), "matchConditions and the native sleep need 1.30: {kube}");
}

fn schema() -> Value {
    let text = read(&chart().join("values.schema.json"));
    serde_json::from_str(&text).expect("values.schema.json is JSON")
}

fn values() -> Value {
    yaml(&chart().join("values.yaml"))
}

/// A schema node with `properties` and `additionalProperties: false` describes every key;
/// others (free-form objects such as resources or a policy spec) are leaves.
fn closed(schema: &Value) -> bool {
    schema.get("properties").is_some() && schema.get("additionalProperties") == Some(&Value::Bool(false))
}

fn type_ok(schema: &Value, v: &Value) -> bool {
    let ok = |t: &str| match t {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "null" => v.is_null(),
        _ => false,
    };
    match &schema["type"] {
        Value::String(t) => ok(t),
        Value::Array(ts) => ts.iter().any(|t| t.as_str().is_some_and(ok)),
        _ => true,
    }
}

fn compare(path: &str, schema: &Value, values: &Value, errors: &mut Vec<String>) {
    if !type_ok(schema, values) {
        errors.push(format!("{path}: value {values} does not have schema type {}", schema["type"]));
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array)
        && !e.contains(values)
    {
        errors.push(format!("{path}: {values} is not one of {e:?}"));
    }
    if !closed(schema) {
        return;
    }
    let props = schema["properties"].as_object().unwrap();
    let Some(obj) = values.as_object() else { return };
    for (k, v) in obj {
        match props.get(k) {
            Some(s) => compare(&format!("{path}.{k}"), s, v, errors),
            None => errors.push(format!("{path}.{k}: in values.yaml, not in values.schema.json")),
        }
    }
    for k in props.keys() {
        // an object that defaults to {} lists optional keys (e.g. certManager.issuerRef)
        let optional = obj.is_empty() || (path.is_empty() && k == "global");
        if !optional && !obj.contains_key(k) {
            errors.push(format!("{path}.{k}: in values.schema.json, not in values.yaml"));
        }
    }
}

#[test]
fn values_schema_matches_values_yaml_key_for_key() {
    let s = schema();
    assert_eq!(s["$schema"], "http://json-schema.org/draft-07/schema#");
    assert!(closed(&s), "the top level refuses unknown keys");
    let mut errors = Vec::new();
    compare("", &s, &values(), &mut errors);
    assert!(errors.is_empty(), "values.schema.json vs values.yaml:\n{}", errors.join("\n"));
}

#[test]
fn schema_encodes_the_webhook_rules() {
    let s = schema();
    let w = &s["properties"]["webhook"]["properties"];
    assert_eq!(w["failurePolicy"]["enum"], serde_json::json!(["Ignore", "Fail"]));
    assert_eq!(w["timeoutSeconds"]["maximum"], 5, "R10: timeoutSeconds <= 5");
    assert_eq!(values()["webhook"]["failurePolicy"], "Ignore", "R10: fails open by default");
    assert_eq!(values()["webhook"]["timeoutSeconds"], 5);
    let modes = &s["properties"]["certificates"]["properties"]["mode"]["enum"];
    assert_eq!(*modes, serde_json::json!(["operator", "certManager", "existingSecret"]));
    assert_eq!(values()["replicaCount"], 2);
    assert_eq!(values()["podDisruptionBudget"]["maxUnavailable"], 1);
    assert_eq!(values()["defaultPolicy"]["enabled"], false, "the cluster default policy is off by default");
}

#[test]
fn schema_and_values_of_the_node_agent_and_the_source() {
    let s = schema();
    let source = &s["properties"]["operator"]["properties"]["source"];
    assert_eq!(source["enum"], serde_json::json!(["auto", "kube-proxy", "prometheus"]), "the `run --source` values a chart can use");
    assert_eq!(values()["operator"]["source"], "auto", "per node: kube-proxy, else the agent, else Prometheus");
    // every enum value is one `safe-termination run --source` accepts
    use clap::ValueEnum as _;
    let kinds: Vec<String> =
        safe_termination::cli::run::SourceKind::value_variants().iter().map(|k| k.to_possible_value().unwrap().get_name().to_string()).collect();
    for v in source["enum"].as_array().unwrap() {
        assert!(kinds.contains(&v.as_str().unwrap().to_string()), "{v} is not a --source value: {kinds:?}");
    }
    let a = &s["properties"]["agent"]["properties"];
    assert_eq!(a["enabled"]["enum"], serde_json::json!(["auto", true, false, "true", "false"]));
    let v = &values()["agent"];
    assert_eq!(v["enabled"], "auto");
    assert_eq!(v["namespace"], "", "the release namespace by default");
    assert_eq!((v["port"].as_u64(), v["healthPort"].as_u64()), (Some(10349), Some(10350)), "the agent's own defaults (src/agent/server.rs)");
    assert_eq!(v["port"].as_u64(), Some(u64::from(safe_termination::agent_contract::protocol::DEFAULT_PORT)));
    assert_eq!(v["healthPort"].as_u64(), Some(u64::from(safe_termination::agent::server::DEFAULT_HEALTH_PORT)));
    assert_eq!(v["kubeProxyUrl"], safe_termination::agent::upstream::DEFAULT_KUBE_PROXY_URL);
    assert_eq!(v["tolerations"], serde_json::json!([{"operator": "Exists"}]), "every node");
    assert_eq!(v["resources"]["requests"], serde_json::json!({"cpu": "5m", "memory": "24Mi"}));
    assert_eq!(v["maxUnavailable"], "10%");
    let ns = namespace_matcher(a["namespace"]["pattern"].as_str().unwrap());
    assert!(ns("") && ns("st-agents") && !ns("Not_A_Namespace") && !ns("-x"));
}

/// A tiny matcher for the namespace pattern `^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$` (no regex
/// crate among the dependencies): checks that the schema's pattern is that one, and applies it.
fn namespace_matcher(pattern: &str) -> impl Fn(&str) -> bool {
    assert_eq!(pattern, "^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$");
    |s: &str| {
        let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        s.is_empty() || (s.starts_with(ok) && s.ends_with(ok) && s.chars().all(|c| ok(c) || c == '-'))
    }
}

/// Dotted keys of values.yaml down to the schema's leaves.
fn leaf_keys(path: &str, schema: &Value, values: &Value, out: &mut Vec<String>) {
    if closed(schema)
        && let Some(obj) = values.as_object()
        && !obj.is_empty()
    {
        for (k, v) in obj {
            let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
            leaf_keys(&p, &schema["properties"][k], v, out);
        }
        return;
    }
    out.push(path.to_string());
}

#[test]
fn every_value_is_in_the_readme_values_table() {
    let readme = read(&chart().join("README.md"));
    let section = readme.split("\n## Values\n").nth(1).expect("a `## Values` section").split("\n## ").next().unwrap();
    let table: BTreeSet<&str> = section.lines().filter_map(|l| l.strip_prefix("| `")).filter_map(|l| l.split_once('`').map(|(k, _)| k)).collect();
    let mut keys = Vec::new();
    leaf_keys("", &schema(), &values(), &mut keys);
    let missing: Vec<&String> = keys.iter().filter(|k| !table.contains(k.as_str())).collect();
    assert!(missing.is_empty(), "values without a row in the README values table: {missing:?}");
    let extra: Vec<&&str> = table.iter().filter(|k| k.contains('.') || values().get(**k).is_some()).filter(|k| !keys.iter().any(|x| x == **k)).collect();
    assert!(extra.is_empty(), "README rows for values that do not exist: {extra:?}");
}

/// Every metric family the operator exports (names as in `# TYPE` lines), with its type.
fn exported_families() -> Vec<(String, String)> {
    use safe_termination::controller::metrics::*;
    use safe_termination::sources::scrape::{ReasonLabel, ScrapeMetrics};
    let t = safe_termination::telemetry::Telemetry::new();
    let (k, c, s) = (KubeProxyMetrics::default(), ControllerMetrics::default(), ScrapeMetrics::default());
    t.register("kube_proxy", |r| k.register(r)).unwrap();
    t.register("controller", |r| c.register(r)).unwrap();
    t.register("scrape", |r| s.register(r)).unwrap();
    // label families print only the series they have: give each one
    let node = NodeLabel { node: "n".into() };
    k.sync_p99.get_or_create(&node).set(1.0);
    k.network_programming_p99.get_or_create(&node).set(1.0);
    k.sync_slow.get_or_create(&node).set(1);
    k.stale.get_or_create(&node).set(1.0);
    k.nodes.get_or_create(&StateLabel { state: "scraped".into() }).set(1);
    let policy = PolicyLabel { namespace: "ns".into(), policy: "p".into() };
    c.recommended_prestop.get_or_create(&policy).set(1);
    c.running_min_prestop.get_or_create(&policy).set(1);
    c.pods.get_or_create(&PolicyStateLabel { namespace: "ns".into(), policy: "p".into(), state: "stale".into() }).set(1);
    c.migration.get_or_create(&MigrationLabel { from: "iptables".into(), to: "nftables".into() }).set(1);
    c.reconciles.get_or_create(&ReconcileResultLabel { result: "ok".into() }).inc();
    s.errors.get_or_create(&ReasonLabel { reason: "refused".into() }).inc();
    t.webhook().observe("mutated", std::time::Duration::from_millis(1), false);
    t.webhook().certificate_reload(true);
    t.encode().lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_once(' ').map(|(n, ty)| (n.to_string(), ty.to_string()))).collect()
}

/// Whether a series name used in PromQL is one the operator exports.
fn is_exported(name: &str, families: &[(String, String)]) -> bool {
    families.iter().any(|(f, ty)| {
        name == f
            || (ty == "counter" && name == format!("{f}_total"))
            || (ty == "histogram" && ["_bucket", "_sum", "_count"].iter().any(|s| name == format!("{f}{s}")))
    })
}

fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("safe_termination_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn the_operator_exports_the_families_the_chart_relies_on() {
    let f = exported_families();
    for name in [
        "safe_termination_kube_proxy_sync_p99_seconds",
        "safe_termination_kube_proxy_stale_seconds",
        "safe_termination_kube_proxy_nodes",
        "safe_termination_controller_propagation_window_seconds",
        "safe_termination_controller_running_pods_min_prestop_seconds",
        "safe_termination_webhook_fail_open_total",
        "safe_termination_webhook_requests_total",
        "safe_termination_webhook_request_duration_seconds_bucket",
    ] {
        assert!(is_exported(name, &f), "{name} not exported: {f:?}");
    }
    // the unit is part of the name: an alert that drops it reads nothing
    assert!(!is_exported("safe_termination_kube_proxy_sync_p99", &f));
}

fn alert_rules() -> Vec<Value> {
    let rules = yaml(&chart().join("files/alerts.yaml"));
    let groups = rules["groups"].as_array().expect("groups");
    groups.iter().flat_map(|g| g["rules"].as_array().unwrap().clone()).collect()
}

/// GitHub's anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn alerts_have_runbooks_summaries_and_real_metrics() {
    let rules = alert_rules();
    let names: Vec<&str> = rules.iter().map(|r| r["alert"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "KubeProxySyncSlow",
            "KubeProxySyncStale",
            "PreStopUndersized",
            "PreStopSleepMissed",
            "SafeTerminationMetricsUnavailable",
            "SafeTerminationWebhookFailOpen"
        ]
    );
    let readme = read(&chart().join("README.md"));
    let anchors: BTreeSet<String> = readme.lines().filter_map(|l| l.strip_prefix("### ")).map(anchor).collect();
    let families = exported_families();
    let default_base = values()["prometheusRule"]["runbookBaseUrl"].as_str().unwrap().to_string();
    for r in &rules {
        let name = r["alert"].as_str().unwrap();
        let ann = &r["annotations"];
        for key in ["summary", "description", "runbook_url"] {
            assert!(ann[key].as_str().is_some_and(|s| s.len() > 10), "{name}: annotation {key}");
        }
        let url = ann["runbook_url"].as_str().unwrap();
        let (base, frag) = url.split_once('#').unwrap_or_else(|| panic!("{name}: runbook_url without an anchor"));
        assert_eq!(base, default_base, "{name}: runbook base (the chart replaces it with prometheusRule.runbookBaseUrl)");
        assert_eq!(frag, name.to_lowercase());
        assert!(anchors.contains(frag), "{name}: no `### {name}` runbook section in the chart README");
        assert!(r["labels"]["severity"].as_str().is_some(), "{name}: severity");
        let expr = r["expr"].as_str().unwrap();
        let used = metric_names(expr);
        assert!(!used.is_empty(), "{name}: uses no operator metric");
        for m in used {
            assert!(is_exported(&m, &families), "{name}: {m} is not a metric the operator exports");
        }
    }
    let by = |n: &str| rules.iter().find(|r| r["alert"] == n).unwrap().clone();
    assert_eq!(by("KubeProxySyncSlow")["for"], "10m");
    assert!(by("KubeProxySyncSlow")["expr"].as_str().unwrap().ends_with("> 1"));
    assert!(by("KubeProxySyncStale")["expr"].as_str().unwrap().ends_with("> 30"));
    let undersized = by("PreStopUndersized")["expr"].as_str().unwrap().to_string();
    assert!(undersized.contains("running_pods_min_prestop_seconds") && undersized.contains("propagation_window_seconds"));
    let missed = by("PreStopSleepMissed")["expr"].as_str().unwrap().to_string();
    assert!(missed.contains("observed_coverage_ratio) < 0.99") && missed.contains("observed_removals) > 0"), "{missed}");
    let unavailable = by("SafeTerminationMetricsUnavailable")["expr"].as_str().unwrap().to_string();
    assert!(unavailable.contains("state=\"failed\"") && unavailable.contains("state=\"scraped\""));
    assert!(by("SafeTerminationWebhookFailOpen")["expr"].as_str().unwrap().contains("increase(safe_termination_webhook_fail_open_total"));
}

#[test]
fn the_dashboard_shows_what_the_issue_asks_with_real_metrics() {
    let d: Value = serde_json::from_str(&read(&chart().join("files/dashboard.json"))).expect("dashboard.json is JSON");
    assert_eq!(d["uid"], "safe-termination");
    assert!(d["schemaVersion"].as_u64().unwrap() >= 30);
    let panels = d["panels"].as_array().unwrap();
    let ids: Vec<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), ids.len(), "panel ids are unique");
    let families = exported_families();
    let mut exprs = Vec::new();
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let title = p["title"].as_str().unwrap();
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}: uses the datasource variable");
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("{title}: no targets"));
        assert!(!targets.is_empty(), "{title}");
        for t in targets {
            let e = t["expr"].as_str().unwrap().to_string();
            for m in metric_names(&e) {
                assert!(is_exported(&m, &families), "{title}: {m} is not a metric the operator exports");
            }
            exprs.push(e);
        }
    }
    let all = exprs.join("\n");
    for needed in [
        "safe_termination_kube_proxy_sync_p99_seconds",
        "safe_termination_kube_proxy_network_programming_p99_seconds",
        "safe_termination_controller_propagation_window_seconds",
        "safe_termination_controller_recommended_prestop_seconds",
        "safe_termination_controller_migration_recommended",
        "safe_termination_webhook_requests_total",
        "safe_termination_webhook_request_duration_seconds_bucket",
        "safe_termination_webhook_fail_open_total",
    ] {
        assert!(all.contains(needed), "the dashboard has no panel on {needed}");
    }
    assert_eq!(d["templating"]["list"][0]["type"], "datasource");
}

#[test]
fn the_dockerfile_builds_a_static_non_root_image() {
    let text = read(&root().join("Dockerfile"));
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
    let froms: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "multi-stage: builder + runtime");
    assert!(froms[0].contains("rust:") && froms[0].contains(" AS build"), "{}", froms[0]);
    assert!(froms[1].starts_with("FROM gcr.io/distroless/static"), "{}", froms[1]);
    assert!(text.contains("-unknown-linux-musl"), "a static musl binary");
    assert!(text.contains("--locked"), "the image builds Cargo.lock's versions");
    assert!(lines.contains(&"USER 65532:65532"), "non-root user 65532 (the chart's runAsUser)");
    assert!(lines.contains(&"ENTRYPOINT [\"/usr/local/bin/safe-termination\"]"));
    assert!(lines.contains(&"CMD [\"run\"]"));
    let last_user = lines.iter().rposition(|l| l.starts_with("USER ")).unwrap();
    let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    assert!(last_user > last_from, "USER is set in the runtime stage");
}
