//! Writes a CustomResourceDefinition generated from the Rust types to standard output:
//! `cargo run --bin crdgen > crds/terminationpolicy.yaml` and
//! `cargo run --bin crdgen terminationparameters > crds/terminationparameters.yaml`.

fn main() {
    match std::env::args().nth(1).as_deref() {
        None | Some("terminationpolicy") => print!("{}", safe_termination::core::crd::crd_yaml()),
        Some("terminationparameters") => print!("{}", safe_termination::core::admission::params::crd_yaml()),
        Some(other) => {
            eprintln!("crdgen: unknown CRD {other:?}: use terminationpolicy (default) or terminationparameters");
            std::process::exit(2);
        }
    }
}
