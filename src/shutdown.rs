//! Process shutdown: one signal (SIGTERM or SIGINT) starts a graceful shutdown (stop accepting,
//! drain in-flight work, exit 0); a second signal aborts (exit non-zero).
//!
//! [`Shutdown`] holds two `CancellationToken`s that every long-running task of the process
//! shares: [`Shutdown::token`] (graceful: stop taking new work and finish what is in flight) and
//! [`Shutdown::abort_token`] (give up now). The composition root selects on the abort token so
//! that nothing can keep the process alive after a second signal.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio_util::sync::CancellationToken;

/// The process's shutdown state. Clone it freely.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    graceful: CancellationToken,
    abort: CancellationToken,
    requests: Arc<AtomicUsize>,
}

impl Shutdown {
    /// Not shutting down.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancelled on the first request to stop: stop accepting, drain.
    pub fn token(&self) -> CancellationToken {
        self.graceful.clone()
    }

    /// Cancelled on the second request to stop: abort now.
    pub fn abort_token(&self) -> CancellationToken {
        self.abort.clone()
    }

    /// Requests a stop: the first call starts the graceful shutdown, any later call aborts.
    /// Returns how many stop requests there have been, this one included.
    pub fn trigger(&self) -> usize {
        let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
        self.graceful.cancel();
        if n > 1 {
            self.abort.cancel();
        }
        n
    }

    /// True after a second stop request.
    pub fn is_aborted(&self) -> bool {
        self.abort.is_cancelled()
    }

    /// Spawns a task that turns SIGTERM and SIGINT into [`Shutdown::trigger`] calls. Call it from
    /// inside a Tokio runtime.
    pub fn listen_for_signals(&self) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let this = self.clone();
        Ok(tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    Some(()) = term.recv() => "SIGTERM",
                    Some(()) = int.recv() => "SIGINT",
                    else => return,
                };
                if this.trigger() == 1 {
                    tracing::info!(signal = name, "shutting down: no new connections, finishing in-flight requests (a second signal aborts)");
                } else {
                    tracing::warn!(signal = name, "second signal: aborting");
                    return;
                }
            }
        }))
    }
}

/// Starts a graceful shutdown of an axum-server `handle` when `token` is cancelled, letting open
/// requests finish for at most `drain` (the webhook port and the admin port both use it). Abort
/// the returned task once the server has returned.
pub fn drain_when_cancelled<A: axum_server::Address + Send + Sync + 'static>(
    handle: &axum_server::Handle<A>,
    token: CancellationToken,
    drain: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    let handle = handle.clone();
    tokio::spawn(async move {
        token.cancelled().await;
        handle.graceful_shutdown(Some(drain));
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_trigger_is_graceful_second_aborts() {
        let s = Shutdown::new();
        assert!(!s.token().is_cancelled());
        assert_eq!(s.trigger(), 1);
        assert!(s.token().is_cancelled());
        assert!(!s.is_aborted());
        assert_eq!(s.clone().trigger(), 2);
        assert!(s.abort_token().is_cancelled());
    }
}
