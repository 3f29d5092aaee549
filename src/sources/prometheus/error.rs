//! The error of the Prometheus source.

/// Why a Prometheus query failed. Every variant's message names the URL or the query.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PrometheusError {
    /// The base URL is not an http(s) URL.
    #[error("Prometheus URL {url:?} is not valid: {message}")]
    Url {
        /// The URL given.
        url: String,
        /// Why.
        message: String,
    },
    /// No HTTP answer (refused, timeout, DNS, TLS).
    #[error("Prometheus at {url} did not answer: {message}")]
    Transport {
        /// The query URL (without the query string).
        url: String,
        /// The client error with its causes.
        message: String,
    },
    /// Prometheus answered `"status": "error"` (bad query, timeout, unavailable).
    #[error("Prometheus rejected the query {query:?}: {error_type}: {error} (HTTP {http_status})")]
    Api {
        /// The PromQL.
        query: String,
        /// `errorType` (`bad_data`, `timeout`, `execution`, `unavailable`, ...).
        error_type: String,
        /// `error`.
        error: String,
        /// The HTTP status code of the answer.
        http_status: u16,
    },
    /// A non-2xx answer without a Prometheus error body (a proxy or the wrong server).
    #[error("Prometheus query {query:?} failed: HTTP {http_status}: {body}")]
    Http {
        /// The PromQL.
        query: String,
        /// The HTTP status code.
        http_status: u16,
        /// The start of the body (at most 200 characters).
        body: String,
    },
    /// The body is not the Prometheus API's JSON, or not an instant vector.
    #[error("Prometheus query {query:?}: unexpected answer: {message}")]
    Decode {
        /// The PromQL.
        query: String,
        /// What was wrong.
        message: String,
    },
}
