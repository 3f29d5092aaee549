//! Criterion benchmarks of the webhook's hot path (docs/benchmarks/webhook.md "Webhook"):
//! - `mutate_pod` on the 3-container kube-state-metrics pod template (target <= 20 us);
//! - `review()` on the shared AdmissionReview (parse, mutate, encode the response);
//! - for scale, in the same run: checking that the body is JSON without building anything (the
//!   floor of any webhook that rejects undecodable bodies), `review()`'s own pruned parse,
//!   parsing the whole body into a `serde_json::Value`, and kube-core's typed decode of the
//!   parsed body (what `review()` did before it read the few fields it needs by reference).
//!
//! Run: `cargo bench --bench mutate`. The global allocator is mimalloc, as in the binary.

use criterion::{Criterion, black_box, criterion_group, criterion_main};

/// The allocator the `safe-termination` binary uses (src/main.rs), so that these figures are the
/// server's: with glibc malloc, a quarter of `review()`'s time here was malloc/free.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use safe_termination::cli::mutate::{NativeSleep, PlanArgs, documents, pod_of};
use safe_termination::core::mutate::mutate_pod;
use safe_termination::core::selector::AssumeServiceBacked;
use safe_termination::webhook::review;

const KSM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/pods/kube-state-metrics-distroless-multicontainer.yaml");
const REVIEW: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/admission/admissionreview-pod-create.json");

fn static_plan() -> safe_termination::core::plan::Plan {
    PlanArgs { policy: None, pre_stop_seconds: Some(10), native_sleep: NativeSleep::Auto }.plan().expect("static plan")
}

fn bench_mutate(c: &mut Criterion) {
    let plan = static_plan();
    let docs = documents(KSM).expect("kube-state-metrics manifest");
    let (pod, ns) = pod_of(&docs[0], "default").expect("pod template");
    let d = mutate_pod(&pod, &ns, &plan, &AssumeServiceBacked);
    assert!(!d.patch.0.is_empty(), "the benchmark pod must be mutated");
    c.bench_function("mutate_pod/kube-state-metrics-3-containers", |b| b.iter(|| mutate_pod(black_box(&pod), black_box(&ns), &plan, &AssumeServiceBacked)));

    let body = std::fs::read(REVIEW).expect("admission review");
    let out = review(&body, &plan, &AssumeServiceBacked);
    assert_eq!((out.status, out.decision), (200, "mutated"));
    c.bench_function("review/admissionreview-pod-create", |b| b.iter(|| review(black_box(&body), &plan, &AssumeServiceBacked)));
    c.bench_function("review-parts/check-json-only", |b| b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&body)).unwrap()));
    c.bench_function("review-parts/parse-pruned", |b| b.iter(|| safe_termination::webhook::review::parse_review(black_box(&body)).unwrap()));
    c.bench_function("review-parts/parse-into-value", |b| b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&body)).unwrap()));
    let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
    c.bench_function("review-parts/kube-typed-decode-of-the-value", |b| {
        b.iter(|| {
            use serde::Deserialize as _;
            let r = kube::core::admission::AdmissionReview::<kube::core::DynamicObject>::deserialize(black_box(&value)).unwrap();
            let req: kube::core::admission::AdmissionRequest<kube::core::DynamicObject> = r.try_into().unwrap();
            req
        })
    });
}

criterion_group!(benches, bench_mutate);
criterion_main!(benches);
