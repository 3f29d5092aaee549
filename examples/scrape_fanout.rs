//! Scrape fan-out benchmark (results in docs/benchmarks/scrape.md "Scrape fan-out"):
//! one full cycle of the kube-proxy source over N simulated kube-proxies on loopback, each
//! serving a real ~75 KB scrape: `scrape::scrape_all` (GET `/metrics` and `/proxyMode`, parse)
//! plus recording into the `MeasurementStore` (and `retain_nodes`). Targets: within 5 s wall
//! and under 1 CPU-second for 1,000 endpoints.
//!
//! The servers run in a separate process (`examples/fake_kube_proxies.rs`, found next to this
//! binary), so `getrusage(RUSAGE_SELF)` of this process is the client's CPU time only: user +
//! system over all threads, sampled before and after each cycle.
//!
//! ```text
//! cargo build --release --example fake_kube_proxies --example scrape_fanout --example fake_agents
//! target/release/examples/scrape_fanout [--count 1000] [--in-flight 64] [--timeout-ms 5000] [--cycles 5] [--size-kb 75] [--mode direct|both] [--proxy-mode 1|0]
//!     [--format text|protobuf] [--capture v1.29|v1.37] [--cpu-target 1.0]
//! ```
//!
//! `--format` and `--capture` go to the fake kube-proxies (see `examples/fake_kube_proxies.rs`):
//! the padded v1.29 text scrape by default; `--format text --capture v1.37` the real v1.37.2
//! text scrape (105 KB), `--format protobuf` the same scrape in the protobuf exposition (67 KB,
//! native histograms) to the operator's protobuf-first `Accept`. `bench/scrape-formats.sh` runs
//! them alternately. `--cpu-target`: the worst cycle's CPU-s the PASS line allows (1 CPU-s
//! at 1,000 nodes by default; the target at 5,000 is 2.5 CPU-s: BENCHMARKS.md).
//!
//! Every cycle opens every connection, as the operator does: its scrape client keeps no idle
//! connection between cycles (`sources::fetch::http_client`). Cycle 1 is "cold"
//! (the first parse, caches and pages), later ones "warm".
//!
//! `--mode both`: the same fake kube-proxies, also fronted by one real node agent each
//! (`examples/fake_agents.rs`, a third process: the real `agent` code path with mutual TLS from
//! a CA made by the operator's certificate code), and cycles alternate between the two ways the
//! operator reads a node, each a real `ScrapeLoop::run_cycle` (no `/configz` refresh):
//! - **direct**: `--source auto` where kube-proxy answers on the node's address: one plain HTTP
//!   scrape per node;
//! - **via agent**: `--source auto` where kube-proxy is on the node's loopback: the direct
//!   scrape is refused (closed ports on 127.0.0.1), then `Fallbacks::apply` scrapes each node's
//!   agent over mutual TLS (`--agent-target`s), which reads its kube-proxy.
//!
//! Besides the operator's CPU (this process), the CPU of the agents' and the kube-proxies'
//! processes per cycle is read from /proc/PID/stat. `--mode direct` (the default) is the
//! original benchmark, unchanged.

use safe_termination::certs;
use safe_termination::core::analysis::{AnalysisOptions, analyze};
use safe_termination::core::crd::TerminationPolicySpec;
use safe_termination::core::measure::MeasurementStore;
use safe_termination::sources::agent_client::{AgentClientFiles, AgentSource, AgentTargets};
use safe_termination::sources::fetch::http_client;
use safe_termination::sources::scrape::{ScrapeOptions, record_outcomes, scrape_all};
use safe_termination::sources::scrape_loop::{Fallbacks, ScrapeLoop};
use safe_termination::sources::targets::{Target, TargetSource, parse_static_targets};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// The operator binary's allocator (src/main.rs: mimalloc, or glibc's with `--features
/// system-allocator`), so that the client CPU measured here is what the shipped operator spends.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::arg;

/// User + system CPU seconds of this process (all threads).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a zeroed local struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur
    }
}

/// User + system CPU seconds of process `pid` so far (/proc/PID/stat, clock ticks of 1/100 s).
fn process_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // fields after the command name (which may hold spaces) closed by ')'
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz.max(1.0)
}

/// One cycle of one way: wall, operator CPU, agents CPU, kube-proxies CPU (seconds), failed nodes.
type CycleRow = (f64, f64, f64, f64, usize);

/// Median of `v` (sorted copy; 0 when empty).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// `--mode both`: alternating direct and via-agent cycles of the operator's `ScrapeLoop` over
/// the same `targets` (see the module docs). Exits like `main`.
fn both(targets: Vec<Target>, kube_proxies_pid: u32, cycles: u64, opts: ScrapeOptions) -> bool {
    let count = targets.len();
    // the operator's certificate Secret, as its leader makes it
    let _ = rustls::crypto::ring::default_provider().install_default();
    let names = certs::subject_alt_names("safe-termination", "safe-termination", &[]);
    let data = certs::renewed(
        &Default::default(),
        &certs::Action::RenewCa("benchmark".into()),
        &names,
        certs::unix_now(),
        certs::CA_VALIDITY,
        certs::SERVING_VALIDITY,
    )
    .expect("certificates");
    let dir = tempfile::tempdir().expect("tempdir");
    for (file, key) in [
        ("ca.crt", certs::CA_CERT),
        ("agent.crt", certs::AGENT_CERT),
        ("agent.key", certs::AGENT_KEY),
        ("client.crt", certs::CLIENT_CERT),
        ("client.key", certs::CLIENT_KEY),
    ] {
        std::fs::write(dir.path().join(file), &data[key]).unwrap();
    }
    let list = dir.path().join("kube-proxies.txt");
    std::fs::write(&list, targets.iter().map(|t| format!("{}={}\n", t.node, t.base_url)).collect::<String>()).unwrap();
    let exe = std::env::current_exe().unwrap().with_file_name("fake_agents");
    let mut agents_child = Command::new(&exe)
        .arg("--targets")
        .arg(&list)
        .arg("--cert-dir")
        .arg(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {} (cargo build --release --example fake_agents): {e}", exe.display()));
    let mut agent_specs = Vec::new();
    for line in BufReader::new(agents_child.stdout.take().unwrap()).lines() {
        let line = line.expect("read fake_agents output");
        if line == "READY" {
            break;
        }
        agent_specs.push(line);
    }
    let agent_targets = parse_static_targets(&agent_specs).expect("agent targets");
    assert_eq!(agent_targets.len(), count, "fake_agents started {} agents", agent_targets.len());
    // kube-proxy on each node's loopback: the operator's direct scrape of the node is refused
    let closed: Vec<Target> = {
        let held: Vec<std::net::TcpListener> = (0..count).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        targets.iter().zip(&held).map(|(t, l)| Target::new(t.node.clone(), &format!("http://{}", l.local_addr().unwrap()))).collect()
    };
    let agents_pid = agents_child.id();
    println!(
        "via agent: {count} real agents (pid {agents_pid}, one Tokio runtime, 2 worker threads), mutual TLS; direct scrapes of those nodes refused on 127.0.0.1"
    );

    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let client_files = AgentClientFiles { ca: dir.path().join("ca.crt"), cert: dir.path().join("client.crt"), key: dir.path().join("client.key") };
    let (tx, _rx) = tokio::sync::watch::channel(0u64);
    let mut direct = ScrapeLoop::new(TargetSource::Static(targets.clone()), Arc::new(Mutex::new(MeasurementStore::new(600.0))), tx.clone())
        .with_options(opts.clone())
        .with_config_refresh(0);
    let fallbacks = Fallbacks { agents: Some(AgentSource::new(AgentTargets::Static(agent_targets), client_files, opts.timeout)), prometheus: None };
    let mut via_agent = ScrapeLoop::new(TargetSource::Static(closed), Arc::new(Mutex::new(MeasurementStore::new(600.0))), tx)
        .with_options(opts.clone())
        .with_config_refresh(0)
        .with_fallbacks(fallbacks);
    // per way (direct, via agent), one row per cycle
    let mut rows: [Vec<CycleRow>; 2] = [Vec::new(), Vec::new()];
    rt.block_on(async {
        for cycle in 1..=cycles {
            for (way, scrape) in [(0usize, &mut direct), (1, &mut via_agent)] {
                let (cpu0, agents0, kp0) = (cpu_seconds(), process_cpu_seconds(agents_pid), process_cpu_seconds(kube_proxies_pid));
                let t0 = Instant::now();
                let summary = scrape.run_cycle().await;
                let wall = t0.elapsed().as_secs_f64();
                let (cpu, agents, kp) = (cpu_seconds() - cpu0, process_cpu_seconds(agents_pid) - agents0, process_cpu_seconds(kube_proxies_pid) - kp0);
                println!(
                    "cycle {cycle} {:9}: wall {wall:.3} s, operator CPU {cpu:.3} s, agents CPU {agents:.2} s, kube-proxies CPU {kp:.2} s, scraped {}, failed {}",
                    ["direct", "via agent"][way],
                    summary.scraped,
                    summary.failed
                );
                rows[way].push((wall, cpu, agents, kp, summary.failed));
            }
        }
    });
    println!(
        "| way | cold wall | cold operator CPU | warm wall (median) | warm operator CPU (median) | agents CPU per cycle (median) | per agent scrape | kube-proxies CPU per cycle (median) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (way, r) in rows.iter().enumerate() {
        let warm = &r[1.min(r.len() - 1)..];
        let col = |i: usize| warm.iter().map(|x| [x.0, x.1, x.2, x.3][i]).collect::<Vec<f64>>();
        let agents = median(&col(2));
        println!(
            "| {} | {:.3} s | {:.3} s | {:.3} s | {:.3} s | {:.2} s | {} | {:.2} s |",
            ["direct", "via agent"][way],
            r[0].0,
            r[0].1,
            median(&col(0)),
            median(&col(1)),
            agents,
            if way == 1 { format!("{:.2} ms", agents * 1000.0 / count as f64) } else { "-".into() },
            median(&col(3)),
        );
    }
    drop(agents_child.stdin.take());
    let _ = agents_child.kill();
    let _ = agents_child.wait();
    rows.iter().flatten().all(|r| r.4 == 0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = arg(&args, "--mode", String::from("direct"));
    assert!(mode == "direct" || mode == "both", "--mode direct or both, not {mode:?}");
    let count = arg(&args, "--count", 1000u64);
    let in_flight = arg(&args, "--in-flight", 64usize);
    let timeout = Duration::from_millis(arg(&args, "--timeout-ms", 5000u64));
    let cycles = arg(&args, "--cycles", 5u64).max(1);
    let size_kb = arg(&args, "--size-kb", 75u64);
    let format = arg(&args, "--format", String::from("text"));
    let capture = arg(&args, "--capture", String::from(if format == "protobuf" { "v1.37" } else { "v1.29" }));
    let cpu_target = arg(&args, "--cpu-target", 1.0f64);
    let nofile = raise_nofile();

    let servers = std::env::current_exe().unwrap().with_file_name("fake_kube_proxies");
    if !servers.exists() {
        eprintln!("{} not found: build it first (cargo build --release --example fake_kube_proxies --example scrape_fanout)", servers.display());
        std::process::exit(2);
    }
    let mut child = Command::new(&servers)
        .args(["--count", &count.to_string(), "--size-kb", &size_kb.to_string(), "--format", &format, "--capture", &capture])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start fake_kube_proxies");
    let mut body_bytes = 0usize;
    let mut body_format = String::new();
    let mut specs = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.expect("read fake_kube_proxies output");
        if line == "READY" {
            break;
        } else if let Some(n) = line.strip_prefix("BODY_BYTES=") {
            body_bytes = n.parse().unwrap();
        } else if let Some(f) = line.strip_prefix("BODY_FORMAT=") {
            body_format = f.to_string();
        } else {
            specs.push(line);
        }
    }
    let targets: Vec<Target> = parse_static_targets(&specs).expect("targets");
    assert_eq!(targets.len() as u64, count, "fake_kube_proxies started {} servers", targets.len());

    println!(
        "scrape fan-out: {count} kube-proxies on 127.0.0.1 (separate process, pid {}), body {body_format} {body_bytes} bytes ({:.1} KB), max in flight {in_flight}, per-target timeout {:?}, {} client worker threads, nofile {nofile}",
        child.id(),
        body_bytes as f64 / 1024.0,
        timeout,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    // --proxy-mode 0: no /proxyMode request (to see what the second request, and through an
    // agent its second TLS handshake, costs)
    let fetch_proxy_mode = arg(&args, "--proxy-mode", 1u8) != 0;
    let opts = ScrapeOptions { timeout, max_in_flight: in_flight, fetch_proxy_mode, ..ScrapeOptions::default() };
    if mode == "both" {
        let ok = both(targets, child.id(), cycles, opts);
        drop(child.stdin.take());
        let _ = child.kill();
        let _ = child.wait();
        println!("{}", if ok { "PASS (no failed node)" } else { "FAIL (failed nodes)" });
        std::process::exit(if ok { 0 } else { 1 });
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let store = Arc::new(Mutex::new(MeasurementStore::new(600.0)));
    let present: Vec<String> = targets.iter().map(|t| t.node.clone()).collect();
    let mut rows = Vec::new();
    rt.block_on(async {
        let client = http_client(timeout);
        let kube_proxies_pid = child.id();
        for cycle in 1..=cycles {
            let (cpu0, kp0) = (cpu_seconds(), process_cpu_seconds(kube_proxies_pid));
            let t0 = Instant::now();
            let outcomes = scrape_all(&client, &targets, &opts).await;
            let scrape_wall = t0.elapsed();
            let recorded = {
                let mut s = store.lock().unwrap();
                let n = record_outcomes(&mut s, outcomes);
                s.retain_nodes(&present);
                n
            };
            let wall = t0.elapsed();
            let cpu = cpu_seconds() - cpu0;
            let kp = process_cpu_seconds(kube_proxies_pid) - kp0;
            println!(
                "cycle {cycle} ({}): wall {:.3} s (scrape {:.3} s), client CPU {:.3} s, kube-proxies CPU {kp:.2} s, scraped {}, failed {}",
                if cycle == 1 { "cold, new connections" } else { "warm, new connections" },
                wall.as_secs_f64(),
                scrape_wall.as_secs_f64(),
                cpu,
                recorded.scraped,
                recorded.failed
            );
            if recorded.failed > 0 {
                let s = store.lock().unwrap();
                for (node, f) in s.failures().iter().take(3) {
                    println!("  {node}: {} {}", f.reason, f.message);
                }
            }
            rows.push((wall.as_secs_f64(), cpu, recorded.failed));
        }
    });

    // sanity: the analysis over the recorded window (not part of the cycle)
    let t0 = Instant::now();
    let inputs = store.lock().unwrap().inputs();
    // which reader ran: only the protobuf exposition carries native histograms
    let native = inputs.iter().filter(|i| i.later.sync_native.is_some()).count();
    println!("nodes whose newest scrape has a native sync histogram (protobuf read): {native} of {}", inputs.len());
    let opts = AnalysisOptions { min_sync_period_seconds: 1.0, min_sync_period_source: "benchmark".into(), ..AnalysisOptions::default() };
    let report = analyze(&inputs, &opts, &TerminationPolicySpec::default());
    println!(
        "analysis of {} nodes ({} interval): {:.3} s, worst node {:?}, window {:?} s",
        report.nodes.len(),
        report.interval,
        t0.elapsed().as_secs_f64(),
        report.worst_node,
        report.propagation_window_seconds
    );

    let warm: Vec<&(f64, f64, usize)> = rows.iter().skip(1).collect();
    let (cold_wall, cold_cpu, _) = rows[0];
    let max_wall = rows.iter().map(|r| r.0).fold(0.0, f64::max);
    let max_cpu = rows.iter().map(|r| r.1).fold(0.0, f64::max);
    if !warm.is_empty() {
        let mut w: Vec<f64> = warm.iter().map(|r| r.0).collect();
        let mut c: Vec<f64> = warm.iter().map(|r| r.1).collect();
        w.sort_by(f64::total_cmp);
        c.sort_by(f64::total_cmp);
        println!(
            "summary: cold wall {cold_wall:.3} s / CPU {cold_cpu:.3} s; warm median wall {:.3} s / CPU {:.3} s (n={}); worst wall {max_wall:.3} s (target < 5 s), worst CPU {max_cpu:.3} s (target < {cpu_target} s)",
            w[w.len() / 2],
            c[c.len() / 2],
            warm.len()
        );
    }
    let failed: usize = rows.iter().map(|r| r.2).sum();
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
    let ok = failed == 0 && max_wall < 5.0 && max_cpu < cpu_target;
    println!("{}", if ok { "PASS" } else { "FAIL" });
    std::process::exit(if ok { 0 } else { 1 });
}
