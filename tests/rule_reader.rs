//! The ground truth's rule reader (tests/common/rules.rs) against fake `nft`, `iptables` and
//! `iptables-save` programs (shell scripts in a temporary directory, found through the reader's
//! injectable command prefix `env PATH=<dir>:…`): a read that fails (cannot start, non-zero exit,
//! the chain gone, garbage output) is no sample and records no removal; a successful read
//! without an IP is a removal, bounded by the last successful read that still showed it. Also
//! `nft monitor`: a monitor that dies or prints a line that does not parse records no removal.
//! No cluster needed: runs in plain `cargo test`.

mod common;

use common::rules::{RealNode, RuleReader, RuleTrace, follow_nft_monitor, nft_map_ips, now_unix, parse_iptables_chain, parse_sep_ip};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const NS: &str = "exp-b";
const CHAIN: &str = "service-ABCDEFGH-exp-b/web/tcp/http";

/// `nft`: `list chains` prints chains.out; `list chain …` prints chain.out and exits with
/// chain.rc (stderr chain.err), then chain.next (when there) becomes chain.out for the next
/// listing; `monitor rules` prints monitor.out, then either waits to be killed (monitor.hang
/// exists) or dies with status 1.
const FAKE_NFT: &str = r#"#!/bin/sh
D=$(dirname "$0")
case "$1 $2" in
  "list chains") cat "$D/chains.out"; exit 0 ;;
  "list chain") cat "$D/chain.out"; cat "$D/chain.err" >&2 2>/dev/null; rc=$(cat "$D/chain.rc")
    [ -f "$D/chain.next" ] && mv "$D/chain.next" "$D/chain.out"; exit "$rc" ;;
  "monitor rules") cat "$D/monitor.out"; [ -f "$D/monitor.hang" ] && exec sleep 30; exit 1 ;;
esac
exit 2
"#;

/// `iptables -t nat -S CHAIN`: prints CHAIN.out, exits with CHAIN.rc (0 when absent).
const FAKE_IPTABLES: &str = r#"#!/bin/sh
D=$(dirname "$0")
[ -f "$D/$4.out" ] && cat "$D/$4.out"
[ -f "$D/$4.rc" ] && exit "$(cat "$D/$4.rc")"
exit 0
"#;

/// `iptables-save -t nat`: prints save.out.
const FAKE_IPTABLES_SAVE: &str = r#"#!/bin/sh
cat "$(dirname "$0")/save.out"
"#;

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

fn script(dir: &Path, name: &str, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    write(dir, name, text);
    std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn node(mode: &str) -> RealNode {
    RealNode { name: "node-t".into(), netns: "unused".into(), mode: mode.into(), ip: "127.0.0.1".into(), bpf_root: None, cgroup2: None }
}

/// A reader whose commands find the fake programs of `dir` first on PATH.
fn reader(dir: &Path, mode: &str) -> RuleReader {
    let path = format!("PATH={}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    RuleReader::with_command(node(mode), NS, vec!["env".into(), path], &dir.display().to_string())
}

fn nft_listing(ips: &[&str]) -> String {
    let map: Vec<String> = ips.iter().enumerate().map(|(i, ip)| format!("{i} : {ip} . 8080")).collect();
    format!(
        "table ip kube-proxy {{\n\tchain {CHAIN} {{\n\t\tip daddr 10.96.0.20 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade\n\t\tmeta l4proto tcp dnat ip to numgen random mod {} map {{ {} }}\n\t}}\n}}\n",
        ips.len(),
        map.join(", ")
    )
}

fn monitor_line(chain: &str, entries: &[&str]) -> String {
    let map: Vec<String> = entries.iter().enumerate().map(|(i, ip)| format!("{i} : {ip} . 8080")).collect();
    format!("add rule ip kube-proxy {chain} meta l4proto tcp dnat ip to numgen random mod {} map {{ {} }}\n", entries.len(), map.join(", "))
}

fn set(ips: &[&str]) -> BTreeSet<String> {
    ips.iter().map(|s| s.to_string()).collect()
}

/// One read observed into `trace`, returned for its error.
fn read_into(r: &mut RuleReader, trace: &mut RuleTrace) -> Result<BTreeSet<String>, String> {
    let started = now_unix();
    let read = r.endpoint_ips();
    trace.observe(read.clone(), started, now_unix());
    read.map_err(|e| e.to_string())
}

fn nft_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    script(dir.path(), "nft", FAKE_NFT);
    write(dir.path(), "chains.out", &format!("table ip kube-proxy {{\n\tchain services {{\n\t}}\n\tchain {CHAIN} {{\n\t}}\n}}\n"));
    write(dir.path(), "chain.out", &nft_listing(&["10.244.1.10", "10.244.2.3"]));
    write(dir.path(), "chain.rc", "0");
    dir
}

/// Follows the fake nft's monitor in `d` for `how_long`, then stops it.
fn follow_monitor_for(d: &Path, how_long: Duration) -> RuleTrace {
    let stop = AtomicBool::new(false);
    let mut r = reader(d, "nftables");
    std::thread::scope(|s| {
        let t = s.spawn(|| follow_nft_monitor(&mut r, &stop));
        std::thread::sleep(how_long);
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap()
    })
}

#[test]
fn nftables_failed_reads_record_no_removal_and_a_successful_read_without_the_ip_does() {
    let dir = nft_dir();
    let d = dir.path();
    let mut r = reader(d, "nftables");
    let mut trace = RuleTrace::default();
    let first_start = now_unix();
    assert_eq!(read_into(&mut r, &mut trace).unwrap(), set(&["10.244.1.10", "10.244.2.3"]));
    assert_eq!(r.chain.as_deref(), Some(CHAIN));

    // the chain vanished (after it existed): nft exits 1
    write(d, "chain.rc", "1");
    write(d, "chain.err", "Error: No such file or directory");
    let e = read_into(&mut r, &mut trace).unwrap_err();
    assert!(e.contains(&format!("nft list chain ip kube-proxy {CHAIN}")), "names the command: {e}");
    assert!(e.contains("exit status: 1") && e.contains("No such file or directory"), "says how: {e}");
    std::fs::remove_file(d.join("chain.err")).unwrap();
    write(d, "chain.rc", "0");
    // exit 0 but nothing printed; a listing cut short; a map entry that is no IP
    write(d, "chain.out", "");
    assert!(read_into(&mut r, &mut trace).unwrap_err().contains("unparsable output"));
    write(d, "chain.out", &nft_listing(&["10.244.1.10"])[..60]);
    assert!(read_into(&mut r, &mut trace).unwrap_err().contains("unparsable output"));
    write(d, "chain.out", &nft_listing(&["10.244.1.10", "garbage"]));
    assert!(read_into(&mut r, &mut trace).unwrap_err().contains("\"garbage\" is not an IP address"));
    assert_eq!((trace.reads, trace.failed_reads), (1, 4));
    assert!(trace.transitions.is_empty(), "a failed read is no sample: {:?}", trace.transitions);
    assert!(trace.removal("10.244.2.3", 0.0).is_none());
    assert_eq!(trace.present(), Some(&set(&["10.244.1.10", "10.244.2.3"])), "still what the last successful read showed");

    // a successful read without 10.244.2.3: its removal, after the first read, by this one
    write(d, "chain.out", &nft_listing(&["10.244.1.10"]));
    let before = now_unix();
    assert_eq!(read_into(&mut r, &mut trace).unwrap(), set(&["10.244.1.10"]));
    let after = now_unix();
    let removal = trace.removal("10.244.2.3", 0.0).expect("a removal").clone();
    assert!(removal.after >= first_start && removal.after < before, "lower bound: the last read that showed it: {removal:?}");
    assert!(removal.by >= before && removal.by <= after, "upper bound: the first read without it: {removal:?}");
    assert_eq!(trace.transitions.len(), 1);
    assert!(trace.removal("10.244.1.10", 0.0).is_none());
    assert!(trace.removal("10.244.2.3", removal.by + 1.0).is_none(), "not before the deletion");
    assert_eq!((trace.reads, trace.failed_reads), (2, 4));
}

#[test]
fn an_endpoint_that_left_the_rules_before_its_deletion_is_absent_since_its_removal() {
    // reads at 10 s (both IPs), 11 s (10.244.2.3 gone: not ready), 12 s (back), 13 s (gone
    // again), 20 s (10.244.1.10 gone too); each read takes 0.1 s
    let mut trace = RuleTrace::default();
    for (t, ips) in
        [(10.0, &["10.244.1.10", "10.244.2.3"][..]), (11.0, &["10.244.1.10"]), (12.0, &["10.244.1.10", "10.244.2.3"]), (13.0, &["10.244.1.10"]), (20.0, &[])]
    {
        trace.observe(Ok(set(ips)), t, t + 0.1);
    }
    // gone at 13.1 s and still gone at a deletion at 15 s: that removal, bounded by the read before
    let r = trace.absent_since("10.244.2.3", 12.5, 15.0).expect("absent since its second removal");
    assert_eq!((r.after, r.by), (12.0, 13.1));
    // its first removal (11.1 s) was undone by 12.1 s: not the one that left it absent
    assert!(trace.absent_since("10.244.2.3", 10.0, 12.5).is_none(), "back in the rules at 12.1 s");
    // gone before `since`: not this removal
    assert!(trace.absent_since("10.244.2.3", 14.0, 15.0).is_none());
    // still in the rules at `until`
    assert!(trace.absent_since("10.244.1.10", 10.0, 15.0).is_none());
    // removal() only looks at or after its bound: nothing of 10.244.2.3 after 13.1 s
    assert!(trace.removal("10.244.2.3", 14.5).is_none());
    assert_eq!(trace.removal("10.244.1.10", 14.5).map(|t| t.by), Some(20.1));
}

#[test]
fn a_command_that_cannot_start_or_finds_no_chain_is_no_sample() {
    let mut r = RuleReader::with_command(node("nftables"), NS, vec!["/nonexistent/nsenter".into()], "");
    let e = r.endpoint_ips().unwrap_err();
    assert_eq!(e.command, "/nonexistent/nsenter nft list chains");
    assert!(e.how.starts_with("cannot start:"), "{e}");
    // `false` exits 1 for every read
    let mut r = RuleReader::with_command(node("nftables"), NS, vec!["false".into()], "");
    assert!(r.endpoint_ips().unwrap_err().how.starts_with("exit status: 1"));
    // the Service's chain not (or no longer) in the table
    let dir = nft_dir();
    write(dir.path(), "chains.out", "table ip kube-proxy {\n\tchain services {\n\t}\n}\n");
    let e = reader(dir.path(), "nftables").endpoint_ips().unwrap_err();
    assert!(e.how.contains("no chain of Service exp-b/web port http"), "{e}");
}

#[test]
fn iptables_failed_reads_record_no_removal_and_a_successful_read_without_the_ip_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    script(d, "iptables", FAKE_IPTABLES);
    script(d, "iptables-save", FAKE_IPTABLES_SAVE);
    let svc = "KUBE-SVC-ABCDEFGHIJKLMNOP";
    write(
        d,
        "save.out",
        &format!(
            "# Generated by iptables-save\n*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment \"exp-b/web:http cluster IP\" -m tcp --dport 80 -j {svc}\nCOMMIT\n"
        ),
    );
    let svc_rules = |seps: &[&str]| {
        let mut s =
            format!("-N {svc}\n-A {svc} ! -s 10.244.0.0/16 -d 10.96.0.20/32 -p tcp -m comment --comment \"exp-b/web:http cluster IP\" -j KUBE-MARK-MASQ\n");
        for sep in seps {
            s += &format!("-A {svc} -m comment --comment \"exp-b/web:http -> x\" -m statistic --mode random --probability 0.5 -j {sep}\n");
        }
        s
    };
    let sep_rules =
        |sep: &str, ip: &str| format!("-N {sep}\n-A {sep} -s {ip}/32 -j KUBE-MARK-MASQ\n-A {sep} -p tcp -m tcp -j DNAT --to-destination {ip}:8080\n");
    write(d, &format!("{svc}.out"), &svc_rules(&["KUBE-SEP-AAAA", "KUBE-SEP-BBBB"]));
    write(d, "KUBE-SEP-AAAA.out", &sep_rules("KUBE-SEP-AAAA", "10.244.1.10"));
    write(d, "KUBE-SEP-BBBB.out", &sep_rules("KUBE-SEP-BBBB", "10.244.2.3"));
    let mut r = reader(d, "iptables-nft");
    let mut trace = RuleTrace::default();
    assert_eq!(read_into(&mut r, &mut trace).unwrap(), set(&["10.244.1.10", "10.244.2.3"]));
    assert_eq!(r.chain.as_deref(), Some(svc));

    // the Service chain's listing fails
    write(d, &format!("{svc}.rc"), "1");
    let e = read_into(&mut r, &mut trace).unwrap_err();
    assert!(e.contains(&format!("iptables -t nat -S {svc}")) && e.contains("exit status: 1"), "{e}");
    write(d, &format!("{svc}.rc"), "0");
    // a new endpoint chain that is gone by the time it is listed: the whole read fails (leaving
    // its IP out would not be a removal, but 10.244.2.3 must not look removed either)
    write(d, &format!("{svc}.out"), &svc_rules(&["KUBE-SEP-AAAA", "KUBE-SEP-CCCC"]));
    write(d, "KUBE-SEP-CCCC.rc", "1");
    assert!(read_into(&mut r, &mut trace).unwrap_err().contains("-S KUBE-SEP-CCCC"));
    // garbage on stdout with status 0; an endpoint chain without its DNAT target
    write(d, &format!("{svc}.out"), "iptables v1.8.11 (nf_tables): something odd\n");
    assert!(read_into(&mut r, &mut trace).unwrap_err().contains("unparsable output"));
    write(d, &format!("{svc}.out"), &svc_rules(&["KUBE-SEP-AAAA", "KUBE-SEP-DDDD"]));
    write(d, "KUBE-SEP-DDDD.out", "-N KUBE-SEP-DDDD\n-A KUBE-SEP-DDDD -j KUBE-MARK-MASQ\n");
    assert!(read_into(&mut r, &mut trace).unwrap_err().contains("no DNAT --to-destination in KUBE-SEP-DDDD"));
    assert_eq!((trace.reads, trace.failed_reads), (1, 4));
    assert!(trace.transitions.is_empty(), "{:?}", trace.transitions);

    // KUBE-SEP-BBBB gone from a successful listing: 10.244.2.3 removed
    write(d, &format!("{svc}.out"), &svc_rules(&["KUBE-SEP-AAAA"]));
    assert_eq!(read_into(&mut r, &mut trace).unwrap(), set(&["10.244.1.10"]));
    let removal = trace.removal("10.244.2.3", 0.0).expect("a removal");
    assert!(removal.after < removal.by);
    assert_eq!(trace.transitions.len(), 1);
}

#[test]
fn a_monitor_that_dies_or_prints_garbage_records_no_removal() {
    let dir = nft_dir();
    let d = dir.path();
    // another chain's rule (ignored), then the Service chain with an entry that is no IP, then
    // the monitor dies (exit 1); it is started again (after a full read) until the stop
    write(d, "monitor.out", &(monitor_line("service-XYZ-other/db/tcp/pg", &["10.244.9.9"]) + &monitor_line(CHAIN, &["10.244.1.10", "garbage"])));
    let trace = follow_monitor_for(d, Duration::from_millis(600));
    assert!(trace.transitions.is_empty(), "{:?}", trace.transitions);
    assert!(trace.reads >= 1, "the full reads between monitors");
    assert!(trace.failed_reads >= 2, "the garbage line and the death: {trace:?}");
    assert!(trace.errors.iter().any(|e| e.contains("unparsable line") && e.contains("\"garbage\"")), "{:?}", trace.errors);
    assert!(trace.errors.iter().any(|e| e.contains("nft monitor rules: exited (exit status: 1)")), "{:?}", trace.errors);
}

#[test]
fn a_monitored_line_without_the_ip_is_a_removal_and_the_stop_is_no_failure() {
    let dir = nft_dir();
    let d = dir.path();
    write(d, "monitor.out", &monitor_line(CHAIN, &["10.244.1.10"]));
    write(d, "monitor.hang", "");
    let started = now_unix();
    let trace = follow_monitor_for(d, Duration::from_millis(400));
    assert_eq!((trace.reads, trace.failed_reads), (2, 0), "{:?}", trace.errors);
    let removal = trace.removal("10.244.2.3", 0.0).expect("a removal");
    assert!(started <= removal.after && removal.after <= removal.by, "{removal:?}");
    assert!(trace.removal_missed_by_monitor("10.244.2.3", 0.0).is_none(), "the monitor showed it");
    assert_eq!(trace.present(), Some(&set(&["10.244.1.10"])));
}

#[test]
fn lost_monitor_events_are_followed_by_a_full_read_that_records_the_missed_removal() {
    let dir = nft_dir();
    let d = dir.path();
    // the monitor prints an informational comment (no read), then nft's report of a netlink
    // overflow; the removal of 10.244.2.3 was among the lost events, so only the listing after
    // the report shows it (chain.next)
    write(
        d,
        "monitor.out",
        "# Cannot set up netlink socket buffer size to 16777216 bytes, falling back to 212992 bytes\n# ERROR: We lost some netlink events!\n",
    );
    write(d, "monitor.hang", "");
    write(d, "chain.next", &nft_listing(&["10.244.1.10"]));
    let started = now_unix();
    let trace = follow_monitor_for(d, Duration::from_millis(400));
    assert_eq!((trace.reads, trace.failed_reads, trace.lost_events), (2, 0, 1), "{:?}", trace.errors);
    let removal = trace.removal("10.244.2.3", 0.0).expect("the lost removal, seen by the full read");
    assert!(started <= removal.after && removal.after <= removal.by, "{removal:?}");
    assert_eq!(trace.present(), Some(&set(&["10.244.1.10"])));
}

#[test]
fn a_removal_the_monitor_never_shows_is_taken_from_the_full_read_after_the_change() {
    let dir = nft_dir();
    let d = dir.path();
    // the monitor prints a change of the chain that still holds 10.244.2.3, while the chain
    // listed after it (chain.next, from the second listing on) no longer does
    write(d, "monitor.out", &monitor_line(CHAIN, &["10.244.1.10", "10.244.2.3"]));
    write(d, "monitor.hang", "");
    write(d, "chain.next", &nft_listing(&["10.244.1.10"]));
    let started = now_unix();
    let trace = follow_monitor_for(d, Duration::from_millis(400));
    assert!(trace.transitions.iter().all(|t| t.present), "the monitor never showed a removal: {:?}", trace.transitions);
    let confirmed = trace.confirmed.as_deref().expect("the confirming reads");
    assert_eq!((confirmed.reads, confirmed.failed_reads), (2, 0), "the first read and one after the change: {:?}", confirmed.errors);
    let removal = trace.removal("10.244.2.3", 0.0).expect("the removal, from the full read after the change");
    assert_eq!(trace.removal_missed_by_monitor("10.244.2.3", 0.0), Some(removal));
    assert!(started <= removal.after && removal.after <= removal.by && removal.by <= now_unix(), "{removal:?}");
    assert!(trace.removal("10.244.1.10", 0.0).is_none());
    assert!(trace.absent_since("10.244.2.3", 0.0, now_unix()).is_some(), "absent from then on, by the same reads");
}

#[test]
fn parsers_accept_kube_proxy_output_and_reject_the_rest() {
    let line = "meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.10 . 8080, 1 : 10.244.2.3 . 8080 }";
    assert_eq!(nft_map_ips(line).unwrap(), set(&["10.244.1.10", "10.244.2.3"]));
    assert!(nft_map_ips("meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.10 . 8080, 1 : 10.2").is_err());
    assert!(nft_map_ips("jump mark-for-masquerade").is_err());
    assert_eq!(parse_sep_ip("-N KUBE-SEP-A\n-A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.244.1.5:8080\n", "KUBE-SEP-A").unwrap(), "10.244.1.5");
    assert!(parse_sep_ip("-A KUBE-SEP-A -j DNAT --to-destination nonsense:8080\n", "KUBE-SEP-A").is_err());
    assert_eq!(parse_iptables_chain("-N KUBE-SVC-X\n-A KUBE-SVC-X -j KUBE-SEP-A\n", "KUBE-SVC-X").unwrap(), ["KUBE-SEP-A"]);
    assert!(parse_iptables_chain("", "KUBE-SVC-X").is_err());
    assert!(parse_iptables_chain("-N KUBE-SVC-X\n-A KUBE-SVC-Y -j KUBE-SEP-A\n", "KUBE-SVC-X").is_err());
}

/// A real read of a Cilium node (`cilium-dbg bpf lb list --frontends`, then `--backends`) during
/// a pod's termination: slot 0 of 10.96.220.21:80/TCP says 3 active backends and 1 terminating.
const CILIUM_TERMINATING: &str = include_str!("data/cilium/lb-list-terminating.txt");

#[test]
fn the_cilium_read_counts_only_the_active_slots() {
    let active = common::rules::parse_cilium_lb(CILIUM_TERMINATING, "10.96.220.21:80/TCP").unwrap();
    // slots 1-3 (backends 6, 5, 8); backend 7 (10.244.3.53) is in slot 4, terminating
    assert_eq!(active, set(&["10.244.1.3", "10.244.2.3", "10.244.3.203"]));
    assert_eq!(common::rules::parse_cilium_lb(CILIUM_TERMINATING, "10.96.0.1:443/TCP").unwrap(), set(&["10.213.254.1"]));
    // no such frontend: the Service is not programmed, no sample
    assert!(common::rules::parse_cilium_lb(CILIUM_TERMINATING, "10.96.9.9:80/TCP").unwrap_err().contains("no slot 0"));
    // a count beyond the listed slots, an unknown backend, a missing listing: errors
    let more = CILIUM_TERMINATING.replace("0 3[1] (2)", "0 5[0] (2)");
    assert!(common::rules::parse_cilium_lb(&more, "10.96.220.21:80/TCP").unwrap_err().contains("slot 5"));
    let unknown = CILIUM_TERMINATING.replace("\"6 0[0] (2)", "\"60 0[0] (2)");
    assert!(common::rules::parse_cilium_lb(&unknown, "10.96.220.21:80/TCP").unwrap_err().contains("backend 60"));
    assert!(common::rules::parse_cilium_lb(CILIUM_TERMINATING.split("----backends----").next().unwrap(), "10.96.220.21:80/TCP").is_err());
}

/// The rank of the per-pod window the experiment's W must cover (tests/e2e_deploy.rs).
#[test]
fn p99_check_rank_is_the_binomial_tail_at_1_percent() {
    // P(X >= 1) = 1 - 0.99^n: 5.9 % at 6, 11.4 % at 12; P(X >= 2) 0.15 % at 6, 0.62 % at 12,
    // 1.6 % at 16; P(X >= 3) 0.56 % at 36
    assert_eq!([1, 6, 12, 14, 16, 36].map(common::truth::p99_check_rank), [1, 2, 2, 2, 3, 3]);
}
