//! Replays the committed fuzz corpora (`fuzz/corpus/<target>/`, minimised by libFuzzer) through
//! the fuzz targets' own checks (fuzz/checks.rs, included here), so that `cargo test` catches a
//! regression on every input the fuzzers found interesting, without a fuzzer. The crashes the
//! fuzzers found are regression tests of their own in the suites of their modules.

#[path = "../fuzz/checks.rs"]
mod checks;

use std::path::Path;

/// Runs target `name`'s check over every file of its corpus; returns how many there were.
fn replay(name: &str) -> usize {
    let (_, check) = checks::TARGETS.iter().find(|(n, _)| *n == name).expect("a target of that name");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(name);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "{} fails its check", path.display());
        n += 1;
    }
    n
}

macro_rules! corpus_tests {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let n = replay(stringify!($name));
            // a corpus seeded with real inputs and kept by libFuzzer: never (nearly) empty
            assert!(n >= 5, "{n} inputs in fuzz/corpus/{}", stringify!($name));
        }
    )*};
}

corpus_tests!(
    text_parser,
    protobuf,
    native,
    review,
    mutate_yaml,
    configz,
    configmap,
    go_duration,
    policy_spec,
    agent_answer,
    rule_listing,
    observe_wire,
    nft_netlink,
    cilium_lb
);

/// Every target of fuzz/checks.rs has a test above (and a binary in fuzz/Cargo.toml).
#[test]
fn every_target_is_replayed() {
    let this = include_str!("fuzz_corpora.rs");
    // the invocation, on one line or (as rustfmt breaks a long one) several
    let start = this.find("\ncorpus_tests!(").expect("the corpus_tests! invocation") + "\ncorpus_tests!(".len();
    let list = &this[start..start + this[start..].find(");").expect("the end of the corpus_tests! invocation")];
    let tested: Vec<&str> = list.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
    let manifest = include_str!("../fuzz/Cargo.toml");
    assert_eq!(tested.len(), checks::TARGETS.len());
    for (name, _) in checks::TARGETS {
        assert!(tested.contains(name), "no replay test for {name}");
        assert!(manifest.contains(&format!("name = \"{name}\"")), "no fuzz binary for {name}");
    }
}
