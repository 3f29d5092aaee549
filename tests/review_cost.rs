//! The webhook's work per admission request follows the pod's bytes, not its containers
//! (docs/cli.md "Limits"): `review()` on pods of many containers, under an allocator that counts
//! the bytes live at the peak and the allocations made. Memory and allocation counts, not time:
//! time is left to the benches (BENCHMARKS.md), these figures are exact on any machine.
//!
//! One test in this binary, so nothing else allocates while it measures.

use proptest::prelude::*;
use safe_termination::cli::mutate::{NativeSleep, PlanArgs};
use safe_termination::core::mutate::MAX_POD_CONTAINERS;
use safe_termination::core::selector::AssumeServiceBacked;
use safe_termination::webhook::review;
/// The counting allocator of the fuzz targets (fuzz/peak.rs).
#[allow(dead_code)]
#[path = "../fuzz/peak.rs"]
mod peak;

#[global_allocator]
static GLOBAL: peak::Counting = peak::Counting;

/// An AdmissionReview of a pod with `n` containers `{"name": "<prefix>N", "image": "<image>"}`.
fn body(n: usize, prefix: &str, image: &str) -> Vec<u8> {
    let containers: Vec<String> = (0..n).map(|i| format!(r#"{{"name":"{prefix}{i}","image":"{image}"}}"#)).collect();
    format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"u","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"namespace":"ns","operation":"CREATE","object":{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p","namespace":"ns","labels":{{"app":"web"}}}},"spec":{{"containers":[{}]}}}}}}}}"#,
        containers.join(",")
    )
    .into_bytes()
}

/// (peak bytes live above those live before, allocations, status, decision) of one `review()`
/// of `body`.
fn cost(body: &[u8]) -> (usize, usize, u16, &'static str) {
    let plan = PlanArgs { policy: None, pre_stop_seconds: Some(10), native_sleep: NativeSleep::Auto }.plan().unwrap();
    let (out, peak, allocs) = peak::measure(|| review(body, &plan, &AssumeServiceBacked));
    (peak, allocs, out.status, out.decision)
}

/// Per container, over the pod of `n` against the pod of 1 (the request's fixed part cancels).
fn per_container(n: usize, prefix: &str, image: &str) -> (f64, f64) {
    let (p1, a1, ..) = cost(&body(1, prefix, image));
    let (pn, an, status, decision) = cost(&body(n, prefix, image));
    assert_eq!((status, decision), (200, "mutated"), "{n} containers");
    ((pn as f64 - p1 as f64) / (n - 1) as f64, (an as f64 - a1 as f64) / (n - 1) as f64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Up to the container limit, each container adds a flat cost whatever the pod's size:
    /// at most 8 KiB live at the peak and 40 allocations per container (the patch's own
    /// preStop object per container included), and the 256-container pod costs at most 1.5 x
    /// per container what the 16-container pod does (no growth beyond linear). Past the limit
    /// the pod is admitted unchanged within 512 KiB live, whatever its containers (measured:
    /// about 4.9 KB and 33 allocations per container; 195 KB for 40,000 or 80,000 containers;
    /// docs/benchmarks/bounded-work.md "Bounded work per request").
    #[test]
    fn the_cost_per_container_is_flat_and_the_limit_caps_the_rest(prefix in "[a-z]{1,20}", image in "[a-z0-9./:-]{1,60}", n in 2usize..=MAX_POD_CONTAINERS) {
        let (bytes, allocs) = per_container(n, &prefix, &image);
        prop_assert!(bytes <= 8192.0, "{n} containers: {bytes:.0} bytes per container");
        prop_assert!(allocs <= 40.0, "{n} containers: {allocs:.1} allocations per container");
        let (small, _) = per_container(16, &prefix, &image);
        let (large, _) = per_container(MAX_POD_CONTAINERS, &prefix, &image);
        prop_assert!(large <= 1.5 * small.max(1.0), "per container: {large:.0} bytes at 256 against {small:.0} at 16");
        let over = body(40_000, &prefix, &image);
        let (peak, _, status, decision) = cost(&over);
        prop_assert_eq!((status, decision), (200, "skipped_too_many_containers"));
        prop_assert!(peak <= 512 * 1024, "40,000 containers: {peak} bytes live at the peak for a {}-byte body", over.len());
    }
}

#[test]
#[ignore = "prints the figures of BENCHMARKS.md"]
fn print_figures() {
    for n in [16, 64, 256] {
        let (b, a) = per_container(n, "c", "registry.example/app:1.0");
        println!("{n} containers: {b:.0} bytes and {a:.1} allocations per container");
    }
    for n in [1, 256, 40_000, 80_000] {
        let body = body(n, "c", "x");
        let (peak, allocs, _, decision) = cost(&body);
        println!("{n} containers ({} bytes): peak {peak} bytes live, {allocs} allocations, {decision}", body.len());
    }
}
