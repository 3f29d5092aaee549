//! kube-proxy's rules read inside a real node's network namespace (read only), and a Cilium
//! node's load-balancer maps read by Cilium's own `cilium-dbg`, for the ground truth of the
//! propagation window (tests/e2e_deploy.rs, tests/e2e_window.rs); the real nodes of the cluster
//! (also tests/e2e_operator_pods.rs).
//!
//! A read is a sample only when it succeeded: its command started, exited 0, and its output
//! parsed (the Service's chain is there and every endpoint in it is an IP address). Anything else
//! is a [`ReadError`] naming the command and how it failed, and it is no sample: it says nothing
//! about which IPs are in the rules. [`RuleTrace`] turns the samples of one node into
//! transitions, so an IP counts as removed only when a successful read no longer shows it, and
//! each removal carries its error bound: after the start of the last successful read that still
//! showed the IP, by the end of the first successful read that no longer did (unix seconds).
//! tests/rule_reader.rs runs all of this against fake `nft` and `iptables` programs (failing,
//! printing garbage, dying) in plain `cargo test`.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One real node of the cluster (from `$ST_CLUSTER_JSON`): name, netns, data plane.
#[derive(Clone, Debug)]
pub struct RealNode {
    /// Node name.
    pub name: String,
    /// Its network namespace (under /run/netns).
    pub netns: String,
    /// Its kube-proxy mode as cluster-up.sh names it (iptables-nft, nftables, ...), or `cilium`
    /// on a Cilium node (no kube-proxy).
    pub mode: String,
    /// Its node IP (kube-proxy's bind address, metrics on `:10249` unless rebound).
    pub ip: String,
    /// A Cilium node's own bpffs (its load-balancer maps pinned under `tc/globals`).
    pub bpf_root: Option<String>,
    /// A Cilium node's cgroup2 sub-tree: socket LB load-balances connect() only for processes
    /// in it (a load generator on the node must join it).
    pub cgroup2: Option<String>,
}

impl RealNode {
    /// Whether Cilium load-balances this node's Services.
    pub fn is_cilium(&self) -> bool {
        self.mode == "cilium"
    }
}

/// The real nodes of `$ST_CLUSTER_JSON` (at least two).
pub fn real_nodes() -> Vec<RealNode> {
    let path = std::env::var("ST_CLUSTER_JSON").unwrap_or_else(|_| format!("{}/cluster.json", super::state_dir()));
    let cluster: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}: run make cluster-up"))).expect("cluster.json");
    let nodes: Vec<RealNode> = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["real"] == true)
        .map(|n| {
            let (plane, mode) = if n["cilium"].is_object() { (&n["cilium"], "cilium") } else { (&n["kube_proxy"], n["kube_proxy"]["mode"].as_str().unwrap()) };
            RealNode {
                name: n["name"].as_str().unwrap().into(),
                netns: plane["netns"].as_str().unwrap().into(),
                mode: mode.into(),
                ip: plane["ip"].as_str().unwrap().into(),
                bpf_root: plane["bpf_root"].as_str().map(String::from),
                cgroup2: plane["cgroup2"].as_str().map(String::from),
            }
        })
        .collect();
    assert!(nodes.len() >= 2, "the experiment needs two real nodes (ST_REAL_NODES=1 e2e/cluster/cluster-up.sh): {path}");
    nodes
}

/// The directory above `$ST_K8S_BIN` (holds the xtables-nft / xtables-legacy tool dirs).
pub fn k8s_dir() -> String {
    std::env::var("ST_K8S_BIN").expect("ST_K8S_BIN: source $ST_E2E_DIR/env").trim_end_matches("/bin").to_string()
}

/// Now, unix seconds.
pub fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Why a read of a node's rules gave no sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadError {
    /// The command as run, e.g. `nsenter --net=/run/netns/st-node-b nft list chain ip kube-proxy
    /// service-…`.
    pub command: String,
    /// How it failed: `cannot start: …`, `exit status: 1: <stderr>`, `no chain of …`,
    /// `unparsable output: …`.
    pub how: String,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.command, self.how)
    }
}

impl std::error::Error for ReadError {}

/// Reads, inside a node's netns, which endpoint IPs the kube-proxy rules of Service `ns/web`
/// send new connections to. Read only: `iptables -S <KUBE-SVC chain>` and each of its KUBE-SEP
/// chains (iptables modes) or `nft list chain ip kube-proxy <service chain>` (nftables: its dnat
/// map of endpoints). The chain is looked up once, then listed alone (fast at scale).
///
/// On a Cilium node: `cilium-dbg bpf lb list --frontends` and `--backends` (Cilium's own reader
/// of its maps, with the node's bpffs bound at /sys/fs/bpf in a mount namespace of the read's
/// own), the "chain" being the Service's frontend `clusterIP:port/TCP` (from the API, once). A
/// backend takes new connections while it is in one of its frontend's active slots, 1 to slot
/// 0's count (`bpf/lib/lb.h`: the datapath picks `slot = random % count + 1`); the terminating
/// backends after them are not counted.
#[derive(Clone)]
pub struct RuleReader {
    /// The node whose rules are read.
    pub node: RealNode,
    ns: String,
    /// The Service's chain once found.
    pub chain: Option<String>,
    /// iptables: endpoint chain (KUBE-SEP-…, named after a hash of the endpoint) -> its IP.
    sep_ip: BTreeMap<String, String>,
    /// The program and leading arguments every read runs under, the read's own command appended:
    /// `nsenter --net=/run/netns/<netns>` on a real node.
    prefix: Vec<String>,
    /// The directory of the node's `iptables` and `iptables-save` (unused in nftables mode).
    iptables_dir: String,
}

impl RuleReader {
    /// A reader for Service `ns/web` (port `http`) on real node `node`.
    pub fn new(node: RealNode, ns: &str) -> RuleReader {
        if let Some(bpffs) = node.bpf_root.clone() {
            // both listings in one read, so they see the maps within ~0.1 s of each other
            let script = format!(
                "mount --bind {bpffs} /sys/fs/bpf && \"$0\" bpf lb list --frontends -o json && echo {CILIUM_SEPARATOR} && exec \"$0\" bpf lb list --backends -o json"
            );
            let prefix = vec!["unshare".to_string(), "-m".into(), "--propagation".into(), "private".into(), "sh".into(), "-c".into(), script];
            return Self::with_command(node, ns, prefix, "");
        }
        let prefix = vec!["nsenter".to_string(), format!("--net=/run/netns/{}", node.netns)];
        let iptables_dir = if node.mode == "nftables" {
            String::new()
        } else {
            let backend = if node.mode == "iptables-legacy" { "legacy" } else { "nft" };
            format!("{}/xtables-{backend}", k8s_dir())
        };
        Self::with_command(node, ns, prefix, &iptables_dir)
    }

    /// A reader that runs every read as `prefix… <read command>` and finds `iptables` and
    /// `iptables-save` in `iptables_dir`: the unit tests' fake programs (e.g. prefix `env
    /// PATH=<dir with a fake nft>`).
    pub fn with_command(node: RealNode, ns: &str, prefix: Vec<String>, iptables_dir: &str) -> RuleReader {
        RuleReader { node, ns: ns.to_string(), chain: None, sep_ip: BTreeMap::new(), prefix, iptables_dir: iptables_dir.to_string() }
    }

    /// The command `args` as this reader runs it (inside the node's netns on a real node).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut all = self.prefix.iter().map(String::as_str).chain(args.iter().copied());
        let mut c = Command::new(all.next().expect("a command"));
        c.args(all);
        c
    }

    /// `args` as [`RuleReader::command`] prints it, for errors.
    pub fn command_line(&self, args: &[&str]) -> String {
        self.prefix.iter().map(String::as_str).chain(args.iter().copied()).collect::<Vec<_>>().join(" ")
    }

    fn error(&self, args: &[&str], how: impl Into<String>) -> ReadError {
        ReadError { command: self.command_line(args), how: how.into() }
    }

    /// Runs `args`; its stdout when it started, exited 0 and printed UTF-8.
    fn run(&self, args: &[&str]) -> Result<String, ReadError> {
        let out = self.command(args).stdin(Stdio::null()).output().map_err(|e| self.error(args, format!("cannot start: {e}")))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stderr: String = stderr.trim().chars().take(300).collect();
            return Err(self.error(args, format!("{}: {stderr}", out.status)));
        }
        String::from_utf8(out.stdout).map_err(|_| self.error(args, "unparsable output: not UTF-8"))
    }

    fn iptables(&self, tool: &str) -> String {
        format!("{}/{tool}", self.iptables_dir)
    }

    /// Whether `chain` is the nftables service chain of `ns/web` port `http`.
    pub fn is_service_chain(&self, chain: &str) -> bool {
        chain.starts_with("service-") && chain.ends_with(&format!("-{}/web/tcp/http", self.ns))
    }

    fn find_chain(&self) -> Result<String, ReadError> {
        if self.node.is_cilium() {
            let kubectl = format!("{}/bin/kubectl", k8s_dir());
            let args = [kubectl.as_str(), "-n", &self.ns, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP} {.spec.ports[?(@.name==\"http\")].port}"];
            let out = Command::new(args[0]).args(&args[1..]).stdin(Stdio::null()).output().map_err(|e| self.error(&args, format!("cannot start: {e}")))?;
            let text = String::from_utf8_lossy(&out.stdout);
            return match text.split_whitespace().collect::<Vec<_>>()[..] {
                [ip, port] if out.status.success() && ip.parse::<IpAddr>().is_ok() && port.parse::<u16>().is_ok() => Ok(format!("{ip}:{port}/TCP")),
                _ => Err(self.error(&args, format!("{}: no clusterIP and port http in {text:?}", out.status))),
            };
        }
        if self.node.mode == "nftables" {
            let args = ["nft", "list", "chains"];
            let text = self.run(&args)?;
            text.lines()
                .map(str::trim)
                .filter_map(|l| l.strip_prefix("chain "))
                .map(|l| l.trim_end_matches('{').trim())
                .find(|c| self.is_service_chain(c))
                .map(str::to_string)
                .ok_or_else(|| self.error(&args, format!("no chain of Service {}/web port http in the output", self.ns)))
        } else {
            let tool = self.iptables("iptables-save");
            let args = [tool.as_str(), "-t", "nat"];
            let text = self.run(&args)?;
            if !text.lines().any(|l| l == "*nat") || !text.lines().any(|l| l == "COMMIT") {
                return Err(self.error(&args, "unparsable output: no '*nat' table ending in COMMIT"));
            }
            let comment = format!("\"{}/web:http cluster IP\"", self.ns);
            text.lines()
                .filter(|l| l.starts_with("-A KUBE-SERVICES") && l.contains(&comment))
                .find_map(|l| l.split_whitespace().skip_while(|w| *w != "-j").nth(1).map(str::to_string))
                .filter(|c| c.starts_with("KUBE-SVC-"))
                .ok_or_else(|| self.error(&args, format!("no KUBE-SVC chain of Service {}/web port http in the output", self.ns)))
        }
    }

    /// The endpoint IPs in the rules now, or why this read is no sample (the Service's chain not
    /// found, a command that failed, output that did not parse).
    pub fn endpoint_ips(&mut self) -> Result<BTreeSet<String>, ReadError> {
        if self.chain.is_none() {
            self.chain = Some(self.find_chain()?);
        }
        let chain = self.chain.clone().unwrap();
        if self.node.is_cilium() {
            let dbg = cilium_dbg();
            let text = self.run(&[&dbg])?;
            return parse_cilium_lb(&text, &chain).map_err(|why| self.error(&[&dbg], format!("unparsable output: {why}")));
        }
        if self.node.mode == "nftables" {
            let args = ["nft", "list", "chain", "ip", "kube-proxy", &chain];
            let text = self.run(&args)?;
            return parse_nft_chain(&text, &chain).map_err(|why| self.error(&args, format!("unparsable output: {why}")));
        }
        let tool = self.iptables("iptables");
        let args = [tool.as_str(), "-t", "nat", "-S", &chain];
        let text = self.run(&args)?;
        // -A KUBE-SVC-X ... -j KUBE-SEP-Y: above 1,000 endpoints kube-proxy drops the rule
        // comments that name the endpoint, so each KUBE-SEP chain's DNAT target is read (once:
        // the chain name is a hash of the endpoint, so it never changes its IP)
        let seps = parse_iptables_chain(&text, &chain).map_err(|why| self.error(&args, format!("unparsable output: {why}")))?;
        let mut ips = BTreeSet::new();
        for sep in seps {
            if !self.sep_ip.contains_key(&sep) {
                // a KUBE-SEP chain deleted between the two listings fails this read as a whole:
                // leaving its IP out would record a removal no successful read has seen
                let args = [tool.as_str(), "-t", "nat", "-S", &sep];
                let rules = self.run(&args)?;
                let ip = parse_sep_ip(&rules, &sep).map_err(|why| self.error(&args, format!("unparsable output: {why}")))?;
                self.sep_ip.insert(sep.clone(), ip);
            }
            ips.insert(self.sep_ip[&sep].clone());
        }
        Ok(ips)
    }
}

/// What the Cilium read prints between `--frontends` and `--backends`.
const CILIUM_SEPARATOR: &str = "----backends----";

/// `cilium-dbg` of the cached Cilium build (e2e/toolchain/build-cilium.sh).
pub fn cilium_dbg() -> String {
    let cache = std::env::var("ST_CACHE_DIR").unwrap_or_else(|_| format!("{}/.cache/safe-termination", std::env::var("HOME").unwrap_or_default()));
    format!("{cache}/cilium-v1.20.2/bin/cilium-dbg")
}

/// The backends in frontend `frontend`'s active slots (`10.96.1.2:80/TCP`), from `cilium-dbg bpf
/// lb list --frontends -o json`, [`CILIUM_SEPARATOR`], then `--backends -o json`.
///
/// Shapes: frontends `{"<ip>:<port>/<proto> (<slot>)": ["<backend id> <count>[<qcount>] (<rev
/// nat id>) [...]"]}`, slot 0 holding the counts and slot k>0 a backend id; backends `{"<id>":
/// ["TCP://<ip>"]}`. Errors: the frontend's slot 0 missing (the Service not programmed: no
/// sample), a slot in 1..count missing, an unknown backend id, or anything not in these shapes.
pub fn parse_cilium_lb(text: &str, frontend: &str) -> Result<BTreeSet<String>, String> {
    let (front, back) = text.split_once(CILIUM_SEPARATOR).ok_or("no backends listing")?;
    let front: BTreeMap<String, Vec<String>> = serde_json::from_str(front).map_err(|e| format!("frontends: {e}"))?;
    let back: BTreeMap<String, Vec<String>> = serde_json::from_str(back).map_err(|e| format!("backends: {e}"))?;
    let slot = |k: u32| front.get(&format!("{frontend} ({k})")).and_then(|v| v.first()).map(|s| s.split_whitespace().collect::<Vec<_>>());
    let master = slot(0).ok_or_else(|| format!("no slot 0 of {frontend}"))?;
    let count: u32 = master
        .get(1)
        .and_then(|c| c.split_once('['))
        .and_then(|(c, _)| c.parse().ok())
        .ok_or_else(|| format!("slot 0 of {frontend} has no count: {master:?}"))?;
    let mut ips = BTreeSet::new();
    for k in 1..=count {
        let id = slot(k).and_then(|f| f.first().map(|s| s.to_string())).ok_or_else(|| format!("slot {k} of {frontend} missing (count {count})"))?;
        let addr = back.get(&id).and_then(|v| v.first()).ok_or_else(|| format!("backend {id} of {frontend} slot {k} not listed"))?;
        let ip = addr.rsplit_once("://").map_or(addr.as_str(), |(_, ip)| ip);
        ip.parse::<IpAddr>().map_err(|_| format!("backend {id}: {addr:?} is not an address"))?;
        ips.insert(ip.to_string());
    }
    Ok(ips)
}

/// The KUBE-SEP chains `iptables -S <chain>` jumps to. The output must be that chain alone:
/// `-N <chain>` first, then only `-A <chain> …` rules.
pub fn parse_iptables_chain(text: &str, chain: &str) -> Result<Vec<String>, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    if lines.next() != Some(format!("-N {chain}").as_str()) {
        return Err(format!("does not start with '-N {chain}'"));
    }
    let mut seps = Vec::new();
    for l in lines {
        if !l.starts_with(&format!("-A {chain} ")) {
            return Err(format!("line {l:?} is not a rule of {chain}"));
        }
        if let Some(target) = l.split_whitespace().skip_while(|w| *w != "-j").nth(1)
            && target.starts_with("KUBE-SEP-")
        {
            seps.push(target.to_string());
        }
    }
    Ok(seps)
}

/// The endpoint IP of a KUBE-SEP chain from `iptables -S <sep>`: its DNAT rule's
/// `--to-destination IP:port`.
pub fn parse_sep_ip(text: &str, sep: &str) -> Result<String, String> {
    // -A KUBE-SEP-Y -p tcp ... -j DNAT --to-destination 10.244.1.5:8080
    let target = text
        .lines()
        .filter(|l| l.starts_with(&format!("-A {sep} ")))
        .find_map(|l| l.split("--to-destination ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .ok_or_else(|| format!("no DNAT --to-destination in {sep}"))?;
    let host = target.rsplit_once(':').map_or(target, |(h, _)| h);
    host.parse::<IpAddr>().map(|ip| ip.to_string()).map_err(|_| format!("{sep}: DNAT target {target:?} is not IP:port"))
}

/// The endpoint IPs of `nft list chain ip kube-proxy <chain>`: the dnat map of its rules. The
/// listing must be complete (the chain's header, and the closing brace last) and every map entry
/// an IP address; a chain without a map line has no endpoints.
pub fn parse_nft_chain(text: &str, chain: &str) -> Result<BTreeSet<String>, String> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if !lines.iter().any(|l| *l == format!("chain {chain} {{")) {
        return Err(format!("no 'chain {chain} {{' line"));
    }
    if lines.last() != Some(&"}") {
        return Err("the listing does not end with '}' (cut short?)".into());
    }
    let mut ips = BTreeSet::new();
    for l in lines.iter().filter(|l| l.contains(" map {")) {
        ips.extend(nft_map_ips(l)?);
    }
    Ok(ips)
}

/// The endpoint IPs in a line of nftables rule text: `... map { 0 : 10.244.1.10 . 8080, ... }`
/// (a `nft list chain` rule or an `nft monitor` `add rule` line). Every entry must be an IP
/// address and the map closed.
pub fn nft_map_ips(line: &str) -> Result<BTreeSet<String>, String> {
    let Some((_, map)) = line.split_once(" map {") else { return Err(format!("no map in {line:?}")) };
    if !map.trim_end().ends_with('}') {
        return Err(format!("unterminated map in {line:?}"));
    }
    let segments: Vec<&str> = map.split(" . ").collect();
    if segments.len() < 2 {
        return Err(format!("no 'IP . port' entry in {line:?}"));
    }
    segments[..segments.len() - 1]
        .iter()
        .map(|s| {
            let word = s.split_whitespace().last().unwrap_or("");
            word.parse::<IpAddr>().map(|ip| ip.to_string()).map_err(|_| format!("map entry {word:?} is not an IP address in {line:?}"))
        })
        .collect()
}

/// An IP entering or leaving one node's rules, between two successful reads (unix seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// The endpoint IP.
    pub ip: String,
    /// True: it appeared; false: it left the rules.
    pub present: bool,
    /// The start of the last successful read that still showed the old state: the change
    /// happened after it.
    pub after: f64,
    /// The end of the first successful read that showed the new state: the change happened by
    /// then. The conservative time of the change for "sleep >= window".
    pub by: f64,
}

/// One node's rules followed over time: the transitions between successful reads, and how many
/// reads succeeded and failed. A failed read changes nothing.
#[derive(Clone, Debug, Default)]
pub struct RuleTrace {
    /// The IPs of the last successful read, and its start (unix seconds).
    last: Option<(BTreeSet<String>, f64)>,
    /// Every change seen, in order.
    pub transitions: Vec<Transition>,
    /// Successful reads.
    pub reads: u64,
    /// Reads that were no sample (each a [`ReadError`]).
    pub failed_reads: u64,
    /// `nft monitor` reports of lost netlink events (its socket buffer overflowed): each one is
    /// followed by a full read, since a change of the Service's chain may be among them.
    pub lost_events: u64,
    /// The first few failures, for the log.
    pub errors: Vec<String>,
    /// `nft monitor` only: the full reads of the chain made after each monitored change of it
    /// (coalesced), from the same first read. A removal the monitor never showed is taken from
    /// them ([`RuleTrace::removal`]).
    pub confirmed: Option<Box<RuleTrace>>,
}

impl RuleTrace {
    /// Records a read that ran from `started` to `finished` (unix seconds).
    pub fn observe(&mut self, read: Result<BTreeSet<String>, ReadError>, started: f64, finished: f64) {
        match read {
            Err(e) => self.fail(&e),
            Ok(now) => {
                self.reads += 1;
                if let Some((before, after)) = &self.last {
                    let after = *after;
                    for ip in now.difference(before) {
                        self.transitions.push(Transition { ip: ip.clone(), present: true, after, by: finished });
                    }
                    for ip in before.difference(&now) {
                        self.transitions.push(Transition { ip: ip.clone(), present: false, after, by: finished });
                    }
                }
                self.last = Some((now, started));
            }
        }
    }

    /// Counts a failed read.
    pub fn fail(&mut self, e: &ReadError) {
        self.failed_reads += 1;
        if self.errors.len() < 5 {
            self.errors.push(e.to_string());
        }
    }

    /// The IPs of the last successful read (None before the first).
    pub fn present(&self) -> Option<&BTreeSet<String>> {
        self.last.as_ref().map(|(ips, _)| ips)
    }

    /// The first removal of `ip` that was complete by `not_before` or later (unix seconds); of a
    /// monitored node, from the confirming full reads when the monitor never showed one.
    pub fn removal(&self, ip: &str, not_before: f64) -> Option<&Transition> {
        self.own_removal(ip, not_before).or_else(|| self.confirmed.as_ref()?.removal(ip, not_before))
    }

    /// The removal [`RuleTrace::removal`] gives when only the confirming full reads saw it: None
    /// when the monitor showed one (or no read did).
    pub fn removal_missed_by_monitor(&self, ip: &str, not_before: f64) -> Option<&Transition> {
        self.own_removal(ip, not_before).is_none().then(|| self.confirmed.as_ref()?.removal(ip, not_before)).flatten()
    }

    /// [`RuleTrace::removal`] from this trace's own reads alone (a monitored node: the monitor's
    /// lines and the full reads at its start and after lost events).
    fn own_removal(&self, ip: &str, not_before: f64) -> Option<&Transition> {
        self.transitions.iter().find(|t| t.ip == ip && !t.present && t.by >= not_before)
    }

    /// The removal of `ip` complete by `since` or later that left it absent through `until`
    /// (unix seconds): the last change of `ip` complete before `until`, when that is a removal
    /// complete by `since` or later. None when `ip` was in the rules at `until`, or left them
    /// before `since`. For an endpoint that left the rules before its pod's deletion (a pod
    /// that turned not ready, which a ReplicaSet deletes first when it scales down).
    pub fn absent_since(&self, ip: &str, since: f64, until: f64) -> Option<&Transition> {
        let own = self.transitions.iter().rev().find(|t| t.ip == ip && t.by < until).filter(|t| !t.present && t.by >= since);
        own.or_else(|| self.confirmed.as_ref()?.absent_since(ip, since, until))
    }
}

/// Reads `reader`'s rules every `every` until `stop`.
pub fn poll(reader: &mut RuleReader, stop: &AtomicBool, every: Duration) -> RuleTrace {
    let mut trace = RuleTrace::default();
    while !stop.load(Ordering::Relaxed) {
        let started = now_unix();
        let read = reader.endpoint_ips();
        trace.observe(read, started, now_unix());
        std::thread::sleep(every);
    }
    trace
}

/// Follows an nftables node's rules with `nft monitor rules` until `stop`: each `add rule` line
/// of the Service's chain with a dnat map is a sample (the whole endpoint set, at the time the
/// line is read); a line of that chain whose map does not parse is a failed read. The monitor
/// is started before a full read of the chain, so no change falls between the two. A monitor
/// that exits before `stop` (or cannot start) is a failed read, not the end of the rules: it is
/// started again after a full read. Polling `nft list chain` instead costs 0.5 s per read at
/// 4,000 Services (nft loads the whole table first).
///
/// `nft monitor` loses events when its netlink socket overflows (a full sync of kube-proxy's
/// table at 4,000 Services under load): it then prints `# ERROR: We lost some netlink events!`
/// and goes on, so that line is followed by a full read of the chain ([`RuleTrace::lost_events`]).
///
/// The bound of a monitored removal is wide by nature: its lower end is the previous sample
/// (the previous monitored change of the chain, or the full read), since the monitor reports
/// changes, not the state between them; its upper end is when the line was read.
///
/// Beside the monitor, each monitored change of the chain triggers a full read of it on a thread
/// of its own (changes that arrive during a read share the next one), recorded in
/// [`RuleTrace::confirmed`]: in three of about a dozen runs at 2,000 Services the monitor printed
/// no line without a deleted pod's IP while kube-proxy went on syncing, with no lost events
/// reported (once a line still held the IP the full read after it no longer did). The full reads
/// bound such a miss by the next change of the chain.
pub fn follow_nft_monitor(reader: &mut RuleReader, stop: &AtomicBool) -> RuleTrace {
    use std::io::BufRead;
    let mut trace = RuleTrace::default();
    let mut confirm = RuleTrace::default();
    let args = ["nft", "monitor", "rules"];
    while !stop.load(Ordering::Relaxed) {
        let spawned = reader.command(&args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn();
        let mut monitor = match spawned {
            Ok(m) => m,
            Err(e) => {
                trace.fail(&reader.error(&args, format!("cannot start: {e}")));
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let started = now_unix();
        let read = reader.endpoint_ips();
        let finished = now_unix();
        confirm.observe(read.clone(), started, finished);
        trace.observe(read, started, finished);
        let stdout = monitor.stdout.take().unwrap();
        let pid = monitor.id() as i32;
        let done = AtomicBool::new(false);
        let changes = AtomicU64::new(0);
        let mut confirm_reader = reader.clone();
        let confirm = &mut confirm;
        std::thread::scope(|s| {
            // the confirming full reads: one after each monitored change (coalesced)
            s.spawn(|| {
                let mut handled = 0;
                while !stop.load(Ordering::Relaxed) && !done.load(Ordering::Relaxed) {
                    let seen = changes.load(Ordering::Relaxed);
                    if seen == handled {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    handled = seen;
                    let started = now_unix();
                    let read = confirm_reader.endpoint_ips();
                    confirm.observe(read, started, now_unix());
                }
            });
            // stops the monitor when the sampling ends (its stdout then ends too)
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) && !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if !done.load(Ordering::Relaxed) {
                    // SAFETY: kill(2) on our own child, not yet waited for (its pid is not reused)
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                }
            });
            for line in std::io::BufReader::new(stdout).lines() {
                let t = now_unix();
                let line = match line {
                    Ok(l) => l,
                    Err(e) => {
                        trace.fail(&reader.error(&args, format!("unreadable output: {e}")));
                        break;
                    }
                };
                // nft prints this on stdout when its netlink socket overflowed (ENOBUFS) and goes
                // on: the lost events may hold a change of the chain, so the state is read again
                if line.starts_with("# ERROR: We lost some netlink events") {
                    trace.lost_events += 1;
                    let started = now_unix();
                    let read = reader.endpoint_ips();
                    trace.observe(read, started, now_unix());
                    continue;
                }
                // add rule ip kube-proxy <chain> meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.10 . 8080, ... }
                let mut words = line.split_whitespace();
                if words.by_ref().take(4).collect::<Vec<_>>() != ["add", "rule", "ip", "kube-proxy"] {
                    continue;
                }
                let Some(chain) = words.next() else { continue };
                if !reader.is_service_chain(chain) || !line.contains(" map {") {
                    continue;
                }
                let read = nft_map_ips(&line).map_err(|why| reader.error(&args, format!("unparsable line: {why}")));
                trace.observe(read, t, t);
                changes.fetch_add(1, Ordering::Relaxed);
            }
            done.store(true, Ordering::Relaxed);
        });
        // a monitor whose output broke off may still run; one that exited keeps its status
        let _ = monitor.kill();
        let status = monitor.wait();
        if !stop.load(Ordering::Relaxed) {
            let how = status.map_or_else(|e| format!("lost: {e}"), |s| format!("exited ({s}) before the sampling ended"));
            trace.fail(&reader.error(&args, how));
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    trace.confirmed = Some(Box::new(confirm));
    trace
}
