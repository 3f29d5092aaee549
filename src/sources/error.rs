//! The error of the sources layer.

/// Why a source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    File {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file or standard input is larger than [`super::oneshot::MAX_FILE_BYTES`]. The message
    /// fits any command's input; `analyze` adds how large a scrape is.
    #[error("{path}: larger than {limit} bytes, the limit on a file or standard input: is this the right file?")]
    FileTooLarge {
        /// The path, or `<stdin>`.
        path: String,
        /// The limit, bytes.
        limit: u64,
    },
    /// A file or body is not UTF-8 text.
    #[error("{origin}:{line}: invalid UTF-8 at byte offset {offset} (byte {column} of line {line}): the input must be UTF-8 text")]
    NotUtf8 {
        /// The path, `<stdin>` or URL.
        origin: String,
        /// 1-based line of the first invalid byte.
        line: usize,
        /// 1-based byte column of the first invalid byte within its line.
        column: usize,
        /// 0-based byte offset of the first invalid byte in the input.
        offset: usize,
    },
    /// A static kube-proxy target (`--kube-proxy-target`) is malformed.
    #[error("target {spec:?}: {message}")]
    Target {
        /// The target as given.
        spec: String,
        /// What is wrong with it.
        message: String,
    },
    /// A Kubernetes API call of a source failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being read (`listing pods "k8s-app=kube-proxy" in namespace kube-system`).
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// A `--metrics-file` argument is not `NODE=FILE`.
    #[error("--metrics-file {0:?}: expected NODE=FILE")]
    MetricsFileSpec(String),
    /// A saved scrape is not valid exposition text (the message names the file and line).
    #[error("{0}")]
    Scrape(String),
    /// kube-proxy's configuration could not be read or is not valid (`/configz`, ConfigMap).
    #[error("{0}")]
    Config(String),
    /// A URL could not be fetched.
    #[error("{url}: {message}")]
    Http {
        /// The URL, userinfo redacted ([`redact`]).
        url: String,
        /// What went wrong, with a hint for the common causes.
        message: String,
    },
}
