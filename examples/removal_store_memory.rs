//! The operator's memory for observed removals at cluster scale, without a cluster: the
//! [`RemovalStore`] the observer fills, and the wire of one round (docs/benchmarks/observed-removals.md "Observed
//! removals").
//!
//! `--open` removals are opened, and every one of `--nodes` agents reports each of them, first
//! held, then removed (the store's peak: every open removal holds a report per node); then
//! they are closed, and opened, reported and closed again until `--closed` removals are in the
//! rolling window (the store keeps at most 20,000). Node names are 28 characters, as
//! `ip-10-0-123-45.ec2.internal`.
//!
//! ```text
//! cargo run --release --example removal_store_memory -- [--nodes 5000] [--open 100] [--closed 20000]
//! ```
//!
//! Prints the live heap (requested bytes, counted by this program's global allocator: mimalloc
//! as in the binary) at each step, and the JSON of one round: the request every agent gets
//! (every open removal) and one agent's answer (a record per removal).

use safe_termination::agent_contract::observer::{AnswerMark, ObserveRequest, ObserveResponse, WatchRecord, WatchRequest, WatchState};
use safe_termination::core::removals::{NodeReport, PendingRemoval, RemovalStore, ServicePort};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

mod common;
use common::arg;

#[global_allocator]
static GLOBAL: common::Counting = common::Counting;

fn mib(bytes: isize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn service() -> ServicePort {
    ServicePort {
        namespace: "shop-production".into(),
        name: "checkout-api".into(),
        port_name: "http".into(),
        protocol: "TCP".into(),
        cluster_ip: "10.96.123.45".parse().unwrap(),
        port: 80,
    }
}

/// The endpoint of removal `i` of batch `batch` (distinct across batches).
fn endpoint(batch: usize, i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + (batch * 100_000 + i) as u32))
}

/// Opens `open` removals, has every node report each held then removed, closes them: returns
/// the live bytes with every report in (the peak).
fn batch(store: &mut RemovalStore, nodes: &[String], open: usize, batch: usize, t: f64) -> isize {
    for i in 0..open {
        store.open(PendingRemoval {
            service: service(),
            endpoint: endpoint(batch, i),
            pod: format!("shop-production/checkout-api-7d9f8b6c5d-{i:05}"),
            deletion: t,
            sleep_seconds: Some(3),
            deadline: t + 60.0,
        });
    }
    for n in nodes {
        for i in 0..open {
            store.report(n, &service(), endpoint(batch, i), NodeReport::Held { last_with: Some(t + 0.2) });
        }
    }
    for n in nodes {
        for i in 0..open {
            store.report(n, &service(), endpoint(batch, i), NodeReport::Removed { last_with: Some(t + 0.9), first_without: t + 1.0 });
        }
    }
    let peak = common::live_bytes();
    let names: BTreeSet<String> = nodes.iter().cloned().collect();
    store.close(t + 1.1, &names);
    peak
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (n_nodes, open, closed) = (arg(&args, "--nodes", 5000usize), arg(&args, "--open", 100usize), arg(&args, "--closed", 20_000usize));
    let nodes: Vec<String> = (0..n_nodes).map(|i| format!("ip-10-0-{:03}-{:03}.ec2.internal", i / 256, i % 256)).collect();
    let base = common::live_bytes();
    let mut store = RemovalStore::default();
    let peak = batch(&mut store, &nodes, open, 0, 1_000_000.0);
    let after_one = common::live_bytes();
    let mut b = 1;
    while (b * open) < closed {
        batch(&mut store, &nodes, open, b, 1_000_000.0 + b as f64);
        b += 1;
    }
    let full = common::live_bytes();
    let summary = store.summary(1_000_000.0 + b as f64 + 2.0, 3600.0);
    println!("nodes {n_nodes}, open removals {open}, closed removals kept {}", summary.removals);
    println!("store with {open} open removals, each reported by every node: {:.1} MiB", mib(peak - base));
    println!("after closing them ({open} closed): {:.2} MiB", mib(after_one - base));
    println!(
        "with {} closed removals in the window: {:.2} MiB ({:.0} bytes each)",
        summary.removals,
        mib(full - base),
        (full - base) as f64 / summary.removals as f64
    );

    // one round's wire: the request to each agent, one agent's answer
    let request = ObserveRequest {
        watches: (0..open)
            .map(|i| WatchRequest { service: service(), endpoint: endpoint(0, i), remaining_seconds: 59.0, deletion_age_seconds: Some(1.0) })
            .collect(),
        set_id: Some(1_765_000_000_000_000_001),
        same_set: false,
    };
    let answer = ObserveResponse {
        protocol: safe_termination::agent_contract::observer::OBSERVER_PROTOCOL,
        agent_unix_seconds: 1_000_000.5,
        data_plane: Some("nftables".into()),
        records: (0..open)
            .map(|i| WatchRecord {
                service: service(),
                endpoint: endpoint(0, i),
                state: WatchState::Removed,
                last_with_unix_seconds: Some(1_000_000.9),
                first_without_unix_seconds: Some(1_000_001.0),
                reads: 20,
                failed_reads: 0,
                last_error: None,
            })
            .collect(),
        set_id: request.set_id,
        mark: Some(AnswerMark { epoch: 1_765_000_000_000_000_001, generation: 400 }),
        complete: true,
    };
    let (req, ans) = (serde_json::to_vec(&request).unwrap().len(), serde_json::to_vec(&answer).unwrap().len());
    let rate = |bytes: usize| (bytes * n_nodes * 4) as f64 / 1e6;
    println!(
        "a round with the whole set and every record: request {req} bytes to each agent, answer {ans} bytes from each; every 250 ms to {n_nodes} agents: {:.1} MB/s out, {:.1} MB/s in",
        rate(req),
        rate(ans)
    );
    // protocol 3 once every agent holds the set: the set's id, and only the changed records
    let same = ObserveRequest { watches: vec![], set_id: request.set_id, same_set: true };
    let quiet = ObserveResponse { records: vec![], complete: false, ..answer.clone() };
    let one = ObserveResponse { records: answer.records[..1].to_vec(), complete: false, ..answer.clone() };
    let (same, quiet, one) = (serde_json::to_vec(&same).unwrap().len(), serde_json::to_vec(&quiet).unwrap().len(), serde_json::to_vec(&one).unwrap().len());
    println!(
        "a round of protocol 3 with the set held: request {same} bytes, answer {quiet} bytes with no change ({one} with one); {:.2} MB/s out, {:.2} MB/s in ({:.2} with one change per agent per round)",
        rate(same),
        rate(quiet),
        rate(one)
    );
}
