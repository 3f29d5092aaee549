//! Many real node agents on 127.0.0.1, each in front of one fake kube-proxy, for the scrape
//! fan-out benchmark's via-agent mode (`examples/scrape_fanout.rs --mode both`).
//!
//! Each agent is the real `safe-termination agent` code path (`cli::agent::serve`: the
//! mutual-TLS server with the client certificate check, the kube-proxy reader with its parser
//! check and filter, the health listener), a task on one shared Tokio runtime (two worker
//! threads, the machine's cores) rather than a process each: 1,000 processes of 15 MiB would
//! measure the machine's scheduler and memory more than the agent.
//!
//! ```text
//! fake_agents --targets FILE --cert-dir DIR
//! ```
//!
//! `FILE`: one `node-NNNN=http://127.0.0.1:<port>` line per kube-proxy (fake_kube_proxies'
//! output). `DIR`: `ca.crt`, `agent.crt`, `agent.key` (the agents' CA bundle and serving pair, as
//! the operator's Secret holds them). Output on stdout: one `node-NNNN=https://127.0.0.1:<port>`
//! line per agent (the operator's `--agent-target` syntax), then `READY`. It serves until its
//! standard input closes or it is killed.

use safe_termination::cli::agent::{AgentArgs, serve};
use safe_termination::shutdown::Shutdown;
use std::io::{BufRead, Write};
use std::path::PathBuf;

mod common;
use common::arg;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let targets = arg(&args, "--targets", PathBuf::new());
    let dir = arg(&args, "--cert-dir", PathBuf::new());
    let _ = rustls::crypto::ring::default_provider().install_default();
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
    let lines = std::fs::read_to_string(&targets).unwrap_or_else(|e| panic!("--targets {}: {e}", targets.display()));
    let kube_proxies: Vec<(String, String)> = lines.lines().filter_map(|l| l.split_once('=')).map(|(n, u)| (n.to_string(), u.to_string())).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let shutdown = Shutdown::new();
    let mut out = String::new();
    rt.block_on(async {
        for (node, url) in &kube_proxies {
            let args = AgentArgs {
                listen: "127.0.0.1:0".parse().unwrap(),
                health_listen: "127.0.0.1:0".parse().unwrap(),
                kube_proxy_url: url.clone(),
                tls_ca_file: dir.join("ca.crt"),
                tls_cert_file: dir.join("agent.crt"),
                tls_key_file: dir.join("agent.key"),
                cert_reload_interval_seconds: 5,
                kube_proxy_timeout_seconds: 4,
                max_body_bytes: safe_termination::sources::DEFAULT_MAX_BODY_BYTES,
                drain_seconds: 1,
                idle_timeout_seconds: 30,
                // these agents front fake kube-proxies: no data plane to observe
                data_plane: safe_termination::cli::agent::DataPlaneArg::None,
                nftables_reader: safe_termination::agent::observer::NftablesVia::Netlink,
                nft_binary: "nft".into(),
                iptables_nft_binary: "iptables-nft".into(),
                iptables_legacy_binary: "iptables-legacy".into(),
                cilium_bpf_root: "/sys/fs/bpf".into(),
                node_name: Some(node.clone()),
            };
            let listener = std::net::TcpListener::bind(args.listen).expect("bind an agent port");
            listener.set_nonblocking(true).unwrap();
            let health = tokio::net::TcpListener::bind(args.health_listen).await.expect("bind a health port");
            out.push_str(&format!("{node}=https://{}\n", listener.local_addr().unwrap()));
            let s = shutdown.clone();
            tokio::spawn(async move {
                if let Err(e) = serve(&args, listener, health, s).await {
                    eprintln!("agent: {e}");
                }
            });
        }
    });
    out.push_str("READY\n");
    std::io::stdout().write_all(out.as_bytes()).unwrap();
    std::io::stdout().flush().unwrap();
    // serve until stdin closes (the parent went away)
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        if line.is_err() {
            break;
        }
    }
    shutdown.trigger();
    drop(rt);
}
