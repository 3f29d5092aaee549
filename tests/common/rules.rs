//! kube-proxy's rules read inside a real node's network namespace (read only), for the ground
//! truth of the propagation window (tests/e2e_deploy.rs, tests/e2e_window.rs); the real nodes
//! of the cluster (also tests/e2e_operator_pods.rs).

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};

/// One real node of the cluster (from `$ST_CLUSTER_JSON`): name, netns, kube-proxy mode.
#[derive(Clone, Debug)]
pub struct RealNode {
    /// Node name.
    pub name: String,
    /// Its network namespace (under /run/netns).
    pub netns: String,
    /// Its kube-proxy mode as cluster-up.sh names it (iptables-nft, nftables, ...).
    pub mode: String,
    /// Its node IP (kube-proxy's bind address, metrics on `:10249` unless rebound).
    pub ip: String,
}

/// The real nodes of `$ST_CLUSTER_JSON` (at least two).
pub fn real_nodes() -> Vec<RealNode> {
    let path = std::env::var("ST_CLUSTER_JSON").unwrap_or_else(|_| format!("{}/cluster.json", super::state_dir()));
    let cluster: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}: run make cluster-up")))
        .expect("cluster.json");
    let nodes: Vec<RealNode> = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["real"] == true)
        .map(|n| RealNode {
            name: n["name"].as_str().unwrap().into(),
            netns: n["kube_proxy"]["netns"].as_str().unwrap().into(),
            mode: n["kube_proxy"]["mode"].as_str().unwrap().into(),
            ip: n["kube_proxy"]["ip"].as_str().unwrap().into(),
        })
        .collect();
    assert!(nodes.len() >= 2, "the experiment needs two real nodes (ST_REAL_NODES=1 e2e/cluster-up.sh): {path}");
    nodes
}

/// The directory above `$ST_K8S_BIN` (holds the xtables-nft / xtables-legacy tool dirs).
pub fn k8s_dir() -> String {
    std::env::var("ST_K8S_BIN").expect("ST_K8S_BIN: source $ST_E2E_DIR/env").trim_end_matches("/bin").to_string()
}

/// Reads, inside a node's netns, which endpoint IPs the kube-proxy rules of Service `ns/web`
/// send new connections to. Read only: `iptables -S <KUBE-SVC chain>` (iptables modes) or
/// `nft list chain ip kube-proxy <service chain>` (nftables: its dnat map of endpoints). The chain is looked up once, then listed alone (fast at scale).
pub struct RuleReader {
    /// The node whose rules are read.
    pub node: RealNode,
    ns: String,
    /// The Service's chain once found.
    pub chain: Option<String>,
    /// iptables: endpoint chain (KUBE-SEP-…, named after a hash of the endpoint) -> its IP.
    sep_ip: BTreeMap<String, String>,
}

impl RuleReader {
    /// A reader for Service `ns/web` (port `http`) on `node`.
    pub fn new(node: RealNode, ns: &str) -> RuleReader {
        RuleReader { node, ns: ns.to_string(), chain: None, sep_ip: BTreeMap::new() }
    }

    /// `nsenter` into the node's network namespace.
    pub fn nsenter(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.node.netns));
        c
    }

    fn iptables_dir(&self) -> String {
        let backend = if self.node.mode == "iptables-legacy" { "legacy" } else { "nft" };
        format!("{}/xtables-{backend}", k8s_dir())
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self.nsenter().args(args).stderr(Stdio::null()).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    }

    fn find_chain(&self) -> Option<String> {
        if self.node.mode == "nftables" {
            let text = self.run(&["nft", "list", "chains"]);
            let suffix = format!("-{}/web/tcp/http", self.ns);
            text.lines().map(str::trim).filter_map(|l| l.strip_prefix("chain ")).map(|l| l.trim_end_matches(" {").trim()).find(|c| {
                c.starts_with("service-") && c.ends_with(&suffix)
            }).map(str::to_string)
        } else {
            let text = self.run(&[&format!("{}/iptables-save", self.iptables_dir()), "-t", "nat"]);
            let comment = format!("\"{}/web:http cluster IP\"", self.ns);
            text.lines()
                .filter(|l| l.starts_with("-A KUBE-SERVICES") && l.contains(&comment))
                .find_map(|l| l.split_whitespace().skip_while(|w| *w != "-j").nth(1).map(str::to_string))
                .filter(|c| c.starts_with("KUBE-SVC-"))
        }
    }

    /// The endpoint IPs in the rules now; None while the Service's chain is not found.
    pub fn endpoint_ips(&mut self) -> Option<BTreeSet<String>> {
        if self.chain.is_none() {
            self.chain = self.find_chain();
        }
        let chain = self.chain.clone()?;
        let text = if self.node.mode == "nftables" {
            self.run(&["nft", "list", "chain", "ip", "kube-proxy", &chain])
        } else {
            self.run(&[&format!("{}/iptables", self.iptables_dir()), "-t", "nat", "-S", &chain])
        };
        let ips = if self.node.mode == "nftables" {
            // meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.10 . 8080, 1 : 10.244.2.3 . 8080 }
            nft_map_ips(&text)
        } else {
            // -A KUBE-SVC-X ... -j KUBE-SEP-Y: above 1,000 endpoints kube-proxy drops the rule
            // comments that name the endpoint, so each KUBE-SEP chain's DNAT target is read (once:
            // the chain name is a hash of the endpoint, so it never changes its IP)
            let seps: Vec<String> = text.split_whitespace().filter(|w| w.starts_with("KUBE-SEP-")).map(str::to_string).collect();
            let mut ips = BTreeSet::new();
            for sep in seps {
                if !self.sep_ip.contains_key(&sep) {
                    let rules = self.run(&[&format!("{}/iptables", self.iptables_dir()), "-t", "nat", "-S", &sep]);
                    // -A KUBE-SEP-Y -p tcp ... -j DNAT --to-destination 10.244.1.5:8080
                    if let Some(ip) = rules.split("--to-destination ").nth(1).and_then(|r| r.split(':').next()) {
                        self.sep_ip.insert(sep.clone(), ip.to_string());
                    }
                }
                if let Some(ip) = self.sep_ip.get(&sep) {
                    ips.insert(ip.clone());
                }
            }
            ips
        };
        Some(ips)
    }
}

/// The endpoint IPs in a line of nftables rule text: `... map { 0 : 10.244.1.10 . 8080, ... }`.
pub fn nft_map_ips(text: &str) -> BTreeSet<String> {
    let segments: Vec<&str> = text.split(" . ").collect();
    segments[..segments.len() - 1].iter().filter_map(|s| s.split_whitespace().last()).map(str::to_string).collect()
}

