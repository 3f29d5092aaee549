//! The cluster's command-line tools (helm, kubectl, promtool of `make k8s-bins`) as the e2e
//! tests run them: against the e2e cluster's kubeconfig, from the repository root, failing with
//! everything they printed.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `$KUBECONFIG`, else the e2e cluster's.
pub fn kubeconfig() -> String {
    std::env::var("KUBECONFIG").unwrap_or_else(|_| format!("{}/kubeconfig", super::state_dir()))
}

/// `$ST_K8S_BIN`, else the cache dir of the pinned Kubernetes version.
pub fn bin_dir() -> PathBuf {
    std::env::var("ST_K8S_BIN").map(PathBuf::from).unwrap_or_else(|_| {
        let version = std::fs::read_to_string(root().join("e2e/toolchain/k8s-version")).unwrap().trim().to_string();
        let cache = std::env::var("ST_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/safe-termination"));
        cache.join(format!("k8s-v{version}/bin"))
    })
}

/// `name` from [`bin_dir`], with the cluster's kubeconfig, run from the repository root. Panics
/// when it is not there, naming the make target that builds it (helm and promtool: `make
/// test-tools`, the others `make k8s-bins`).
pub fn tool(name: &str) -> Command {
    let path = bin_dir().join(name);
    let target = if matches!(name, "helm" | "promtool") { "make test-tools" } else { "make k8s-bins" };
    assert!(path.is_file(), "{} is missing: run `{target}` (or set ST_K8S_BIN)", path.display());
    let mut c = Command::new(path);
    c.env("KUBECONFIG", kubeconfig()).current_dir(root());
    c
}

/// Runs `c` (feeding `stdin`), returns stdout; panics with everything on failure.
pub fn run(c: &mut Command, stdin: Option<&str>) -> String {
    try_run(c, stdin).unwrap_or_else(|e| panic!("{e}"))
}

/// [`run`], returning the failure (command, status, stdout, stderr) instead of panicking.
pub fn try_run(c: &mut Command, stdin: Option<&str>) -> Result<String, String> {
    c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    if out.status.success() { Ok(stdout) } else { Err(format!("{c:?} failed ({}):\n{stdout}\n{stderr}", out.status)) }
}
