//! The pure core: every module here is a function of its inputs, with no I/O (no network, no
//! files, no clock read, no Kubernetes client), so each is tested by value and fuzzed in
//! process. The adapters around it (`sources`, `controller`, `webhook`, `agent`, `certs`) feed
//! it what they read and carry out what it decides.
//!
//! - What kube-proxy's numbers say: [`exposition`] (the text and protobuf expositions, classic
//!   and native histograms) and [`proxyconfig`] (its configuration: minSyncPeriod, proxy mode).
//! - How long a removal takes: [`measure`] (the rolling samples per node), [`control_plane`]
//!   (the control plane's part of a deletion, from watches), [`model`] (one
//!   node's window and the cluster's) with [`window_distribution`] (the kube-proxy term of W),
//!   and [`removals`] (observed removals: windows, censoring, p99, each pod's coverage).
//! - What to do about it: [`sizing`] (preStop and terminationGracePeriodSeconds from W),
//!   [`advisor`] (what a person should change), [`analysis`] (one report per measurement).
//! - What a new pod gets: [`plan`] (what every policy asks, as both admission backends serve
//!   it), [`mutate`] (the webhook's JSON patch of one pod) and [`admission`] (the same rules as a
//!   MutatingAdmissionPolicy in CEL), and [`wait`] (the preStop `Wait` handler: what it injects,
//!   what the operator answers the waiter).
//! - The shared vocabulary: [`crd`] (the TerminationPolicy types), [`selector`] (label
//!   selectors, precedence), [`annotations`] (what the webhook writes and the controller reads).

pub mod admission;
pub mod advisor;
pub mod analysis;
pub mod annotations;
pub mod control_plane;
pub mod crd;
pub mod exposition;
pub mod measure;
pub mod model;
pub mod mutate;
pub mod plan;
pub mod proxyconfig;
pub mod removals;
pub mod selector;
pub mod sizing;
pub mod wait;
pub mod window_distribution;
