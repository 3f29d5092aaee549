//! Writes the TerminationPolicy CRD (generated from the Rust types) to standard output:
//! `cargo run --bin crdgen > crds/terminationpolicy.yaml`.

fn main() {
    print!("{}", safe_termination::crd::crd_yaml());
}
