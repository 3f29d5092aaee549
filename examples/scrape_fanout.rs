//! Scrape fan-out benchmark (issue 4, Performance; results in BENCHMARKS.md "Scrape fan-out"):
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
//! cargo build --release --example fake_kube_proxies --example scrape_fanout
//! target/release/examples/scrape_fanout [--count 1000] [--in-flight 64] [--timeout-ms 5000] [--cycles 5] [--size-kb 75]
//! ```
//!
//! Every cycle opens every connection, as the operator does: its scrape client keeps no idle
//! connection between cycles (`sources::fetch::http_client`, issue 16). Cycle 1 is "cold"
//! (the first parse, caches and pages), later ones "warm".

use safe_termination::analysis::{AnalysisOptions, analyze};
use safe_termination::crd::TerminationPolicySpec;
use safe_termination::measure::MeasurementStore;
use safe_termination::sources::scrape::{ScrapeOptions, Target, parse_static_targets, record_outcomes, scrape_all};
use safe_termination::sources::fetch::http_client;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let count = arg(&args, "--count", 1000u64);
    let in_flight = arg(&args, "--in-flight", 64usize);
    let timeout = Duration::from_millis(arg(&args, "--timeout-ms", 5000u64));
    let cycles = arg(&args, "--cycles", 5u64).max(1);
    let size_kb = arg(&args, "--size-kb", 75u64);
    let nofile = raise_nofile();

    let servers = std::env::current_exe().unwrap().with_file_name("fake_kube_proxies");
    if !servers.exists() {
        eprintln!(
            "{} not found: build it first (cargo build --release --example fake_kube_proxies --example scrape_fanout)",
            servers.display()
        );
        std::process::exit(2);
    }
    let mut child = Command::new(&servers)
        .args(["--count", &count.to_string(), "--size-kb", &size_kb.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start fake_kube_proxies");
    let mut body_bytes = 0usize;
    let mut specs = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.expect("read fake_kube_proxies output");
        if line == "READY" {
            break;
        } else if let Some(n) = line.strip_prefix("BODY_BYTES=") {
            body_bytes = n.parse().unwrap();
        } else {
            specs.push(line);
        }
    }
    let targets: Vec<Target> = parse_static_targets(&specs).expect("targets");
    assert_eq!(targets.len() as u64, count, "fake_kube_proxies started {} servers", targets.len());

    println!(
        "scrape fan-out: {count} kube-proxies on 127.0.0.1 (separate process, pid {}), body {body_bytes} bytes ({:.1} KB), max in flight {in_flight}, per-target timeout {:?}, {} client worker threads, nofile {nofile}",
        child.id(),
        body_bytes as f64 / 1024.0,
        timeout,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let opts = ScrapeOptions { timeout, max_in_flight: in_flight, ..ScrapeOptions::default() };
    let store = Arc::new(Mutex::new(MeasurementStore::new(600.0)));
    let present: Vec<String> = targets.iter().map(|t| t.node.clone()).collect();
    let mut rows = Vec::new();
    rt.block_on(async {
        let client = http_client(timeout);
        for cycle in 1..=cycles {
            let cpu0 = cpu_seconds();
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
            println!(
                "cycle {cycle} ({}): wall {:.3} s (scrape {:.3} s), client CPU {:.3} s, scraped {}, failed {}",
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
            "summary: cold wall {cold_wall:.3} s / CPU {cold_cpu:.3} s; warm median wall {:.3} s / CPU {:.3} s (n={}); worst wall {max_wall:.3} s (target < 5 s), worst CPU {max_cpu:.3} s (target < 1 s)",
            w[w.len() / 2],
            c[c.len() / 2],
            warm.len()
        );
    }
    let failed: usize = rows.iter().map(|r| r.2).sum();
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
    let ok = failed == 0 && max_wall < 5.0 && max_cpu < 1.0;
    println!("{}", if ok { "PASS" } else { "FAIL" });
    std::process::exit(if ok { 0 } else { 1 });
}
