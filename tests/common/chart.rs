//! The Helm chart's renderings, read and checked: `helm template` with a values file or `--set`s,
//! the objects of a rendering, and the checks of each part (the webhook configuration's R10, RBAC
//! least privilege against what the code calls, the Deployment's flags parsed as the binary parses
//! them, the node agent's DaemonSet). Used by tests/chart_render.rs (helm only) and
//! tests/e2e_chart.rs (the same renderings on the control plane).

use super::tools::{root, run, tool};
use base64::Engine as _;
use safe_termination::cli::agent::AgentArgs;
use safe_termination::cli::run::RunArgs;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// tools and files

pub fn chart() -> PathBuf {
    root().join("charts/safe-termination")
}

/// The YAML documents of a multi-document stream (empty ones dropped).
pub fn docs(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines().chain(std::iter::once("---")) {
        if line == "---" {
            let v: Value = serde_saphyr::from_str(&cur).unwrap_or_else(|e| panic!("bad YAML document: {e}\n{cur}"));
            if v.is_object() {
                out.push(v);
            }
            cur.clear();
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    out
}

pub fn ci_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(chart().join("ci")).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    assert!(v.len() >= 6, "ci value sets: {v:?}");
    v
}

pub fn stem(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().trim_end_matches("-values.yaml").to_string()
}

pub fn helm_template(release: &str, ns: &str, values: Option<&Path>, sets: &[&str]) -> String {
    let mut c = tool("helm");
    c.args(["template", release]).arg(chart()).args(["--namespace", ns]);
    if let Some(v) = values {
        c.arg("-f").arg(v);
    }
    for s in sets {
        c.args(["--set-string", s]);
    }
    run(&mut c, None)
}

pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name).unwrap_or_else(|| {
        panic!("no {kind} {name} in the rendering: {:?}", docs.iter().map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"])).collect::<Vec<_>>())
    })
}

pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

pub fn strs(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect()).unwrap_or_default()
}

pub fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

pub fn unb64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

// ---------------------------------------------------------------------------------------------
// checks of a rendering

/// The flags of `safe-termination run`, parsed exactly as the binary parses them.
#[derive(clap::Parser, Debug)]
pub struct RunCli {
    /// The global `--log-format` of the binary.
    #[arg(long)]
    log_format: Option<String>,
    #[command(flatten)]
    run: RunArgs,
}

pub fn parse_args(args: &[String]) -> RunArgs {
    use clap::Parser as _;
    assert_eq!(args.first().map(String::as_str), Some("run"), "the container runs `safe-termination run`: {args:?}");
    let cli = RunCli::try_parse_from(std::iter::once("safe-termination").chain(args[1..].iter().map(String::as_str)))
        .unwrap_or_else(|e| panic!("the chart's operator flags do not parse: {e}\n{args:?}"));
    assert!(matches!(cli.log_format.as_deref(), Some("json" | "text")));
    cli.run
}

/// R10 and the chart's routing rules on the rendered MutatingWebhookConfiguration.
pub fn check_webhook(docs: &[Value], release_ns: &str, fullname: &str, mode: &str, failure_policy: &str) {
    let hooks = of_kind(docs, "MutatingWebhookConfiguration");
    assert_eq!(hooks.len(), 1);
    let cfg = hooks[0];
    assert_eq!(cfg["metadata"]["name"], fullname);
    let webhooks = cfg["webhooks"].as_array().unwrap();
    assert_eq!(webhooks.len(), 1);
    let w = &webhooks[0];
    assert_eq!(w["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(w["sideEffects"], "None");
    assert_eq!(w["failurePolicy"], failure_policy);
    let timeout = w["timeoutSeconds"].as_u64().unwrap();
    assert!((1..=5).contains(&timeout), "R10: timeoutSeconds <= 5: {timeout}");
    assert_eq!(w["reinvocationPolicy"], "IfNeeded");
    assert_eq!(
        w["rules"],
        json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}]),
        "pods CREATE only, no subresources"
    );
    assert_eq!(w["clientConfig"]["service"], json!({"name": fullname, "namespace": release_ns, "path": "/mutate", "port": 443}));
    assert!(w["clientConfig"].get("url").is_none());
    let exprs = w["namespaceSelector"]["matchExpressions"].as_array().unwrap();
    let names = exprs.iter().find(|e| e["key"] == "kubernetes.io/metadata.name").expect("namespace-name exclusion");
    assert_eq!(names["operator"], "NotIn");
    let excluded = strs(&names["values"]);
    assert!(excluded.contains(&"kube-system".to_string()) && excluded.contains(&release_ns.to_string()), "{excluded:?}");
    assert!(exprs.contains(&json!({"key": safe_termination::core::annotations::LABEL_IGNORE, "operator": "NotIn", "values": ["true"]})), "opt-out label");
    assert!(
        w["objectSelector"]["matchExpressions"]
            .as_array()
            .unwrap()
            .contains(&json!({"key": safe_termination::core::annotations::LABEL_IGNORE, "operator": "NotIn", "values": ["true"]}))
    );
    let conds = w["matchConditions"].as_array().unwrap();
    let all: Vec<&str> = conds.iter().map(|c| c["expression"].as_str().unwrap()).collect();
    assert!(all.iter().any(|e| e.contains("'kubernetes.io/config.mirror' in object.metadata.annotations")), "R8 mirror pods: {all:?}");
    assert!(all.iter().any(|e| e.contains("object.spec.restartPolicy == 'Always'")), "R7 run-to-completion pods: {all:?}");
    let ann = &cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"];
    match mode {
        "existingSecret" => {
            let ca = w["clientConfig"]["caBundle"].as_str().expect("caBundle from the values");
            assert!(String::from_utf8(unb64(ca)).unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
            assert!(ann.is_null());
        }
        "certManager" => {
            assert_eq!(*ann, json!(format!("{release_ns}/{fullname}-tls")));
            assert!(w["clientConfig"].get("caBundle").is_none(), "cainjector owns caBundle");
        }
        _ => {
            assert!(w["clientConfig"].get("caBundle").is_none(), "the operator owns caBundle");
            assert!(ann.is_null());
        }
    }
}

const ALLOWED_VERBS: [&str; 6] = ["get", "list", "watch", "create", "patch", "update"];

/// Whether some rule of a (Cluster)Role bound to the ServiceAccount allows `verb` on `resource`
/// of `group` named `name` in `namespace` (None: cluster-wide / any namespace).
pub fn allows(docs: &[Value], sa: (&str, &str), namespace: Option<&str>, group: &str, resource: &str, verb: &str, name: Option<&str>) -> bool {
    let bound = |kind: &str, role: &str, ns: Option<&str>| {
        docs.iter().any(|b| {
            let bkind = if kind == "ClusterRole" { "ClusterRoleBinding" } else { "RoleBinding" };
            b["kind"] == bkind
                && b["roleRef"]["kind"] == kind
                && b["roleRef"]["name"] == role
                && (kind == "ClusterRole" || b["metadata"]["namespace"].as_str() == ns)
                && b["subjects"].as_array().unwrap().iter().any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa.1 && s["namespace"] == sa.0)
        })
    };
    docs.iter().filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role").any(|role| {
        let kind = role["kind"].as_str().unwrap();
        let rns = role["metadata"]["namespace"].as_str();
        if kind == "Role" && (namespace.is_none() || rns != namespace) {
            return false;
        }
        if !bound(kind, role["metadata"]["name"].as_str().unwrap(), rns) {
            return false;
        }
        role["rules"].as_array().unwrap().iter().any(|r| {
            strs(&r["apiGroups"]).contains(&group.to_string())
                && strs(&r["resources"]).contains(&resource.to_string())
                && strs(&r["verbs"]).contains(&verb.to_string())
                && (r.get("resourceNames").is_none() || name.is_some_and(|n| strs(&r["resourceNames"]).contains(&n.to_string())))
        })
    })
}

/// No wildcards, no dangerous verbs, and exactly the access the operator's code needs.
pub fn check_rbac(docs: &[Value], release_ns: &str, fullname: &str, mode: &str) {
    let roles: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role").collect();
    let agent = of_kind(docs, "DaemonSet").first().map(|d| d["metadata"]["namespace"].as_str().unwrap().to_string());
    assert_eq!(roles.len(), 3 + usize::from(agent.is_some()), "one ClusterRole, a Role in the release namespace, one in kube-proxy's (and one in the agents')");
    for role in &roles {
        for r in role["rules"].as_array().unwrap() {
            for field in ["verbs", "resources", "apiGroups", "resourceNames"] {
                for v in strs(&r[field]) {
                    assert!(!v.contains('*'), "{} {}: wildcard in {field}: {r}", role["kind"], role["metadata"]["name"]);
                }
            }
            assert!(r.get("nonResourceURLs").is_none(), "{r}");
            for v in strs(&r["verbs"]) {
                // the one delete: the operator's own MutatingAdmissionPolicy and binding, by name
                // (removed when the webhook backend is active again)
                let own_policy_delete = v == "delete"
                    && strs(&r["resources"]) == ["mutatingadmissionpolicies", "mutatingadmissionpolicybindings"]
                    && strs(&r["resourceNames"]).len() == 1;
                assert!(ALLOWED_VERBS.contains(&v.as_str()) || own_policy_delete, "verb {v} (no delete, escalate, bind, impersonate): {r}");
            }
            let res = strs(&r["resources"]);
            if res.contains(&"secrets".to_string()) {
                assert_eq!(role["kind"], "Role", "Secrets only in the release namespace (and the agents'): {r}");
                let ns = role["metadata"]["namespace"].as_str();
                assert!(ns == Some(release_ns) || ns == agent.as_deref(), "Secrets only in the release namespace (and the agents'): {r}");
                let verbs = strs(&r["verbs"]);
                assert!(verbs == ["create"] || r.get("resourceNames").is_some(), "reading Secrets only by name: {r}");
            }
            if strs(&r["verbs"]).iter().any(|v| v == "update" || v == "patch") && r.get("resourceNames").is_none() {
                let ok = ["terminationpolicies/status", "events"].iter().any(|x| res.contains(&x.to_string()));
                assert!(ok, "writes without resourceNames only to policy status and events: {r}");
            }
        }
    }
    let sa = (release_ns, fullname);
    let need = |ns: Option<&str>, group: &str, resource: &str, verbs: &[&str], name: Option<&str>| {
        for v in verbs {
            assert!(allows(docs, sa, ns, group, resource, v, name), "the operator needs {v} {group}/{resource} {name:?} in {ns:?}");
        }
    };
    // every API call of src/controller, src/sources, src/certs/leader.rs and src/cli/run.rs
    need(None, "safetermination.io", "terminationpolicies", &["list", "watch"], None);
    need(None, "safetermination.io", "terminationpolicies/status", &["patch"], None);
    need(None, "events.k8s.io", "events", &["create", "patch"], None);
    need(None, "", "pods", &["list", "watch"], None);
    need(None, "", "services", &["list", "watch"], None);
    need(None, "discovery.k8s.io", "endpointslices", &["list", "watch"], None);
    need(Some(release_ns), "coordination.k8s.io", "leases", &["create"], None);
    need(Some(release_ns), "coordination.k8s.io", "leases", &["get", "patch"], Some(&format!("{fullname}-leader")));
    need(Some(release_ns), "", "pods", &["create"], None);
    need(Some("kube-system"), "", "configmaps", &["get"], Some("kube-proxy"));
    need(Some("kube-system"), "", "configmaps", &["get"], Some("kube-proxy-config"));
    // preStop handler Wait (src/controller/wait.rs): who asks, and each namespace's ConfigMap
    need(None, "authentication.k8s.io", "tokenreviews", &["create"], None);
    // the waiters' address comes from the Service index's watch (list, watch): no get
    assert!(!allows(docs, sa, Some(release_ns), "", "services", "get", Some(fullname)), "no get on Services");
    need(Some("shop"), "", "configmaps", &["create"], None);
    need(Some("shop"), "", "configmaps", &["patch"], Some("safe-termination-wait"));
    // ... and no more than that
    assert!(!allows(docs, sa, Some("shop"), "", "configmaps", "patch", Some("app-config")), "patch only the waiter's ConfigMap");
    assert!(!allows(docs, sa, Some("shop"), "", "configmaps", "get", Some("app-config")), "no ConfigMap read");
    assert!(!allows(docs, sa, Some("kube-system"), "", "configmaps", "get", Some("coredns")));
    assert!(!allows(docs, sa, Some("default"), "", "pods", "create", None), "pod create only in the release namespace");
    assert!(!allows(docs, sa, None, "", "secrets", "list", None));
    let secret = format!("{fullname}-tls");
    let operator = mode == "operator";
    for (verb, name) in [("create", None), ("get", Some(secret.as_str())), ("update", Some(secret.as_str()))] {
        assert_eq!(allows(docs, sa, Some(release_ns), "", "secrets", verb, name), operator, "{verb} secrets in mode {mode}");
    }
    assert!(!allows(docs, sa, Some(release_ns), "", "secrets", "get", Some("someone-elses")));
    if let Some(agent_ns) = &agent {
        // the agents' certificate Secret, written by the operator (src/certs/leader.rs)
        let name = format!("{fullname}-agent-tls");
        need(Some(agent_ns), "", "secrets", &["create"], None);
        need(Some(agent_ns), "", "secrets", &["get", "update"], Some(&name));
        assert!(!allows(docs, sa, Some(agent_ns), "", "secrets", "get", Some("someone-elses")));
    }
    for verb in ["get", "patch"] {
        assert_eq!(
            allows(docs, sa, None, "admissionregistration.k8s.io", "mutatingwebhookconfigurations", verb, Some(fullname)),
            operator,
            "{verb} the webhook configuration in mode {mode}"
        );
        assert!(!allows(docs, sa, None, "admissionregistration.k8s.io", "mutatingwebhookconfigurations", verb, Some("istio-sidecar-injector")));
    }
}

/// Pod Security (restricted), probes, preStop, grace, downward API, TLS mount, PDB, Service.
pub fn check_deployment(docs: &[Value], release_ns: &str, fullname: &str, replicas: u64) -> RunArgs {
    let d = find(docs, "Deployment", fullname);
    assert_eq!(d["metadata"]["namespace"], release_ns);
    assert_eq!(d["spec"]["replicas"], replicas);
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(pod["serviceAccountName"], fullname);
    let spread = pod["topologySpreadConstraints"].as_array().unwrap();
    let nodes = spread.iter().find(|t| t["topologyKey"] == "kubernetes.io/hostname").expect("spread over nodes");
    // (no ci/ value set overrides it) hard, honouring taints: else a tainted control-plane node blocks
    assert_eq!(nodes["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(nodes["nodeTaintsPolicy"], "Honor");
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["runAsUser"], 65532);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(c["resources"]["requests"]["cpu"].is_string() && c["resources"]["requests"]["memory"].is_string(), "resource requests");
    let port = |name: &str| {
        c["ports"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("container port {name}"))["containerPort"].as_u64().unwrap()
    };
    assert_eq!(c["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "admin"}));
    assert_eq!(c["livenessProbe"]["httpGet"], json!({"path": "/livez", "port": "admin"}));
    let sleep = c["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64().expect("a native preStop sleep (no shell in the image)");
    assert!(sleep >= 5, "long enough for the endpoint to leave the Service: {sleep}");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let env: BTreeMap<String, Value> = c["env"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap().to_string(), e.clone())).collect();
    assert_eq!(env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.namespace");
    assert_eq!(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
    let args = parse_args(&strs(&c["args"]));
    assert!(grace >= sleep + args.serving.drain_seconds, "grace {grace} covers the sleep {sleep} and the drain {}", args.serving.drain_seconds);
    assert_eq!(args.serving.listen.port() as u64, port("webhook"));
    assert_eq!(args.serving.admin_listen.port() as u64, port("admin"));
    assert!(args.serving.request_timeout_ms < 5000, "the webhook answers before the API server's timeout");
    // the TLS Secret is mounted where --tls-cert-file/--tls-key-file point
    let mount = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "tls").expect("tls mount");
    let dir = Path::new(mount["mountPath"].as_str().unwrap());
    assert_eq!(mount["readOnly"], true);
    assert_eq!(args.serving.tls_cert_file, dir.join("tls.crt"));
    assert_eq!(args.serving.tls_key_file, dir.join("tls.key"));
    let vol = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "tls").unwrap();
    let mut items = vec![json!({"key": "tls.crt", "path": "tls.crt"}), json!({"key": "tls.key", "path": "tls.key"})];
    if !of_kind(docs, "DaemonSet").is_empty() {
        // the node agents' mutual TLS: the CA certificate and the operator's client pair
        items.extend(["ca.crt", "client.crt", "client.key"].map(|k| json!({"key": k, "path": k})));
        assert_eq!(
            (args.agent_ca_file.clone(), args.agent_client_cert_file.clone(), args.agent_client_key_file.clone()),
            (dir.join("ca.crt"), dir.join("client.crt"), dir.join("client.key"))
        );
    }
    assert_eq!(vol["secret"]["items"], json!(items), "never the CA key");
    assert_eq!(args.lease_name, format!("{fullname}-leader"));
    // PDB and Service
    let pdb = find(docs, "PodDisruptionBudget", fullname);
    assert_eq!(pdb["spec"]["maxUnavailable"], 1, "a drain can always evict a replica");
    let labels = &d["spec"]["template"]["metadata"]["labels"];
    for (k, v) in pdb["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(labels[k], *v);
    }
    let svc = find(docs, "Service", fullname);
    let https = svc["spec"]["ports"].as_array().unwrap().iter().find(|p| p["port"] == 443).expect("Service port 443");
    assert_eq!(https["targetPort"], "webhook");
    // the preStop waiters' own socket (docs/wait.md): the flag, the container port and the
    // Service's port `wait`, apart from the webhook's
    let wait = svc["spec"]["ports"].as_array().unwrap().iter().find(|p| p["name"] == "wait").expect("Service port wait");
    assert_eq!((wait["targetPort"].as_str(), wait["port"].as_u64()), (Some("wait"), Some(u64::from(args.wait_listen.port()))));
    assert_eq!(port("wait"), u64::from(args.wait_listen.port()));
    assert_ne!(port("wait"), port("webhook"));
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(labels[k], *v);
    }
    args
}

/// The flags of `safe-termination agent`, parsed exactly as the binary parses them.
#[derive(clap::Parser, Debug)]
pub struct AgentCli {
    /// The global `--log-format` of the binary.
    #[arg(long)]
    log_format: Option<String>,
    #[command(flatten)]
    agent: AgentArgs,
}

/// The node agent DaemonSet (in `agent_ns`) and how the operator (flags `op`) finds and
/// authenticates to it: hostNetwork, every node, priority, tiny resources, restricted-style
/// container, probes on the health port, flags that parse and match the ports and the mounted
/// Secret, labels the operator's Service/PDB/Deployment never select.
pub fn check_agent(docs: &[Value], release_ns: &str, fullname: &str, agent_ns: &str, op: &RunArgs) -> AgentArgs {
    use clap::Parser as _;
    let d = find(docs, "DaemonSet", &format!("{fullname}-agent"));
    assert_eq!(d["metadata"]["namespace"], agent_ns);
    let strategy = &d["spec"]["updateStrategy"];
    assert_eq!(strategy["type"], "RollingUpdate");
    assert_eq!(strategy["rollingUpdate"]["maxUnavailable"], "10%");
    assert_eq!(strategy["rollingUpdate"]["maxSurge"], 0, "host ports: no surge");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(pod["automountServiceAccountToken"], false, "the agent makes no API call");
    assert!(pod["tolerations"].as_array().unwrap().contains(&json!({"operator": "Exists"})), "every node, tainted ones too");
    // observing removals, the agents list netfilter rules: root with NET_ADMIN and NET_RAW only
    let observing = op.observe_removals;
    assert_eq!(pod["securityContext"]["runAsNonRoot"], !observing);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let priority = pod["priorityClassName"].as_str().expect("a priority class");
    match of_kind(docs, "PriorityClass").as_slice() {
        [pc] => {
            assert_eq!(pc["metadata"]["name"], priority);
            assert_eq!(priority, format!("{fullname}-node-critical"));
            assert_eq!(pc["value"], 1_000_000);
            assert_eq!(pc["globalDefault"], false);
        }
        [] => assert!(!priority.is_empty(), "an existing priority class"),
        more => panic!("one PriorityClass at most: {more:?}"),
    }
    let c = &pod["containers"].as_array().unwrap()[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], !observing);
    assert_eq!(sc["runAsUser"], if observing { 0 } else { 65532 });
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    // reading Cilium's maps (agent.cilium.readMaps): the host's bpffs, and CAP_BPF for the
    // runtime's default seccomp profile
    let bpf_mount = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "bpf-maps").cloned();
    let bpf_volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "bpf-maps").cloned();
    assert_eq!(bpf_mount.is_some(), bpf_volume.is_some(), "the bpffs volume and its mount go together");
    if observing && bpf_mount.is_some() {
        assert_eq!(sc["capabilities"]["add"], json!(["NET_ADMIN", "NET_RAW", "BPF"]));
    } else if observing {
        assert_eq!(sc["capabilities"]["add"], json!(["NET_ADMIN", "NET_RAW"]));
    } else {
        assert!(sc["capabilities"].get("add").is_none());
        assert!(bpf_mount.is_none(), "the agents read no data plane: no bpffs");
    }
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["resources"]["requests"], json!({"cpu": "5m", "memory": "24Mi"}));
    assert_eq!(c["resources"]["limits"], json!({"memory": "64Mi"}));
    let env: BTreeMap<String, Value> = c["env"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap().to_string(), e["value"].clone())).collect();
    assert_eq!(env["MIMALLOC_ARENA_EAGER_COMMIT"], "0", "half the resident memory (docs/operator.md)");
    let node = c["env"].as_array().unwrap().iter().find(|e| e["name"] == "SAFE_TERMINATION_NODE_NAME").expect("the node name for the observer's metrics");
    assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    // flags: parse as the binary does; ports, probes and files agree with them
    let args = strs(&c["args"]);
    assert_eq!(args.first().map(String::as_str), Some("agent"), "{args:?}");
    let cli = AgentCli::try_parse_from(std::iter::once("safe-termination").chain(args[1..].iter().map(String::as_str)))
        .unwrap_or_else(|e| panic!("the chart's agent flags do not parse: {e}\n{args:?}"));
    assert!(matches!(cli.log_format.as_deref(), Some("json" | "text")));
    let a = cli.agent;
    let port = |name: &str| c["ports"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("container port {name}")).clone();
    let (tls_port, health_port) = (port("agent"), port("healthz"));
    assert_eq!(tls_port["containerPort"].as_u64(), Some(u64::from(a.listen.port())));
    assert_eq!(tls_port["hostPort"], tls_port["containerPort"]);
    assert_eq!(health_port["containerPort"].as_u64(), Some(u64::from(a.health_listen.port())));
    assert_eq!(health_port["hostPort"], health_port["containerPort"]);
    assert!(a.listen.ip().is_unspecified(), "the operator dials the node's address");
    // the agents read their data plane only when the operator observes removals
    use safe_termination::cli::agent::DataPlaneArg;
    assert_eq!(a.data_plane, if observing { DataPlaneArg::Auto } else { DataPlaneArg::None });
    assert_eq!(a.kube_proxy_url, "http://127.0.0.1:10249");
    match (&bpf_mount, &bpf_volume) {
        (Some(m), Some(v)) => {
            assert_eq!((&m["readOnly"], &m["mountPropagation"]), (&json!(true), &json!("HostToContainer")), "{m}");
            assert_eq!(Path::new(m["mountPath"].as_str().unwrap()), a.cilium_bpf_root.as_path(), "the agent reads the mounted bpffs");
            assert_eq!(v["hostPath"]["type"], "Directory");
            assert!(v["hostPath"]["path"].as_str().is_some_and(|p| p.starts_with('/')), "{v}");
        }
        _ => assert_eq!(a.cilium_bpf_root, Path::new("/sys/fs/bpf"), "the default root, nothing mounted there"),
    }
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"], json!({"path": "/healthz", "port": "healthz"}), "{probe}");
    }
    let mount = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "tls").expect("tls mount");
    assert_eq!(mount["readOnly"], true);
    let dir = Path::new(mount["mountPath"].as_str().unwrap());
    assert_eq!(
        (a.tls_ca_file.as_path(), a.tls_cert_file.as_path(), a.tls_key_file.as_path()),
        (dir.join("ca.crt").as_path(), dir.join("tls.crt").as_path(), dir.join("tls.key").as_path())
    );
    let vol = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "tls").unwrap();
    assert_eq!(vol["secret"]["optional"], true, "written by the operator after it starts");
    // the operator finds these pods and writes this Secret
    assert_eq!(vol["secret"]["secretName"].as_str(), op.agent_cert_secret.as_deref());
    assert_eq!(op.agent_namespace.as_deref(), Some(agent_ns));
    assert_eq!(op.agent_port, a.listen.port());
    let labels = d["spec"]["template"]["metadata"]["labels"].as_object().unwrap();
    for term in op.agent_selector.split(',') {
        let (k, v) = term.split_once('=').unwrap_or_else(|| panic!("--agent-selector {:?}: k=v terms", op.agent_selector));
        assert_eq!(labels.get(k).and_then(Value::as_str), Some(v), "--agent-selector {} selects the agent pods", op.agent_selector);
    }
    for (k, v) in d["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(labels.get(k), Some(v));
    }
    // ... and none of the operator's selectors picks them
    let deployment = find(docs, "Deployment", fullname);
    let svc = find(docs, "Service", fullname);
    for (what, selector) in [("Service", &svc["spec"]["selector"]), ("Deployment", &deployment["spec"]["selector"]["matchLabels"])] {
        let all = selector.as_object().unwrap().iter().all(|(k, v)| labels.get(k) == Some(v));
        assert!(!all, "the operator's {what} selects the agent pods: {selector}");
    }
    assert_eq!(deployment["metadata"]["namespace"], release_ns);
    a
}
