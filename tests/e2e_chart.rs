//! The Helm chart (charts/safe-termination) and the operator's own certificates, checked for
//! real: `helm lint --strict`, `helm template` with every value set of the chart's `ci/`
//! (webhook configuration R10, RBAC without wildcards and covering what the code calls, Pod
//! Security, operator flags that parse), each rendering applied with a server-side dry run to the
//! real control plane, a real `helm install` / `helm upgrade` / `helm uninstall`, the chart's
//! webhook configuration driving the real API server to the operator (run out of cluster as the
//! chart's ServiceAccount, with the certificates it generates and rotates), the certificate
//! module against the API server, and `promtool check rules` / `promtool test rules`.
//!
//! They need the tools of `make k8s-bins` (helm, kubectl, promtool in `$ST_K8S_BIN`) and, for
//! most, the local control plane (`make cluster-up`), so they are built only with `--features cluster-tests` (a plain
//! `cargo test` skips them) and run by `make e2e` (e2e/run-e2e.sh: `--test-threads=1`). Without
//! them they fail loudly: they never pass by skipping.
//!
//! Here the release's pods land on kwok nodes, where nothing executes (tests/e2e_operator_pods.rs
//! runs the image on the real nodes), so the installed release is checked as objects, and the
//! operator binary runs out of cluster with
//! the release's ServiceAccount identity (kubeconfig impersonation), which exercises the chart's
//! RBAC with the real code. Service IPs are virtual here: the API server can only reach a webhook
//! registered by URL on 127.0.0.1, so the routing test registers the chart's rendered webhook
//! with its `service` replaced by such a URL, and every webhook configuration that keeps its
//! `service` gets a namespaceSelector that matches no namespace.

use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

mod common;
use safe_termination::certs::{self, Action, CertConfig};
use safe_termination::cli::agent::AgentArgs;
use safe_termination::cli::run::{RunArgs, SourceKind};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// tools and files

use common::first_der;
use common::tools::{kubeconfig, root, run, tool, try_run};

fn chart() -> PathBuf {
    root().join("charts/safe-termination")
}

/// The YAML documents of a multi-document stream (empty ones dropped).
fn docs(text: &str) -> Vec<Value> {
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

fn ci_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(chart().join("ci")).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    assert!(v.len() >= 6, "ci value sets: {v:?}");
    v
}

fn stem(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().trim_end_matches("-values.yaml").to_string()
}

fn helm_template(release: &str, ns: &str, values: Option<&Path>, sets: &[&str]) -> String {
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

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name).unwrap_or_else(|| {
        panic!("no {kind} {name} in the rendering: {:?}", docs.iter().map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"])).collect::<Vec<_>>())
    })
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect()).unwrap_or_default()
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn unb64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

// ---------------------------------------------------------------------------------------------
// checks of a rendering

/// The flags of `safe-termination run`, parsed exactly as the binary parses them.
#[derive(clap::Parser, Debug)]
struct RunCli {
    /// The global `--log-format` of the binary.
    #[arg(long)]
    log_format: Option<String>,
    #[command(flatten)]
    run: RunArgs,
}

fn parse_args(args: &[String]) -> RunArgs {
    use clap::Parser as _;
    assert_eq!(args.first().map(String::as_str), Some("run"), "the container runs `safe-termination run`: {args:?}");
    let cli = RunCli::try_parse_from(std::iter::once("safe-termination").chain(args[1..].iter().map(String::as_str)))
        .unwrap_or_else(|e| panic!("the chart's operator flags do not parse: {e}\n{args:?}"));
    assert!(matches!(cli.log_format.as_deref(), Some("json" | "text")));
    cli.run
}

/// R10 and the chart's routing rules on the rendered MutatingWebhookConfiguration.
fn check_webhook(docs: &[Value], release_ns: &str, fullname: &str, mode: &str, failure_policy: &str) {
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
    assert!(exprs.contains(&json!({"key": "safetermination.io/ignore", "operator": "NotIn", "values": ["true"]})), "opt-out label");
    assert!(
        w["objectSelector"]["matchExpressions"]
            .as_array()
            .unwrap()
            .contains(&json!({"key": "safetermination.io/ignore", "operator": "NotIn", "values": ["true"]}))
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
fn allows(docs: &[Value], sa: (&str, &str), namespace: Option<&str>, group: &str, resource: &str, verb: &str, name: Option<&str>) -> bool {
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
fn check_rbac(docs: &[Value], release_ns: &str, fullname: &str, mode: &str) {
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
    need(None, "", "pods", &["list"], None);
    need(None, "", "services", &["list", "watch"], None);
    need(None, "discovery.k8s.io", "endpointslices", &["list", "watch"], None);
    need(Some(release_ns), "coordination.k8s.io", "leases", &["create"], None);
    need(Some(release_ns), "coordination.k8s.io", "leases", &["get", "patch"], Some(&format!("{fullname}-leader")));
    need(Some(release_ns), "", "pods", &["create"], None);
    need(Some("kube-system"), "", "configmaps", &["get"], Some("kube-proxy"));
    need(Some("kube-system"), "", "configmaps", &["get"], Some("kube-proxy-config"));
    // ... and no more than that
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
fn check_deployment(docs: &[Value], release_ns: &str, fullname: &str, replicas: u64) -> RunArgs {
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
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(labels[k], *v);
    }
    args
}

/// The flags of `safe-termination agent`, parsed exactly as the binary parses them.
#[derive(clap::Parser, Debug)]
struct AgentCli {
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
fn check_agent(docs: &[Value], release_ns: &str, fullname: &str, agent_ns: &str, op: &RunArgs) -> AgentArgs {
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
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
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
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["runAsUser"], 65532);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(sc["capabilities"].get("add").is_none());
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["resources"]["requests"], json!({"cpu": "5m", "memory": "24Mi"}));
    assert_eq!(c["resources"]["limits"], json!({"memory": "64Mi"}));
    let env: BTreeMap<String, Value> = c["env"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap().to_string(), e["value"].clone())).collect();
    assert_eq!(env["MIMALLOC_ARENA_EAGER_COMMIT"], "0", "half the resident memory (docs/operator.md)");
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
    assert_eq!(a.kube_proxy_url, "http://127.0.0.1:10249");
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

// ---------------------------------------------------------------------------------------------
// tests that need helm only

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
    assert!(r.is_err(), "existingSecret needs a name and a caBundle");
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
    ] {
        let r = try_run(tool("helm").args(["template", "x"]).arg(chart()).args(["--set", bad]), None);
        assert!(r.as_ref().is_err_and(|e| e.contains(why)), "--set {bad} must be refused ({why}): {r:?}");
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
    assert!(out.contains("SUCCESS: 5 rules found"), "{out}");
    let out = run(tool("promtool").args(["test", "rules"]).arg(chart().join("tests/alerts_test.yaml")), None);
    assert!(out.contains("SUCCESS"), "{out}");
    // the rendered PrometheusRule's groups are a valid rules file too
    let rendered = helm_template("st", "st-system", Some(&chart().join("ci/prometheus-values.yaml")), &[]);
    let rule = docs(&rendered).into_iter().find(|d| d["kind"] == "PrometheusRule").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, serde_json::to_string(&rule["spec"]).unwrap()).unwrap();
    let out = run(tool("promtool").args(["check", "rules"]).arg(&file), None);
    assert!(out.contains("SUCCESS: 5 rules found"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// tests on the control plane

async fn delete_namespace(client: &Client, name: &str) {
    let _ = Api::<Namespace>::all(client.clone()).delete(name, &DeleteParams::default()).await;
}

/// Applies the chart's CRDs (what `helm install` does on a first install) and waits until served.
fn apply_chart_crd() {
    run(tool("kubectl").args(["apply", "--server-side", "--field-manager=e2e-chart", "-f"]).arg(chart().join("crds")), None);
    run(
        tool("kubectl").args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/terminationpolicies.safetermination.io",
            "crd/terminationparameters.safetermination.io",
        ]),
        None,
    );
}

/// Minimal CRDs for the cert-manager and Prometheus Operator kinds the chart can render (the
/// local control plane has neither project). Returns the ones this call created.
fn install_stand_in_crds() -> Vec<String> {
    let kinds = [
        ("cert-manager.io", "Certificate", "certificates", "v1"),
        ("cert-manager.io", "Issuer", "issuers", "v1"),
        ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors", "v1"),
        ("monitoring.coreos.com", "PrometheusRule", "prometheusrules", "v1"),
    ];
    let mut created = Vec::new();
    for (group, kind, plural, version) in kinds {
        let name = format!("{plural}.{group}");
        if try_run(tool("kubectl").args(["get", "crd", &name]), None).is_ok() {
            continue;
        }
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name, "labels": {"safetermination.e2e/stand-in": "true"}},
            "spec": {"group": group, "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{"name": version, "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        });
        run(tool("kubectl").args(["apply", "--server-side", "--field-manager=e2e-chart", "-f", "-"]), Some(&crd.to_string()));
        created.push(name);
    }
    for name in &created {
        run(tool("kubectl").args(["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{name}")]), None);
    }
    created
}

#[tokio::test]
async fn every_rendering_passes_a_server_side_dry_run() {
    let client = common::client().await;
    apply_chart_crd();
    let stand_ins = install_stand_in_crds();
    let ns = "st-chart-dry";
    common::fresh_namespace(&client, ns).await;
    for f in ci_files() {
        let rendered = helm_template("st", ns, Some(&f), &[]);
        let n = docs(&rendered).len();
        let out = run(tool("kubectl").args(["apply", "--server-side", "--dry-run=server", "--field-manager=e2e-chart", "-f", "-"]), Some(&rendered));
        let applied = out.lines().filter(|l| l.contains("(server dry run)")).count();
        assert_eq!(applied, n, "{}: every object validated by the API server:\n{out}", f.display());
        eprintln!("{}: {applied} objects accepted by the API server (dry run)", stem(&f));
    }
    delete_namespace(&client, ns).await;
    for name in stand_ins {
        let _ = try_run(tool("kubectl").args(["delete", "crd", &name, "--wait=false"]), None);
    }
}

/// The operator binary, run out of cluster as a ServiceAccount (kubeconfig impersonation);
/// killed on drop.
struct Operator {
    child: std::process::Child,
    admin: u16,
    webhook: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
    tls: (PathBuf, PathBuf),
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Operator {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("http://127.0.0.1:{}/metrics", self.admin)).await.unwrap().text().await.unwrap()
    }

    /// Admission requests answered so far (all decisions).
    async fn requests(&self) -> u64 {
        common::metric_sum(&self.metrics().await, "safe_termination_webhook_requests_total", &[]).unwrap_or(0.0) as u64
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        let url = format!("http://127.0.0.1:{}/readyz", self.admin);
        loop {
            if let Ok(r) = reqwest::get(&url).await
                && r.status().is_success()
            {
                return;
            }
            assert!(Instant::now() < deadline, "operator never became ready ({url}):\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// A kubeconfig that acts as `system:serviceaccount:NS:NAME` (the admin may impersonate).
fn impersonating_kubeconfig(dir: &Path, namespace: &str, sa: &str) -> PathBuf {
    let mut kc: Value = serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig()).unwrap()).unwrap();
    for u in kc["users"].as_array_mut().unwrap() {
        u["user"]["as"] = json!(format!("system:serviceaccount:{namespace}:{sa}"));
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_json::to_string(&kc).unwrap()).unwrap();
    path
}

fn start_operator(namespace: &str, sa: &str, release: &str, extra: &[&str]) -> Operator {
    let dir = tempfile::tempdir().unwrap();
    let kc = impersonating_kubeconfig(dir.path(), namespace, sa);
    let targets: Vec<String> = std::env::var("ST_KP_METRICS_URLS")
        .unwrap_or_else(|_| "http://10.213.0.2:10249/metrics http://10.213.1.2:10249/metrics".into())
        .split_whitespace()
        .zip(["node-a", "node-b", "node-c"])
        .map(|(url, node)| format!("{node}={}", url.trim_end_matches("/metrics")))
        .collect();
    let (admin, webhook) = (common::free_port(), common::free_port());
    let tls = (dir.path().join("tls/tls.crt"), dir.path().join("tls/tls.key"));
    let log = PathBuf::from(format!("{}/logs/operator-chart-{namespace}.log", common::state_dir()));
    let _ = std::fs::create_dir_all(log.parent().unwrap());
    let file = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_safe-termination"))
        .args(["run", "--listen", &format!("127.0.0.1:{webhook}"), "--admin-listen", &format!("127.0.0.1:{admin}")])
        .arg("--tls-cert-file")
        .arg(&tls.0)
        .arg("--tls-key-file")
        .arg(&tls.1)
        .args(["--namespace", namespace, "--identity", "e2e-chart", "--lease-name", &format!("{release}-safe-termination-leader")])
        .args(["--kube-proxy-target", &targets.join(",")])
        .args(["--scrape-interval-seconds", "2", "--window-seconds", "120", "--status-refresh-seconds", "5"])
        .args(["--cert-secret", &format!("{release}-safe-termination-tls"), "--webhook-service", &format!("{release}-safe-termination")])
        .args(["--webhook-configuration", &format!("{release}-safe-termination"), "--write-cert-files", "--cert-extra-san", "127.0.0.1"])
        .args(["--cert-check-interval-seconds", "2", "--cert-reload-interval-seconds", "1"])
        // these tests are about the webhook and its certificates; the name is the chart's, so its
        // RBAC covers the stale-policy check
        .args(["--admission-backend", "webhook", "--admission-policy-name", &format!("{release}-safe-termination")])
        .args(extra)
        .env("KUBECONFIG", &kc)
        .env("RUST_LOG", "info,safe_termination=debug")
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("start the operator");
    Operator { child, admin, webhook, log, _dir: dir, tls }
}

use common::wait_for;

async fn secret_data(client: &Client, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    let s = Api::<Secret>::namespaced(client.clone(), ns).get_opt(name).await.ok()??;
    Some(s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect())
}

async fn ca_bundles(client: &Client, name: &str) -> Vec<Option<Vec<u8>>> {
    let cfg = Api::<MutatingWebhookConfiguration>::all(client.clone()).get(name).await.unwrap();
    cfg.webhooks.unwrap_or_default().into_iter().map(|w| w.client_config.ca_bundle.map(|b| b.0)).collect()
}

/// `kubectl auth can-i VERB RESOURCE [-n NS]` as the ServiceAccount.
fn can_i(sa: &str, args: &[&str]) -> bool {
    let out = tool("kubectl").args(["auth", "can-i"]).args(args).args(["--as", sa]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

#[tokio::test]
async fn helm_install_upgrade_and_uninstall_on_the_real_control_plane() {
    let client = common::client().await;
    let (ns, release, fullname) = ("st-helm", "st", "st-safe-termination");
    let app = "st-helm-app";
    let _ = try_run(tool("helm").args(["uninstall", release, "-n", ns, "--wait"]), None);
    // the release namespace enforces the restricted Pod Security profile: the ReplicaSet's pods
    // are only created if the chart's pod template complies
    common::fresh_namespace_with_labels(
        &client,
        ns,
        &[("pod-security.kubernetes.io/enforce", "restricted"), ("pod-security.kubernetes.io/enforce-version", "latest")],
    )
    .await;
    common::fresh_namespace(&client, app).await;
    // Service IPs are virtual here: no namespace selects this release's webhook, so the API
    // server never tries to reach it
    let never = "webhook.namespaceSelector.matchLabels.safetermination\\.e2e/never=true";
    let out = run(
        // the webhook backend: this test reads the webhook configuration back (the default,
        // auto, picks the policy on 1.37: tests/e2e_operator_pods.rs t8b); no node agent: its
        // hostNetwork needs the privileged level, which this namespace refuses (checked by
        // rendering in the_node_agent_renders_for_true_and_auto_and_not_for_false)
        tool("helm").args(["install", release]).arg(chart()).args([
            "-n",
            ns,
            "--set-string",
            never,
            "--set",
            "admission.backend=webhook",
            "--set",
            "agent.enabled=false",
            "--wait",
            "--timeout",
            "180s",
        ]),
        None,
    );
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert!(out.contains("Namespaces without a TerminationPolicy are not mutated"), "NOTES.txt: {out}");

    // the objects exist and are what the chart says (read back from the API server)
    let deploy: k8s_openapi::api::apps::v1::Deployment = Api::namespaced(client.clone(), ns).get(fullname).await.unwrap();
    let status = deploy.status.unwrap();
    assert_eq!((status.replicas, status.ready_replicas), (Some(2), Some(2)), "2 replicas (kwok-run) admitted under restricted Pod Security");
    let pods = Api::<Pod>::namespaced(client.clone(), ns).list(&Default::default()).await.unwrap();
    assert_eq!(pods.items.len(), 2);
    for p in &pods.items {
        let spec = p.spec.as_ref().unwrap();
        assert!(spec.node_name.is_some(), "scheduled");
        let sleep = spec.containers[0].lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).and_then(|h| h.sleep.as_ref()).map(|s| s.seconds);
        assert_eq!(sleep, Some(10), "the API server kept the operator's own native preStop sleep");
    }
    let stored = Api::<MutatingWebhookConfiguration>::all(client.clone()).get(fullname).await.unwrap();
    let stored = serde_json::to_value(&stored).unwrap();
    let w = &stored["webhooks"][0];
    assert_eq!((w["failurePolicy"].as_str(), w["timeoutSeconds"].as_u64(), w["sideEffects"].as_str()), (Some("Ignore"), Some(5), Some("None")));
    assert_eq!(w["reinvocationPolicy"], "IfNeeded");
    assert_eq!(w["matchConditions"].as_array().unwrap().len(), 2, "the API server compiled and kept both CEL conditions");
    assert!(w["clientConfig"].get("caBundle").is_none(), "mode operator: no caBundle until the operator patches it");
    for (kind, name, namespace) in [
        ("serviceaccount", fullname, ns),
        ("service", fullname, ns),
        ("poddisruptionbudget", fullname, ns),
        ("role", fullname, ns),
        ("rolebinding", fullname, ns),
        ("role", "st-safe-termination-kube-proxy", "kube-system"),
        ("rolebinding", "st-safe-termination-kube-proxy", "kube-system"),
        ("clusterrole", fullname, ""),
        ("clusterrolebinding", fullname, ""),
    ] {
        let mut c = tool("kubectl");
        c.args(["get", kind, name]);
        if !namespace.is_empty() {
            c.args(["-n", namespace]);
        }
        run(&mut c, None);
    }

    // RBAC as the API server evaluates it (SubjectAccessReview)
    let sa = format!("system:serviceaccount:{ns}:{fullname}");
    let yes = [
        vec!["list", "terminationpolicies.safetermination.io", "-A"],
        vec!["watch", "terminationpolicies.safetermination.io", "-A"],
        vec!["patch", "terminationpolicies.safetermination.io", "--subresource=status", "-n", app],
        vec!["create", "events.events.k8s.io", "-n", app],
        vec!["list", "pods", "-A"],
        vec!["watch", "services", "-A"],
        vec!["watch", "endpointslices.discovery.k8s.io", "-A"],
        vec!["create", "pods", "-n", ns],
        vec!["create", "leases.coordination.k8s.io", "-n", ns],
        vec!["patch", "leases.coordination.k8s.io/st-safe-termination-leader", "-n", ns],
        vec!["create", "secrets", "-n", ns],
        vec!["update", "secrets/st-safe-termination-tls", "-n", ns],
        vec!["get", "configmaps/kube-proxy", "-n", "kube-system"],
        vec!["patch", "mutatingwebhookconfigurations/st-safe-termination"],
    ];
    let no = [
        vec!["create", "pods", "-n", app],
        vec!["delete", "pods", "-n", ns],
        vec!["get", "secrets/other", "-n", ns],
        vec!["list", "secrets", "-n", ns],
        vec!["get", "secrets", "-n", "kube-system"],
        vec!["patch", "terminationpolicies.safetermination.io", "-n", app],
        vec!["get", "configmaps/coredns", "-n", "kube-system"],
        vec!["patch", "mutatingwebhookconfigurations/other"],
        vec!["patch", "leases.coordination.k8s.io/other", "-n", ns],
        vec!["create", "deployments.apps", "-n", app],
    ];
    for a in &yes {
        assert!(can_i(&sa, a), "the ServiceAccount must be allowed: {a:?}");
    }
    for a in &no {
        assert!(!can_i(&sa, a), "the ServiceAccount must not be allowed: {a:?}");
    }

    // the real operator code under exactly these permissions: certificates, caBundle, lease,
    // capability probe, policy status, events, pod counts, Service watch
    let policy = json!({"apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
        "metadata": {"name": "web", "namespace": app}, "spec": {"preStop": {"minSamples": 1}}});
    run(tool("kubectl").args(["apply", "--server-side", "--field-manager=e2e-chart", "-f", "-"]), Some(&policy.to_string()));
    let op = start_operator(ns, fullname, release, &[]);
    op.wait_ready().await;
    let secret = wait_for("the operator's certificate Secret", 60, async || secret_data(&client, ns, "st-safe-termination-tls").await).await;
    for k in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(secret.contains_key(k), "{k}");
    }
    wait_for("the caBundle patch", 30, async || (ca_bundles(&client, fullname).await == vec![Some(secret["ca.crt"].clone())]).then_some(())).await;
    let st = wait_for("a measured policy status", 90, async || {
        let p: Value =
            serde_json::to_value(Api::<safe_termination::core::crd::TerminationPolicy>::namespaced(client.clone(), app).get("web").await.ok()?).ok()?;
        (p["status"]["recommendation"]["reason"] == "Measured" && p["status"]["pods"].is_object()).then_some(p)
    })
    .await;
    assert_eq!(st["status"]["measurement"]["nodesScraped"], 2, "{st:#}");
    let lease: k8s_openapi::api::coordination::v1::Lease = Api::namespaced(client.clone(), ns).get("st-safe-termination-leader").await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("e2e-chart"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = op.log();
    for bad in ["forbidden", "Forbidden", "cannot publish event", "capability probe failed", "cannot count pods"] {
        assert!(!log.contains(bad), "the chart's RBAC is not enough ({bad}):\n{log}");
    }
    assert!(log.contains("native preStop sleep available"), "the dry-run capability probe ran under the chart's RBAC:\n{log}");
    drop(op);

    // helm upgrade: new values reach the objects; the operator's caBundle survives it
    let ca = secret["ca.crt"].clone();
    let out = run(
        tool("helm").args(["upgrade", release]).arg(chart()).args([
            "-n",
            ns,
            "--reuse-values",
            "--set",
            "replicaCount=3",
            "--set",
            "defaultPolicy.enabled=true",
            "--set",
            "webhook.timeoutSeconds=4",
            "--wait",
            "--timeout",
            "180s",
        ]),
        None,
    );
    assert!(out.contains("STATUS: deployed") && out.contains("REVISION: 2"), "{out}");
    let deploy: k8s_openapi::api::apps::v1::Deployment = Api::namespaced(client.clone(), ns).get(fullname).await.unwrap();
    assert_eq!(deploy.status.unwrap().ready_replicas, Some(3));
    let args = deploy.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
    assert!(args.contains(&format!("--default-policy={ns}/cluster-default")), "{args:?}");
    assert!(args.contains(&"--request-timeout-ms=3500".to_string()), "{args:?}");
    Api::<safe_termination::core::crd::TerminationPolicy>::namespaced(client.clone(), ns).get("cluster-default").await.expect("the default policy");
    let hook = Api::<MutatingWebhookConfiguration>::all(client.clone()).get(fullname).await.unwrap();
    let w = &hook.webhooks.unwrap()[0];
    assert_eq!(w.timeout_seconds, Some(4));
    assert_eq!(w.client_config.ca_bundle.as_ref().map(|b| b.0.clone()), Some(ca), "helm upgrade kept the caBundle the operator owns");
    assert_eq!(w.namespace_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["safetermination.e2e/never"], "true", "--reuse-values");

    // helm uninstall: the release's objects go; the CRD and the operator's Secret stay
    run(tool("helm").args(["uninstall", release, "-n", ns, "--wait", "--timeout", "120s"]), None);
    assert!(Api::<MutatingWebhookConfiguration>::all(client.clone()).get_opt(fullname).await.unwrap().is_none());
    assert!(try_run(tool("kubectl").args(["get", "clusterrole", fullname]), None).is_err());
    assert!(try_run(tool("kubectl").args(["get", "role", "st-safe-termination-kube-proxy", "-n", "kube-system"]), None).is_err());
    assert!(try_run(tool("kubectl").args(["get", "deployment", fullname, "-n", ns]), None).is_err());
    run(tool("kubectl").args(["get", "crd", "terminationpolicies.safetermination.io"]), None);
    assert!(secret_data(&client, ns, "st-safe-termination-tls").await.is_some(), "documented: uninstall leaves the generated Secret");
    delete_namespace(&client, app).await;
    delete_namespace(&client, ns).await;
}

/// Deletes objects outside the test's namespaces (`kubectl delete ARGS...`) even when the test
/// fails.
struct Leftovers(Vec<Vec<String>>);

impl Leftovers {
    fn new(objects: &[&[&str]]) -> Self {
        Self(objects.iter().map(|o| o.iter().map(|s| s.to_string()).collect()).collect())
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for args in &self.0 {
            let _ = try_run(tool("kubectl").arg("delete").args(args).args(["--ignore-not-found", "--wait=false"]), None);
        }
    }
}

fn pod(name: &str, ns: &str, extra: Value) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}});
    merge(&mut p, extra);
    p
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// Creates `pod` (a server-side dry run when `dry`) and returns what the API server stored.
async fn create(client: &Client, pod: &Value, dry: bool) -> Pod {
    let ns = pod["metadata"]["namespace"].as_str().unwrap();
    let p: Pod = serde_json::from_value(pod.clone()).unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams { dry_run: dry, field_manager: Some("e2e-chart".into()) }, &p)
        .await
        .unwrap_or_else(|e| panic!("create pod {}/{}: {e}", ns, pod["metadata"]["name"]))
}

fn sleep_of(p: &Pod) -> Option<i64> {
    p.spec.as_ref()?.containers[0].lifecycle.as_ref()?.pre_stop.as_ref()?.sleep.as_ref().map(|s| s.seconds)
}

/// The leaf certificate a TLS client sees on 127.0.0.1:`port`, verified against `ca_pem`
/// (a bundle) for the name 127.0.0.1.
async fn served_leaf(port: u16, ca_pem: &[u8]) -> Result<Vec<u8>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(c.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let http = reqwest::Client::builder().use_preconfigured_tls(tls).tls_info(true).timeout(Duration::from_secs(5)).build().unwrap();
    let r = http.get(format!("https://127.0.0.1:{port}/mutate")).send().await.map_err(|e| format!("{e:?}"))?;
    let info = r.extensions().get::<reqwest::tls::TlsInfo>().ok_or("no TLS info")?;
    info.peer_certificate().map(<[u8]>::to_vec).ok_or_else(|| "no peer certificate".into())
}

#[tokio::test]
async fn the_charts_webhook_routes_pods_through_the_real_api_server_with_operator_certificates() {
    let client = common::client().await;
    apply_chart_crd();
    let (release, sys, fullname) = ("sthook", "st-hook-sys", "sthook-safe-termination");
    let (app, optout) = ("st-hook-app", "st-hook-optout");
    // the chart's own webhook configuration, RBAC and ServiceAccount (release namespace st-hook-sys)
    let rendered = docs(&helm_template(release, sys, None, &[]));
    let keep = ["MutatingWebhookConfiguration", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];
    let mut objects: Vec<Value> = rendered.into_iter().filter(|d| keep.contains(&d["kind"].as_str().unwrap())).collect();
    let kp = format!("{fullname}-kube-proxy");
    let _cleanup = Leftovers::new(&[
        &["mutatingwebhookconfiguration", fullname],
        &["clusterrole", fullname],
        &["clusterrolebinding", fullname],
        &["role", &kp, "-n", "kube-system"],
        &["rolebinding", &kp, "-n", "kube-system"],
    ]);
    common::fresh_namespace(&client, sys).await;
    common::fresh_namespace(&client, app).await;
    common::fresh_namespace_with_labels(&client, optout, &[("safetermination.io/ignore", "true")]).await;
    // Service IPs are virtual here: the API server reaches the operator by URL on loopback; every
    // other field (rules, selectors, matchConditions, policies) is the chart's
    let apply = |o: &Value| {
        run(tool("kubectl").args(["apply", "--server-side", "--field-manager=e2e-chart", "-f", "-"]), Some(&serde_json::to_string(o).unwrap()));
    };
    for o in objects.iter().filter(|o| o["kind"] != "MutatingWebhookConfiguration") {
        apply(o);
    }
    let op = start_operator(sys, fullname, release, &[]);
    for o in objects.iter_mut().filter(|o| o["kind"] == "MutatingWebhookConfiguration") {
        o["webhooks"][0]["clientConfig"] = json!({"url": format!("https://127.0.0.1:{}/mutate", op.webhook)});
        apply(o);
    }
    for ns in [app, optout, sys] {
        let p = json!({"apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
            "metadata": {"name": "all", "namespace": ns}, "spec": {"scope": "AllLongRunning"}});
        run(tool("kubectl").args(["apply", "--server-side", "--field-manager=e2e-chart", "-f", "-"]), Some(&p.to_string()));
    }

    // the operator generates its certificate, patches the chart's caBundle and serves it
    op.wait_ready().await;
    let secret_name = format!("{fullname}-tls");
    let secret = wait_for("the certificate Secret", 60, async || secret_data(&client, sys, &secret_name).await).await;
    let obs = certs::observe(&secret);
    let leaf = obs.serving.clone().expect("a usable serving certificate");
    for name in [format!("{fullname}.{sys}.svc"), "127.0.0.1".into()] {
        assert!(leaf.sans.contains(&name), "{name} in {:?}", leaf.sans);
    }
    wait_for("the caBundle patch", 30, async || (ca_bundles(&client, fullname).await == vec![Some(secret["ca.crt"].clone())]).then_some(())).await;
    assert_eq!(std::fs::read(&op.tls.0).unwrap(), secret["tls.crt"], "--write-cert-files");
    assert_eq!(
        served_leaf(op.webhook, &secret["ca.crt"]).await.unwrap(),
        first_der(&secret["tls.crt"]),
        "the webhook serves the Secret's certificate, trusted by its CA for 127.0.0.1"
    );

    // a long-running pod in a namespace with a policy is mutated (once the capability probe
    // has found the native sleep and the plan has the policy)
    let mutated = wait_for("the first mutated pod", 60, async || {
        let p = create(&client, &pod("probe", app, json!({})), true).await;
        sleep_of(&p).map(|_| p)
    })
    .await;
    assert_eq!(mutated.metadata.annotations.as_ref().unwrap()["safetermination.io/policy"], format!("{app}/all"));
    let before = op.requests().await;
    let p = create(&client, &pod("web", app, json!({})), false).await;
    assert!(sleep_of(&p).is_some(), "a real pod created through the chart's webhook is mutated");
    assert_eq!(op.requests().await, before + 1, "called once");

    // and everything the chart excludes never reaches the webhook
    let cases = [
        ("job pod (restartPolicy Never, matchCondition)", pod("job", app, json!({"spec": {"restartPolicy": "Never"}})), false),
        ("OnFailure pod (matchCondition)", pod("retry", app, json!({"spec": {"restartPolicy": "OnFailure"}})), false),
        (
            "mirror pod (annotation, matchCondition)",
            pod("mirror", app, json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}, "spec": {"nodeName": "node-c"}})),
            true,
        ),
        ("opted-out pod (objectSelector)", pod("optout-pod", app, json!({"metadata": {"labels": {"safetermination.io/ignore": "true"}}})), false),
        ("opted-out namespace (namespaceSelector)", pod("any", optout, json!({})), false),
        ("release namespace (namespaceSelector)", pod("own", sys, json!({})), false),
        ("kube-system (namespaceSelector)", pod("st-e2e-system-pod", "kube-system", json!({})), true),
    ];
    for (what, p, dry) in &cases {
        let before = op.requests().await;
        let created = create(&client, p, *dry).await;
        assert_eq!(sleep_of(&created), None, "{what}: not mutated");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(op.requests().await, before, "{what}: the API server did not call the webhook");
    }
    // the same pods without the exclusion are called (the cases above are not vacuous)
    let before = op.requests().await;
    let p = create(&client, &pod("plain-dry", app, json!({"spec": {"restartPolicy": "Always"}})), true).await;
    assert!(sleep_of(&p).is_some());
    assert_eq!(op.requests().await, before + 1);

    // renewal without restart: a serving certificate that is no longer usable is replaced
    // from the same CA; the webhook reloads it from the files
    let old_leaf = secret["tls.crt"].clone();
    // (a kubernetes.io/tls Secret must keep tls.crt: put one from a foreign CA there)
    let now = certs::unix_now();
    let (foreign_ca, foreign_key) = certs::generate_ca(now, Duration::from_secs(86_400)).unwrap();
    let names = certs::subject_alt_names(fullname, sys, &["127.0.0.1".to_string()]);
    let (c, k) = certs::generate_serving(&foreign_ca, &foreign_key, &names, now, Duration::from_secs(3600), i64::MAX).unwrap();
    let patch =
        json!([{"op": "replace", "path": "/data/tls.crt", "value": b64(c.as_bytes())}, {"op": "replace", "path": "/data/tls.key", "value": b64(k.as_bytes())}]);
    run(tool("kubectl").args(["patch", "secret", &secret_name, "-n", sys, "--type=json", "-p", &patch.to_string()]), None);
    let renewed = wait_for("a renewed serving certificate", 30, async || {
        secret_data(&client, sys, &secret_name).await.filter(|d| d.get("tls.crt").is_some_and(|x| *x != old_leaf && *x != c.as_bytes()))
    })
    .await;
    assert_eq!(renewed["ca.crt"], secret["ca.crt"], "same CA");
    wait_for("the webhook serving the renewed certificate", 30, async || {
        (served_leaf(op.webhook, &renewed["ca.crt"]).await.ok()? == first_der(&renewed["tls.crt"])).then_some(())
    })
    .await;
    let p = create(&client, &pod("after-renewal", app, json!({})), true).await;
    assert!(sleep_of(&p).is_some(), "the API server trusts the renewed certificate");

    // CA rotation: a CA whose key is gone is replaced; the caBundle holds the new and the
    // previous CA, so no replica's leaf is untrusted at any moment
    run(tool("kubectl").args(["patch", "secret", &secret_name, "-n", sys, "--type=json", "-p", r#"[{"op":"remove","path":"/data/ca.key"}]"#]), None);
    let rotated = wait_for("a new CA", 30, async || {
        secret_data(&client, sys, &secret_name).await.filter(|d| d.contains_key("ca.key") && d["ca.crt"] != renewed["ca.crt"])
    })
    .await;
    let bundle = certs::bundle_info(&rotated["ca.crt"]).unwrap();
    assert_eq!(bundle.len(), 2, "new CA first, previous CA kept");
    assert!(String::from_utf8_lossy(&rotated["ca.crt"]).contains(String::from_utf8_lossy(&renewed["ca.crt"]).trim()), "the previous CA is in the bundle");
    wait_for("the rotated caBundle", 30, async || (ca_bundles(&client, fullname).await == vec![Some(rotated["ca.crt"].clone())]).then_some(())).await;
    wait_for("the webhook serving a leaf of the new CA", 30, async || {
        (served_leaf(op.webhook, &rotated["ca.crt"]).await.ok()? == first_der(&rotated["tls.crt"])).then_some(())
    })
    .await;
    let p = create(&client, &pod("after-ca-rotation", app, json!({})), true).await;
    assert!(sleep_of(&p).is_some(), "the API server trusts the new CA");
    let log = op.log();
    assert!(!log.contains("orbidden"), "the chart's RBAC covers the certificate work:\n{log}");

    drop(op);
    let _ = Api::<MutatingWebhookConfiguration>::all(client.clone()).delete(fullname, &DeleteParams::default()).await;
    for ns in [app, optout, sys] {
        delete_namespace(&client, ns).await;
    }
}

#[tokio::test]
async fn certificate_module_on_the_real_api_server() {
    let client = common::client().await;
    let ns = "st-certs";
    let hook = "st-certs-e2e";
    common::fresh_namespace(&client, ns).await;
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let _ = hooks.delete(hook, &DeleteParams::default()).await;
    let _cleanup = Leftovers::new(&[&["mutatingwebhookconfiguration", hook]]);
    // two webhooks, never called (no namespace has the label)
    let w = |name: &str| {
        json!({"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Ignore",
            "clientConfig": {"url": "https://127.0.0.1:1/mutate"},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"safetermination.e2e/never": "true"}}})
    };
    let cfg: MutatingWebhookConfiguration =
        serde_json::from_value(json!({"metadata": {"name": hook}, "webhooks": [w("a.safetermination.io"), w("b.safetermination.io")]})).unwrap();
    hooks.create(&PostParams::default(), &cfg).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = CertConfig::new("webhook-tls", ns, "safe-termination");
    cfg.webhook_configuration = Some(hook.into());
    cfg.files = Some((dir.path().join("tls.crt"), dir.path().join("tls.key")));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);

    // first round: a new CA and serving certificate, both webhooks get the caBundle
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert!(matches!(o.action, Action::RenewCa(_)), "{o:?}");
    assert!(o.secret_written);
    assert_eq!(o.ca_bundle_patched, 2);
    let s1 = secrets.get("webhook-tls").await.unwrap();
    assert_eq!(s1.type_.as_deref(), Some("kubernetes.io/tls"));
    let data1 = secret_data(&client, ns, "webhook-tls").await.unwrap();
    assert_eq!(ca_bundles(&client, hook).await, vec![Some(data1["ca.crt"].clone()); 2]);
    let info = certs::observe(&data1).serving.unwrap();
    assert!(info.sans.contains(&"safe-termination.st-certs.svc".to_string()), "{:?}", info.sans);
    assert!(certs::sync_files(&client, &cfg).await.unwrap());
    assert_eq!(std::fs::read(dir.path().join("tls.crt")).unwrap(), data1["tls.crt"]);
    assert!(!certs::sync_files(&client, &cfg).await.unwrap(), "unchanged files are not rewritten");

    // second round: nothing to do, nothing written
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert!(matches!(o.action, Action::Keep { .. }), "{o:?}");
    assert!(!o.secret_written);
    assert_eq!(o.ca_bundle_patched, 0);
    assert_eq!(secrets.get("webhook-tls").await.unwrap().metadata.resource_version, s1.metadata.resource_version);

    // something resets one caBundle (a reinstall): repaired, Secret untouched
    let reset = json!([{"op": "replace", "path": "/webhooks/1/clientConfig/caBundle", "value": b64(b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n")}]);
    hooks.patch(hook, &PatchParams::default(), &Patch::<()>::Json(serde_json::from_value(reset).unwrap())).await.unwrap();
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert_eq!((o.secret_written, o.ca_bundle_patched), (false, 1));
    assert_eq!(ca_bundles(&client, hook).await, vec![Some(data1["ca.crt"].clone()); 2]);

    // a serving certificate past 2/3 of its life is renewed from the same CA
    let now = certs::unix_now();
    let ca_after = certs::bundle_info(&data1["ca.crt"]).unwrap()[0].not_after;
    let names = certs::subject_alt_names("safe-termination", ns, &[]);
    let (old_cert, old_key) = certs::generate_serving(
        std::str::from_utf8(&data1["ca.crt"]).unwrap(),
        std::str::from_utf8(&data1["ca.key"]).unwrap(),
        &names,
        now - 3000,
        Duration::from_secs(3600),
        ca_after,
    )
    .unwrap();
    let patch = json!({"data": {"tls.crt": b64(old_cert.as_bytes()), "tls.key": b64(old_key.as_bytes())}});
    secrets.patch("webhook-tls", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert!(matches!(&o.action, Action::RenewServing(why) if why.contains("two thirds")), "{o:?}");
    assert!(o.secret_written);
    let data2 = secret_data(&client, ns, "webhook-tls").await.unwrap();
    assert_eq!(data2["ca.crt"], data1["ca.crt"]);
    assert_ne!(data2["tls.crt"], old_cert.as_bytes());
    let renewed = certs::observe(&data2).serving.unwrap();
    assert!(renewed.not_after - now > 300 * 86_400, "a full-length certificate again");
    assert!(certs::sync_files(&client, &cfg).await.unwrap());

    // a Service rename is a new certificate for the new name
    cfg.service = "renamed".into();
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert!(matches!(&o.action, Action::RenewServing(why) if why.contains("renamed.st-certs.svc")), "{o:?}");

    // no webhook configuration (yet): the Secret is still kept, nothing fails
    hooks.delete(hook, &DeleteParams::default()).await.unwrap();
    let o = certs::reconcile_once(&client, &cfg).await.unwrap();
    assert_eq!(o.ca_bundle_patched, 0);
    delete_namespace(&client, ns).await;
}
