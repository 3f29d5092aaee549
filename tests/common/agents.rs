//! Node agents (`safe-termination agent`) on the real nodes of the e2e cluster, run as the
//! cluster runs kube-proxy there: a process inside each node's network namespace (`nsenter
//! --net=/run/netns/<netns>`), listening on the node's address, reading that node's kube-proxy
//! and its rules with the node's own `nft` and `iptables` (the xtables builds of
//! `$ST_K8S_BIN/..`, as tests/common/rules.rs reads them), or a Cilium node's pinned maps. Mutual TLS from certificates made by
//! the operator's own certificate code. Killed (by PID, each is this test's own child) on drop.

use super::rules::{RealNode, k8s_dir, real_nodes};
use safe_termination::certs::{self, AGENT_CERT, AGENT_KEY, Action, CA_CERT, CLIENT_CERT, CLIENT_KEY};
use std::path::Path;
use std::process::{Child, Command};

/// The agents' mutual-TLS port on each node (not the default 10349: a chart's agent
/// DaemonSet of another test may still hold that one while it terminates).
pub const PORT: u16 = 10359;
const HEALTH_PORT: u16 = 10360;

/// One agent per real node, and the operator flags that reach them.
pub struct NodeAgents {
    children: Vec<(String, Child)>,
    /// How each was started: its node, files, and clock offset (restart).
    spawns: Vec<Spawn>,
    /// `--observe-removals` and the agent targets and client files, for `Operator::start`.
    pub operator_args: Vec<String>,
    /// Each agent's node and health address (`ip:port`: `/healthz`, and the observer's own
    /// `/metrics`).
    pub health: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Drop for NodeAgents {
    /// Prints each agent's footprint (CPU seconds, peak resident size), then ends it.
    fn drop(&mut self) {
        for (node, c) in &mut self.children {
            println!("agent on {node}: {}", footprint(c.id()));
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `CPU s (user + system), VmHWM` of process `pid` from /proc.
fn footprint(pid: u32) -> String {
    let (cpu, hwm) = usage(pid);
    format!("{cpu:.2} CPU-s, {}", hwm.map_or("VmHWM unknown".to_string(), |k| format!("VmHWM: {k} kB")))
}

/// The CPU seconds (user + system of the process and of its waited-for children, such as an
/// agent's `iptables` reads; clock ticks of 100 Hz: the kernel's USER_HZ) and the peak resident
/// size (VmHWM, kB) of process `pid`, from /proc.
pub fn usage(pid: u32) -> (f64, Option<u64>) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // the fields after the parenthesised command: utime, stime, cutime and cstime are the 12th
    // to 15th
    let after: Vec<&str> = stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks: u64 = [11, 12, 13, 14].iter().filter_map(|i| after.get(*i)?.parse::<u64>().ok()).sum();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok());
    (ticks as f64 / 100.0, hwm)
}

fn write(dir: &Path, name: &str, content: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p.display().to_string()
}

impl NodeAgents {
    /// Each agent's (node, CPU seconds so far, VmHWM kB): [`usage`].
    pub fn usage(&self) -> Vec<(String, f64, Option<u64>)> {
        self.children
            .iter()
            .map(|(n, c)| {
                let (cpu, hwm) = usage(c.id());
                (n.clone(), cpu, hwm)
            })
            .collect()
    }

    /// Starts an agent on every real node, each logging to `$ST_E2E_DIR/logs/agent-<node>.log`,
    /// and waits until each answers its health port.
    pub async fn start() -> NodeAgents {
        Self::start_with_clocks(&[]).await
    }

    /// [`NodeAgents::start`], the agents of the nodes named in `clock_offsets` seeing a wall
    /// clock that many seconds off (libfaketime: [`LIBFAKETIME`]; the monotonic clock is left
    /// alone).
    pub async fn start_with_clocks(clock_offsets: &[(&str, i64)]) -> NodeAgents {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let names = certs::subject_alt_names("safe-termination", "e2e", &[]);
        let data = certs::renewed(&Default::default(), &Action::RenewCa("e2e".into()), &names, certs::unix_now(), certs::CA_VALIDITY, certs::SERVING_VALIDITY)
            .unwrap();
        let (ca, cert, key) =
            (write(dir.path(), "ca.crt", &data[CA_CERT]), write(dir.path(), "agent.crt", &data[AGENT_CERT]), write(dir.path(), "agent.key", &data[AGENT_KEY]));
        let (client_cert, client_key) = (write(dir.path(), "client.crt", &data[CLIENT_CERT]), write(dir.path(), "client.key", &data[CLIENT_KEY]));
        let k8s = k8s_dir();
        let nodes = real_nodes();
        // the node addresses exist only inside the cluster's namespaces: never send to them
        // without (with the cluster down they would leave the machine)
        for n in &nodes {
            assert!(
                Path::new(&format!("/run/netns/{}", n.netns)).exists(),
                "{}'s network namespace /run/netns/{} is missing: run make cluster-up",
                n.name,
                n.netns
            );
        }
        let mut children = Vec::new();
        let mut spawns = Vec::new();
        for n in &nodes {
            let offset = clock_offsets.iter().find(|(name, _)| *name == n.name).map(|(_, s)| *s);
            let s = Spawn { node: n.clone(), ca: ca.clone(), cert: cert.clone(), key: key.clone(), k8s: k8s.clone(), clock_offset_seconds: offset };
            children.push((n.name.clone(), s.spawn(false)));
            spawns.push(s);
        }
        let targets: Vec<String> = nodes.iter().map(|n| format!("{}=https://{}:{PORT}", n.name, n.ip)).collect();
        let operator_args = vec![
            "--observe-removals".to_string(),
            "--agent-target".into(),
            targets.join(","),
            "--agent-ca-file".into(),
            ca,
            "--agent-client-cert-file".into(),
            client_cert,
            "--agent-client-key-file".into(),
            client_key,
        ];
        let health = nodes.iter().map(|n| (n.name.clone(), format!("{}:{HEALTH_PORT}", n.ip))).collect();
        let agents = NodeAgents { children, spawns, operator_args, health, _dir: dir };
        for n in &nodes {
            wait_healthy(n).await;
        }
        agents
    }

    /// Kills `node`'s agent (by its PID: this test's child) and starts it again as before; waits
    /// until the new one answers its health port. Returns how long it was down, seconds.
    pub async fn restart(&mut self, node: &str) -> f64 {
        let i = self.children.iter().position(|(n, _)| n == node).unwrap_or_else(|| panic!("no agent on {node}"));
        let down = std::time::Instant::now();
        let _ = self.children[i].1.kill();
        let _ = self.children[i].1.wait();
        self.children[i].1 = self.spawns[i].spawn(true);
        wait_healthy(&self.spawns[i].node).await;
        down.elapsed().as_secs_f64()
    }
}

async fn wait_healthy(n: &RealNode) {
    let url = format!("http://{}:{HEALTH_PORT}/healthz", n.ip);
    super::wait_for(&format!("the agent on {} healthy at {url}", n.name), 30, async || {
        reqwest::get(&url).await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
}

/// libfaketime's multi-threaded library, as e2e/toolchain/libfaketime.sh unpacks it from
/// Debian's package into the cache.
pub const LIBFAKETIME: &str = "safe-termination/tools/libfaketime-0.9.10/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The path of [`LIBFAKETIME`] under the cache; panics naming the script when it is missing.
fn libfaketime() -> String {
    let cache = std::env::var("XDG_CACHE_HOME").unwrap_or_else(|_| format!("{}/.cache", std::env::var("HOME").unwrap_or_default()));
    let path = format!("{cache}/{LIBFAKETIME}");
    assert!(Path::new(&path).is_file(), "{path} is missing: run e2e/toolchain/libfaketime.sh (make e2e runs it)");
    path
}

/// How one agent is started.
struct Spawn {
    node: RealNode,
    ca: String,
    cert: String,
    key: String,
    k8s: String,
    clock_offset_seconds: Option<i64>,
}

impl Spawn {
    /// Starts the agent; its log is started afresh, or appended to after a restart.
    fn spawn(&self, append: bool) -> Child {
        let (n, k8s) = (&self.node, &self.k8s);
        let (ca, cert, key) = (&self.ca, &self.cert, &self.key);
        let log = format!("{}/logs/agent-{}.log", super::state_dir(), n.name);
        let _ = std::fs::create_dir_all(Path::new(&log).parent().unwrap());
        let log = std::fs::OpenOptions::new().create(true).write(true).append(append).truncate(!append).open(&log).unwrap();
        let mut c = Command::new("nsenter");
        if let Some(offset) = self.clock_offset_seconds {
            c.env("LD_PRELOAD", libfaketime()).env("FAKETIME", format!("{offset:+}s")).env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        c.arg(format!("--net=/run/netns/{}", n.netns))
            .arg(env!("CARGO_BIN_EXE_safe-termination"))
            .args(["agent", "--listen", &format!("{}:{PORT}", n.ip), "--health-listen", &format!("{}:{HEALTH_PORT}", n.ip)])
            .args(["--kube-proxy-url", &format!("http://{}:10249", n.ip)])
            .args(["--tls-ca-file", ca, "--tls-cert-file", cert, "--tls-key-file", key])
            // the data plane from kube-proxy's /proxyMode and the iptables backend holding its chains
            .args(["--data-plane", "auto", "--node-name", &n.name])
            // a Cilium node's maps (no kube-proxy answers there: auto reads Cilium's when pinned)
            .args(n.bpf_root.iter().flat_map(|b| ["--cilium-bpf-root".to_string(), b.clone()]))
            .args(["--iptables-nft-binary", &format!("{k8s}/xtables-nft/iptables"), "--iptables-legacy-binary", &format!("{k8s}/xtables-legacy/iptables")])
            .env("RUST_LOG", "info,safe_termination=debug")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("nsenter into {}: {e}", n.netns))
    }
}
