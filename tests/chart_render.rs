//! The Helm chart without a cluster: `helm lint --strict`, `helm template` with every value set
//! of the chart's `ci/` checked part by part (webhook configuration R10, RBAC without wildcards
//! and covering what the code calls, restricted Pod Security, operator and agent flags that
//! parse as the binaries parse them, the node agent for `true`/`auto`/`false`), and `promtool
//! check rules` / `promtool test rules` on the alert rules. They need helm and promtool of `make
//! k8s-bins` (`make test` builds them: `make test-tools`); without them they fail loudly. The
//! same renderings go to the real control plane in tests/e2e_chart.rs.

mod common;
use common::chart::*;
use common::tools::{run, tool, try_run};
use safe_termination::cli::run::SourceKind;
use serde_json::{Value, json};

#[test]
fn helm_lint_strict_with_every_value_set() {
    run(tool("helm").args(["lint", "--strict"]).arg(chart()), None);
    for f in ci_files() {
        let out = run(tool("helm").args(["lint", "--strict"]).arg(chart()).arg("-f").arg(&f), None);
        assert!(out.contains("0 chart(s) failed"), "{}: {out}", f.display());
    }
    // the schema refuses what R10 forbids
    for bad in ["webhook.timeoutSeconds=10", "webhook.failurePolicy=Sometimes", "certificates.mode=selfSigned", "nope=1"] {
        let r = try_run(tool("helm").args(["template", "x"]).arg(chart()).args(["--set", bad]), None);
        assert!(r.as_ref().is_err_and(|e| e.contains("schema")), "--set {bad} must be refused by values.schema.json: {r:?}");
    }
    let r = try_run(tool("helm").args(["template", "x"]).arg(chart()).args(["--set", "certificates.mode=existingSecret"]), None);
    // values.schema.json refuses both empty fields, naming each
    assert!(
        r.as_ref()
            .is_err_and(|e| e.contains("/certificates/existingSecret/name': minLength") && e.contains("/certificates/existingSecret/caBundle': minLength")),
        "existingSecret needs a name and a caBundle: {r:?}"
    );
    let r = try_run(
        tool("helm").args(["template", "x"]).arg(chart()).args(["--set", "certificates.mode=existingSecret", "--set", "certificates.existingSecret.name=tls"]),
        None,
    );
    assert!(
        r.as_ref().is_err_and(|e| e.contains("/certificates/existingSecret/caBundle': minLength") && !e.contains("existingSecret/name")),
        "existingSecret with a name still needs a caBundle: {r:?}"
    );
}

#[test]
fn the_node_agent_renders_for_true_and_auto_and_not_for_false() {
    let (release, ns, fullname) = ("st", "st-system", "st-safe-termination");
    let run_args = |docs: &[Value]| parse_args(&strs(&find(docs, "Deployment", fullname)["spec"]["template"]["spec"]["containers"][0]["args"]));
    // auto under `helm template`: the lookup of kube-proxy's ConfigMap finds nothing, so the
    // metrics are taken to be on loopback and the agent is installed, in the release namespace
    let d = docs(&helm_template(release, ns, None, &[]));
    let op = run_args(&d);
    assert_eq!(op.source, SourceKind::Auto);
    let a = check_agent(&d, ns, fullname, ns, &op);
    assert_eq!((a.listen.port(), a.health_listen.port()), (10349, 10350));
    check_rbac(&d, ns, fullname, "operator");
    check_deployment(&d, ns, fullname, 2);
    // true, in a namespace of its own, with an existing priority class
    let d = docs(&helm_template(release, ns, None, &["agent.enabled=true", "agent.namespace=st-agents", "agent.priorityClassName=system-node-critical"]));
    let op = run_args(&d);
    check_agent(&d, ns, fullname, "st-agents", &op);
    assert!(of_kind(&d, "PriorityClass").is_empty(), "an existing class: none created");
    assert_eq!(find(&d, "DaemonSet", "st-safe-termination-agent")["spec"]["template"]["spec"]["priorityClassName"], "system-node-critical");
    assert_eq!(find(&d, "Role", "st-safe-termination-agent")["metadata"]["namespace"], "st-agents");
    check_rbac(&d, ns, fullname, "operator");
    check_deployment(&d, ns, fullname, 2);
    // observing removals: the operator asks the agents, which read their node's rules from an
    // image of their own
    let d = docs(&helm_template(
        release,
        ns,
        None,
        &["agent.enabled=true", "agent.observeRemovals=true", "agent.image.repository=registry.example/st-agent", "agent.image.tag=1.2.3"],
    ));
    let op = run_args(&d);
    assert!(op.observe_removals);
    let a = check_agent(&d, ns, fullname, ns, &op);
    assert_eq!((a.nft_binary.as_str(), a.iptables_nft_binary.as_str(), a.iptables_legacy_binary.as_str()), ("nft", "iptables-nft", "iptables-legacy"));
    assert_eq!(find(&d, "DaemonSet", "st-safe-termination-agent")["spec"]["template"]["spec"]["containers"][0]["image"], "registry.example/st-agent:1.2.3");
    check_deployment(&d, ns, fullname, 2);
    assert!(of_kind(&d, "PodMonitor").is_empty(), "no PodMonitor without serviceMonitor.enabled");
    // reading Cilium's maps: the host's bpffs (where Cilium's --bpf-root put it) read-only at
    // the agent's --cilium-bpf-root, and CAP_BPF (check_agent); nothing without observeRemovals
    let d = docs(&helm_template(
        release,
        ns,
        None,
        &["agent.enabled=true", "agent.observeRemovals=true", "agent.cilium.readMaps=true", "agent.cilium.hostBpfRoot=/run/cilium/bpffs"],
    ));
    let op = run_args(&d);
    let a = check_agent(&d, ns, fullname, ns, &op);
    assert_eq!(a.data_plane, safe_termination::cli::agent::DataPlaneArg::Auto, "auto: Cilium where kube-proxy is absent");
    let pod = &find(&d, "DaemonSet", "st-safe-termination-agent")["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "bpf-maps").unwrap()["hostPath"]["path"], "/run/cilium/bpffs");
    let d = docs(&helm_template(release, ns, None, &["agent.enabled=true", "agent.cilium.readMaps=true"]));
    let op = run_args(&d);
    check_agent(&d, ns, fullname, ns, &op);
    let pod = &find(&d, "DaemonSet", "st-safe-termination-agent")["spec"]["template"]["spec"];
    assert!(pod["volumes"].as_array().unwrap().iter().all(|v| v["name"] != "bpf-maps"), "no observer, no bpffs");
    // with the Prometheus Operator's monitors on, a PodMonitor scrapes the agents' health port
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(values.path(), "serviceMonitor:\n  enabled: true\n").unwrap();
    let d = docs(&helm_template(release, ns, Some(values.path()), &["agent.enabled=true", "agent.namespace=st-agents"]));
    let pm = find(&d, "PodMonitor", "st-safe-termination-agent");
    assert_eq!(pm["metadata"]["namespace"], "st-agents");
    assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["port"], "healthz");
    assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["path"], "/metrics");
    let labels = &find(&d, "DaemonSet", "st-safe-termination-agent")["spec"]["template"]["metadata"]["labels"];
    for (k, v) in pm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "the PodMonitor selects the agents' pods ({k})");
    }
    // false, and auto where the operator would not read agents: no agent, no agent flags
    for sets in [&["agent.enabled=false"][..], &["operator.source=kube-proxy"], &["certificates.mode=certManager"]] {
        let d = docs(&helm_template(release, ns, None, sets));
        for kind in ["DaemonSet", "PriorityClass"] {
            assert!(of_kind(&d, kind).is_empty(), "{sets:?}: no {kind}");
        }
        assert!(d.iter().all(|o| o["metadata"]["name"] != "st-safe-termination-agent"), "{sets:?}: no agent Role");
        let op = run_args(&d);
        assert!(op.agent_cert_secret.is_none() && op.agent_namespace.is_none(), "{sets:?}");
        check_deployment(&d, ns, fullname, 2);
    }
    // what cannot work is refused at render time
    for (bad, why) in [
        ("agent.enabled=yes", "schema"),
        ("agent.namespace=Not_A_Namespace", "schema"),
        ("agent.enabled=true,operator.source=kube-proxy", "needs operator.source=auto"),
        ("agent.enabled=true,certificates.mode=certManager", "needs certificates.mode=operator"),
        ("agent.healthPort=10349", "must differ"),
        ("agent.cilium.readMaps=yes", "schema"),
        ("agent.cilium.hostBpfRoot=sys/fs/bpf", "schema"),
    ] {
        let r = try_run(tool("helm").args(["template", "x"]).arg(chart()).args(["--set", bad]), None);
        assert!(r.as_ref().is_err_and(|e| e.contains(why)), "--set {bad} must be refused ({why}): {r:?}");
    }
}

#[test]
fn the_image_pinned_by_digest_wins_over_the_tag() {
    // what docs/install.md's install from a registry sets: image.repository and image.digest
    // (make image-index prints REPOSITORY@DIGEST); the agents run the operator's image
    let (release, ns, fullname) = ("st", "st-system", "st-safe-termination");
    let images = |d: &[Value]| {
        let image = |kind: &str, name: &str| find(d, kind, name)["spec"]["template"]["spec"]["containers"][0]["image"].as_str().unwrap().to_string();
        (image("Deployment", fullname), image("DaemonSet", "st-safe-termination-agent"))
    };
    let app_version = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let app_version = app_version.lines().find_map(|l| l.strip_prefix("appVersion:")).unwrap().trim().trim_matches('"').to_string();
    let default = format!("ghcr.io/safe-termination/safe-termination:{app_version}");
    assert_eq!(images(&docs(&helm_template(release, ns, None, &["agent.enabled=true"]))), (default.clone(), default));
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let pinned = format!("127.0.0.1:5000/safe-termination@{digest}");
    let sets = ["agent.enabled=true", "image.repository=127.0.0.1:5000/safe-termination", "image.tag=9.9.9", &format!("image.digest={digest}")];
    assert_eq!(images(&docs(&helm_template(release, ns, None, &sets))), (pinned.clone(), pinned.clone()));
    // an agent image of its own keeps its tag
    let sets = [&sets[..], &["agent.image.repository=registry.example/st-agent", "agent.image.tag=1.2.3"]].concat();
    assert_eq!(images(&docs(&helm_template(release, ns, None, &sets))), (pinned, "registry.example/st-agent:1.2.3".to_string()));
    // a digest is sha256:<64 hex>, nothing else (a tag given as digest would render repo@latest)
    for bad in ["image.digest=latest", "image.digest=sha256:abc", "image.digest=0.1.0"] {
        let r = try_run(tool("helm").args(["template", "x"]).arg(chart()).args(["--set", bad]), None);
        assert!(r.as_ref().is_err_and(|e| e.contains("schema")), "--set {bad} must be refused by values.schema.json: {r:?}");
    }
}

#[test]
fn agent_auto_reads_kube_proxys_metrics_bind_address() {
    // the chart's own helper, rendered by helm on each config.conf (the lookup itself needs a
    // cluster: README.md "Node agent")
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("templates")).unwrap();
    std::fs::write(dir.path().join("Chart.yaml"), "apiVersion: v2\nname: bind\nversion: 0.0.1\n").unwrap();
    std::fs::copy(chart().join("templates/_helpers.tpl"), dir.path().join("templates/_helpers.tpl")).unwrap();
    std::fs::write(
        dir.path().join("templates/cases.yaml"),
        "{{- range $i, $c := .Values.cases }}\ncase{{ $i }}: {{ include \"safe-termination.configBindsMetricsOnLoopback\" $c | quote }}\n{{- end }}\n",
    )
    .unwrap();
    let cases: [(&str, bool); 11] = [
        ("", true),
        ("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmetricsBindAddress: \"\"\nmode: iptables\n", true),
        ("metricsBindAddress: 127.0.0.1:10249\n", true),
        ("metricsBindAddress: 127.0.0.2:10249\n", true),
        ("metricsBindAddress: localhost:10249\n", true),
        ("metricsBindAddress: '[::1]:10249'\n", true),
        ("not: [yaml", true),
        ("metricsBindAddress: 0.0.0.0:10249\n", false),
        ("metricsBindAddress: '[::]:10249'\n", false),
        ("metricsBindAddress: 10.0.0.5:10249\n", false),
        ("kind: KubeProxyConfiguration\nmetricsBindAddress: 0.0.0.0\n", false),
    ];
    let values = dir.path().join("values.json");
    std::fs::write(&values, json!({"cases": cases.iter().map(|c| c.0).collect::<Vec<_>>()}).to_string()).unwrap();
    let out = run(tool("helm").args(["template", "x"]).arg(dir.path()).arg("-f").arg(&values), None);
    let got = docs(&out);
    for (i, (conf, loopback)) in cases.iter().enumerate() {
        let want = if *loopback { "true" } else { "" };
        assert_eq!(got[0][format!("case{i}")], want, "config.conf {conf:?}: agent needed = {loopback}");
    }
}

#[test]
fn every_value_set_renders_r10_least_privilege_and_restricted_pods() {
    let (release, ns, fullname) = ("st", "st-system", "st-safe-termination");
    for f in ci_files() {
        let name = stem(&f);
        let values: Value = serde_saphyr::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let out = helm_template(release, ns, Some(&f), &[]);
        let docs = docs(&out);
        let mode = values["certificates"]["mode"].as_str().unwrap_or("operator");
        let failure = values["webhook"]["failurePolicy"].as_str().unwrap_or("Ignore");
        let replicas = values["replicaCount"].as_u64().unwrap_or(2);
        check_webhook(&docs, ns, fullname, mode, failure);
        check_rbac(&docs, ns, fullname, mode);
        let args = check_deployment(&docs, ns, fullname, replicas);
        // mode-specific objects and flags
        let secret_name = find(&docs, "Deployment", fullname)["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"].clone();
        match mode {
            "operator" => {
                assert_eq!(args.cert_secret.as_deref(), Some("st-safe-termination-tls"), "{name}");
                assert_eq!(args.webhook_service, fullname);
                assert_eq!(args.webhook_configuration.as_deref(), Some(fullname));
                assert!(!args.write_cert_files, "in a pod the kubelet updates the mounted Secret");
                assert_eq!(secret_name, "st-safe-termination-tls");
                assert!(of_kind(&docs, "Certificate").is_empty());
            }
            "certManager" => {
                assert!(args.cert_secret.is_none(), "{name}: cert-manager owns the Secret");
                let cert = find(&docs, "Certificate", "st-safe-termination-tls");
                assert_eq!(cert["spec"]["secretName"], secret_name);
                assert!(strs(&cert["spec"]["dnsNames"]).contains(&format!("{fullname}.{ns}.svc")));
                assert_eq!(cert["spec"]["issuerRef"]["name"], "st-safe-termination-ca");
                assert_eq!(find(&docs, "Issuer", "st-safe-termination-ca")["spec"]["ca"]["secretName"], "st-safe-termination-ca");
                assert_eq!(find(&docs, "Certificate", "st-safe-termination-ca")["spec"]["isCA"], true);
                assert_eq!(find(&docs, "Issuer", "st-safe-termination-selfsigned")["spec"]["selfSigned"], json!({}));
            }
            _ => {
                assert!(args.cert_secret.is_none());
                assert_eq!(secret_name, values["certificates"]["existingSecret"]["name"]);
            }
        }
        if values["defaultPolicy"]["enabled"] == true {
            let p = find(&docs, "TerminationPolicy", "cluster-default");
            assert_eq!(p["metadata"]["namespace"], ns);
            assert_eq!(p["spec"], values["defaultPolicy"]["spec"]);
            assert_eq!(args.default_policy.as_deref(), Some("st-system/cluster-default"));
        } else {
            assert!(args.default_policy.is_none() && of_kind(&docs, "TerminationPolicy").is_empty(), "{name}: no default policy");
        }
        if values["operator"]["source"] == "prometheus" {
            assert_eq!(format!("{:?}", args.source), "Prometheus");
            assert_eq!(args.prometheus_url.as_deref(), values["operator"]["prometheusUrl"].as_str());
            let sm = find(&docs, "ServiceMonitor", fullname);
            assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
            assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"], true);
            assert_eq!(sm["metadata"]["labels"]["release"], "kube-prometheus-stack");
            let svc = find(&docs, "Service", fullname);
            assert!(svc["spec"]["ports"].as_array().unwrap().iter().any(|p| p["name"] == "metrics" && p["targetPort"] == "admin"));
            // the PrometheusRule is files/alerts.yaml with the runbook base replaced
            let rule = find(&docs, "PrometheusRule", fullname);
            let plain = std::fs::read_to_string(chart().join("files/alerts.yaml")).unwrap();
            let base = values["prometheusRule"]["runbookBaseUrl"].as_str().unwrap().trim_end_matches('/');
            let expected: Value = serde_saphyr::from_str(
                &plain.replace("https://github.com/safe-termination/safe-termination/blob/main/charts/safe-termination/README.md", base),
            )
            .unwrap();
            assert_eq!(rule["spec"]["groups"], expected["groups"]);
            assert!(rule["spec"].to_string().contains("https://runbooks.example.com/safe-termination#kubeproxysyncslow"));
            let cm = find(&docs, "ConfigMap", "st-safe-termination-dashboard");
            assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
            let dash: Value = serde_json::from_str(cm["data"]["safe-termination.json"].as_str().unwrap()).unwrap();
            let file: Value = serde_json::from_str(&std::fs::read_to_string(chart().join("files/dashboard.json")).unwrap()).unwrap();
            assert_eq!(dash, file);
        } else {
            assert_eq!(format!("{:?}", args.source), "Auto", "{name}: the default source");
            for k in ["ServiceMonitor", "PrometheusRule", "ConfigMap"] {
                assert!(of_kind(&docs, k).is_empty(), "{name}: {k} is optional and off");
            }
        }
        // the node agents: with source auto and the operator's CA, unless turned off (under
        // `helm template` auto finds no kube-proxy ConfigMap: installed)
        let agent = args.source == SourceKind::Auto && mode == "operator" && values["agent"]["enabled"] != false;
        assert_eq!(of_kind(&docs, "DaemonSet").len(), usize::from(agent), "{name}: agent DaemonSet");
        if agent {
            let ns_agent = values["agent"]["namespace"].as_str().filter(|n| !n.is_empty()).unwrap_or(ns);
            check_agent(&docs, ns, fullname, ns_agent, &args);
        } else {
            assert!(args.agent_cert_secret.is_none() && of_kind(&docs, "PriorityClass").is_empty(), "{name}: no agent, no agent flags");
        }
        eprintln!("{name}: {} objects checked", docs.len());
    }
}

#[test]
fn promtool_checks_and_unit_tests_the_alert_rules() {
    let out = run(tool("promtool").args(["check", "rules"]).arg(chart().join("files/alerts.yaml")), None);
    assert!(out.contains("SUCCESS: 6 rules found"), "{out}");
    let out = run(tool("promtool").args(["test", "rules"]).arg(chart().join("tests/alerts_test.yaml")), None);
    assert!(out.contains("SUCCESS"), "{out}");
    // the rendered PrometheusRule's groups are a valid rules file too
    let rendered = helm_template("st", "st-system", Some(&chart().join("ci/prometheus-values.yaml")), &[]);
    let rule = docs(&rendered).into_iter().find(|d| d["kind"] == "PrometheusRule").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, serde_json::to_string(&rule["spec"]).unwrap()).unwrap();
    let out = run(tool("promtool").args(["check", "rules"]).arg(&file), None);
    assert!(out.contains("SUCCESS: 6 rules found"), "{out}");
}
