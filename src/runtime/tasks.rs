//! The set the operator's long-running tasks run in: the first task to end stops the process
//! (`cli::run`), and a stop cancels them all and waits a bounded time.

use std::future::Future;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The operator's tasks, each named for the log line when it ends.
pub struct Tasks {
    set: JoinSet<&'static str>,
    stop: CancellationToken,
}

impl Tasks {
    /// An empty set whose tasks stop on `stop`.
    pub fn new(stop: CancellationToken) -> Self {
        Self { set: JoinSet::new(), stop }
    }

    /// The token that stops every task of the set: a task that must do something on the stop
    /// (release its lease) selects on it.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Runs `task` as `name`.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.set.spawn(async move {
            task.await;
            name
        });
    }

    /// The name of the next task to end (`None` when there is none).
    pub async fn next_ended(&mut self) -> Option<&'static str> {
        self.set.join_next().await.map(|r| r.unwrap_or("a task"))
    }

    /// Cancels every task and waits up to `timeout` for them, then aborts the rest.
    pub async fn stop(mut self, timeout: Duration) {
        self.stop.cancel();
        let drain = tokio::time::timeout(timeout, async { while self.set.join_next().await.is_some() {} });
        if drain.await.is_err() {
            self.set.abort_all();
        }
    }
}
