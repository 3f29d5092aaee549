//! Where the kube-proxies are: their pods through the API ([`discover`]: `kube-system`,
//! `k8s-app=kube-proxy`, port 10249) or a static list ([`parse_static_targets`],
//! `NODE=http://ip:port`) for tests and out-of-cluster runs, either as a [`TargetSource`]; and,
//! when there is no kube-proxy pod, whether Cilium's agents replace it ([`detect_dataplane`]).

use super::error::SourceError;
use crate::core::model::ProxyMode;
use crate::core::proxyconfig::Dataplane;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

/// Default namespace of the kube-proxy pods.
pub const DEFAULT_NAMESPACE: &str = "kube-system";
/// Default label selector of the kube-proxy pods.
pub const DEFAULT_SELECTOR: &str = "k8s-app=kube-proxy";
/// Default label selector of Cilium agent pods (the `cilium` DaemonSet of Cilium's Helm chart
/// and of `cilium install`), looked for in every namespace when no kube-proxy pod is found.
pub const DEFAULT_CILIUM_SELECTOR: &str = "k8s-app=cilium";
/// Default kube-proxy metrics port (`metricsBindAddress`).
pub const DEFAULT_PORT: u16 = 10249;

/// One kube-proxy to scrape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// The key its samples are stored under: the node name (`spec.nodeName`) for discovered
    /// pods, the given name for static targets.
    pub node: String,
    /// Scheme, host and port without a trailing slash, e.g. `http://10.0.0.7:10249` or
    /// `http://[fd00::7]:10249`.
    pub base_url: String,
}

impl Target {
    /// A target named `node` at `base_url` (a trailing `/` and a trailing `/metrics` are removed).
    pub fn new(node: impl Into<String>, base_url: &str) -> Self {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/metrics").unwrap_or(base);
        Self { node: node.into(), base_url: base.to_string() }
    }

    /// A target at `ip:port` over plain HTTP (IPv6 addresses are bracketed).
    pub fn from_ip(node: impl Into<String>, ip: IpAddr, port: u16) -> Self {
        Self { node: node.into(), base_url: format!("http://{}", SocketAddr::new(ip, port)) }
    }

    /// `base_url` + `path` (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    /// The port of `base_url`, when it names one.
    pub fn port(&self) -> Option<u16> {
        reqwest::Url::parse(&self.base_url).ok().and_then(|u| u.port_or_known_default())
    }
}

/// Parses one static target: `NODE=http://host:port` (the URL may end in `/metrics`), or a bare
/// `http://host:port` named after its `host:port`.
///
/// Errors: not an http(s) URL, or an empty node name.
pub fn parse_static_target(spec: &str) -> Result<Target, SourceError> {
    let spec = spec.trim();
    let (node, url) = match spec.split_once('=') {
        Some((n, u)) if !n.contains("://") => (n.trim().to_string(), u.trim()),
        _ => (String::new(), spec),
    };
    let bad = |message: String| SourceError::Target { spec: spec.to_string(), message };
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(format!("{url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(bad(format!("expected http://host:port, got {url:?}")));
    }
    let node = if node.is_empty() {
        if spec.contains('=') && !spec.split_once('=').is_some_and(|(n, _)| n.contains("://")) {
            return Err(bad("empty node name before '='".to_string()));
        }
        match parsed.port() {
            Some(p) => format!("{}:{p}", parsed.host_str().unwrap_or_default()),
            None => parsed.host_str().unwrap_or_default().to_string(),
        }
    } else {
        node
    };
    Ok(Target::new(node, url))
}

/// Parses a static target list (see [`parse_static_target`]); errors name the bad entry.
/// Duplicate node names are an error (their samples would mix).
pub fn parse_static_targets<S: AsRef<str>>(specs: &[S]) -> Result<Vec<Target>, SourceError> {
    let mut out: Vec<Target> = Vec::with_capacity(specs.len());
    for s in specs {
        let t = parse_static_target(s.as_ref())?;
        if out.iter().any(|o| o.node == t.node) {
            return Err(SourceError::Target { spec: s.as_ref().to_string(), message: format!("node {:?} is listed twice", t.node) });
        }
        out.push(t);
    }
    Ok(out)
}

/// Where and how to find kube-proxy pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// Namespace of the kube-proxy pods (default `kube-system`).
    pub namespace: String,
    /// Label selector (default `k8s-app=kube-proxy`).
    pub selector: String,
    /// Metrics port (default 10249).
    pub port: u16,
    /// Label selector of Cilium agent pods, looked for in all namespaces when no kube-proxy pod
    /// is found (default `k8s-app=cilium`; empty: never look).
    pub cilium_selector: String,
}

impl Default for Discovery {
    fn default() -> Self {
        Self { namespace: DEFAULT_NAMESPACE.into(), selector: DEFAULT_SELECTOR.into(), port: DEFAULT_PORT, cilium_selector: DEFAULT_CILIUM_SELECTOR.into() }
    }
}

/// The dataplane of a cluster without kube-proxy pods, from the Cilium agent pods found there
/// (`agents`, listed by `selector`): with at least one agent not being deleted and not
/// `Failed`/`Succeeded`, Cilium does the Service load-balancing itself (kube-proxy replacement),
/// so the mode is `ebpf`. `None` without such a pod.
///
/// Cilium's replacement programs Services into eBPF maps from its own watch and exports no
/// kube-proxy histograms, so there is no sync p99 to measure: sizing uses the policy default,
/// and the note says so.
pub fn cilium_dataplane(agents: &[Pod], selector: &str) -> Option<Dataplane> {
    let live: Vec<&Pod> = agents
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Failed" | "Succeeded")))
        .collect();
    let first = live.first()?;
    let mut namespaces: Vec<&str> = live.iter().filter_map(|p| p.metadata.namespace.as_deref()).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    let ns = if namespaces.is_empty() { first.metadata.namespace.as_deref().unwrap_or("?").to_string() } else { namespaces.join(",") };
    Some(Dataplane {
        mode: ProxyMode::Ebpf,
        note: format!("no kube-proxy pods; {} Cilium agent pod(s) ({selector} in {ns}): eBPF dataplane, sized from the policy default", live.len()),
    })
}

/// Looks for Cilium agent pods in all namespaces (`discovery.cilium_selector`) and classifies
/// them with [`cilium_dataplane`]. `Ok(None)` when the selector is empty or no agent runs.
///
/// Errors: the API call failed (RBAC needs cluster-wide `list pods`, which pod counting needs
/// too).
pub async fn detect_dataplane(client: &kube::Client, discovery: &Discovery) -> Result<Option<Dataplane>, SourceError> {
    if discovery.cilium_selector.is_empty() {
        return Ok(None);
    }
    let api: Api<Pod> = Api::all(client.clone());
    let pods = api
        .list(&ListParams::default().labels(&discovery.cilium_selector).limit(100))
        .await
        .map_err(|source| SourceError::Kube { what: format!("listing Cilium agent pods {:?}", discovery.cilium_selector), source })?;
    Ok(cilium_dataplane(&pods.items, &discovery.cilium_selector))
}

/// Targets from kube-proxy pods: only pods in phase `Running`, not being deleted, with a pod IP
/// (kube-proxy runs with hostNetwork, so that is the node IP). The node name is
/// `spec.nodeName` (the pod name when unset). When a node has two such pods (a DaemonSet
/// rollout), the newest is kept. Sorted by node name.
pub fn targets_from_pods(pods: &[Pod], port: u16) -> Vec<Target> {
    let mut best: BTreeMap<String, (&Pod, IpAddr)> = BTreeMap::new();
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(status) = pod.status.as_ref() else { continue };
        if status.phase.as_deref() != Some("Running") {
            continue;
        }
        let Some(ip) = status.pod_ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok()) else { continue };
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).or_else(|| pod.metadata.name.clone()).unwrap_or_default();
        if node.is_empty() {
            continue;
        }
        match best.get(&node) {
            Some((other, _)) if other.metadata.creation_timestamp >= pod.metadata.creation_timestamp => {}
            _ => {
                best.insert(node, (pod, ip));
            }
        }
    }
    best.into_iter().map(|(node, (_, ip))| Target::from_ip(node, ip, port)).collect()
}

/// Lists the kube-proxy pods (`Api::<Pod>::namespaced(..).list(selector)`) and turns them into
/// targets with [`targets_from_pods`].
///
/// Errors: the API call failed (RBAC needs `list pods` in the namespace).
pub async fn discover(client: &kube::Client, discovery: &Discovery) -> Result<Vec<Target>, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &discovery.namespace);
    let pods = api.list(&ListParams::default().labels(&discovery.selector)).await?;
    Ok(targets_from_pods(&pods.items, discovery.port))
}

/// Where the scrape loop gets its targets.
#[derive(Clone)]
pub enum TargetSource {
    /// A fixed list (tests, out-of-cluster runs).
    Static(Vec<Target>),
    /// kube-proxy pods found through the API on every cycle.
    Kube {
        /// The API client.
        client: kube::Client,
        /// Namespace, selector, port.
        discovery: Discovery,
    },
}

impl std::fmt::Debug for TargetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Static(t) => f.debug_tuple("Static").field(&t.len()).finish(),
            Self::Kube { discovery, .. } => f.debug_struct("Kube").field("discovery", discovery).finish(),
        }
    }
}

impl TargetSource {
    /// The current targets. Errors: discovery through the API failed (message with the
    /// namespace and selector).
    pub async fn targets(&self) -> Result<Vec<Target>, SourceError> {
        match self {
            Self::Static(t) => Ok(t.clone()),
            Self::Kube { client, discovery } => discover(client, discovery)
                .await
                .map_err(|source| SourceError::Kube { what: format!("listing pods {:?} in namespace {}", discovery.selector, discovery.namespace), source }),
        }
    }

    /// The API client and discovery settings, for the ConfigMap fallback and the dataplane
    /// detection of [`resolve_proxy_config`].
    pub fn kube_client(&self) -> Option<(&kube::Client, &Discovery)> {
        match self {
            Self::Static(_) => None,
            Self::Kube { client, discovery } => Some((client, discovery)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str, node: Option<&str>, phase: &str, ip: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(PodSpec { node_name: node.map(Into::into), host_network: Some(true), ..Default::default() }),
            status: Some(PodStatus { phase: Some(phase.into()), pod_ip: ip.map(Into::into), ..Default::default() }),
        }
    }

    #[test]
    fn a_cilium_agent_counts_only_while_it_runs() {
        let agent = |name: &str, phase: &str| {
            let mut p = pod(name, Some("n1"), phase, None);
            p.metadata.namespace = Some("kube-system".into());
            p
        };
        assert_eq!(cilium_dataplane(&[], "k8s-app=cilium"), None);
        assert_eq!(cilium_dataplane(&[agent("c1", "Failed"), agent("c2", "Succeeded")], "k8s-app=cilium"), None);
        let d = cilium_dataplane(&[agent("c1", "Pending"), agent("c2", "Running"), agent("c3", "Failed")], "k8s-app=cilium").unwrap();
        assert_eq!(d.mode, ProxyMode::Ebpf);
        assert_eq!(d.note, "no kube-proxy pods; 2 Cilium agent pod(s) (k8s-app=cilium in kube-system): eBPF dataplane, sized from the policy default");
    }

    #[test]
    fn pods_become_targets_running_with_an_ip_only() {
        let pods = vec![
            pod("kube-proxy-a", Some("node-a"), "Running", Some("10.0.0.1")),
            pod("kube-proxy-b", Some("node-b"), "Pending", Some("10.0.0.2")),
            pod("kube-proxy-c", Some("node-c"), "Running", None),
            pod("kube-proxy-d", Some("node-d"), "Running", Some("fd00::4")),
            pod("kube-proxy-e", None, "Running", Some("10.0.0.5")),
            pod("kube-proxy-f", Some("node-f"), "Failed", Some("10.0.0.6")),
        ];
        let t = targets_from_pods(&pods, 10249);
        assert_eq!(
            t,
            vec![
                Target::new("kube-proxy-e", "http://10.0.0.5:10249"),
                Target::new("node-a", "http://10.0.0.1:10249"),
                Target::new("node-d", "http://[fd00::4]:10249"),
            ]
        );
        assert_eq!(t[1].url("/metrics"), "http://10.0.0.1:10249/metrics");
        assert_eq!(t[2].port(), Some(10249));
    }

    #[test]
    fn terminating_pods_are_skipped_and_the_newest_pod_of_a_node_wins() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let mut old = pod("kube-proxy-old", Some("n"), "Running", Some("10.0.0.1"));
        let mut new = pod("kube-proxy-new", Some("n"), "Running", Some("10.0.0.9"));
        old.metadata.creation_timestamp = Some(Time("2024-01-01T00:00:00Z".parse().unwrap()));
        new.metadata.creation_timestamp = Some(Time("2024-06-01T00:00:00Z".parse().unwrap()));
        assert_eq!(targets_from_pods(&[new.clone(), old.clone()], 1)[0].base_url, "http://10.0.0.9:1");
        assert_eq!(targets_from_pods(&[old.clone(), new.clone()], 1)[0].base_url, "http://10.0.0.9:1");
        new.metadata.deletion_timestamp = Some(Time("2024-06-02T00:00:00Z".parse().unwrap()));
        assert_eq!(targets_from_pods(&[old, new], 1)[0].base_url, "http://10.0.0.1:1");
    }

    #[test]
    fn static_targets() {
        let t = parse_static_targets(&["node-a=http://127.0.0.1:10249", "http://127.0.0.1:9000/metrics", "b=http://[::1]:1/"]).unwrap();
        assert_eq!(t[0], Target::new("node-a", "http://127.0.0.1:10249"));
        assert_eq!(t[1], Target::new("127.0.0.1:9000", "http://127.0.0.1:9000"));
        assert_eq!(t[2].base_url, "http://[::1]:1");
        assert!(parse_static_target("a=10.0.0.1:10249").unwrap_err().to_string().contains("not a URL"));
        assert!(parse_static_target("a=ftp://x").unwrap_err().to_string().contains("expected http://host:port"));
        assert!(parse_static_target("=http://x:1").unwrap_err().to_string().contains("empty node name"));
        assert!(parse_static_targets(&["a=http://x:1", "a=http://y:1"]).unwrap_err().to_string().contains("listed twice"));
    }
}
