//! Leader election: one replica at a time measures and writes status. A Lease held through
//! kube-lease-manager, with two rules of this crate's own on top: a leader that sees no renewal
//! of its lease steps down before the lease can expire for the others ([`LEADER_STEP_DOWN`]),
//! and a follower reads the Lease often enough to take a released one at once
//! ([`RELEASED_LEASE_CHECK`]).

use super::shared::Leadership;
use super::tasks::Tasks;
use kube::Client;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often a follower reads the Lease to see whether it was released, and a leader to see
/// that it is still renewed.
pub const RELEASED_LEASE_CHECK: Duration = Duration::from_secs(2);

/// The Lease's duration (`spec.leaseDurationSeconds`): another replica may take it this long
/// after its last renewal.
pub const LEASE_DURATION_SECONDS: u64 = 30;

/// kube-lease-manager renews the lease this long before it expires: every 20 s.
pub const LEASE_GRACE_SECONDS: u64 = 10;

/// A leader stops leading this long after it last saw its lease renewed (by its own clock), if
/// it has seen no renewal since: before the lease expires for the others
/// ([`LEASE_DURATION_SECONDS`]), with room for the [`RELEASED_LEASE_CHECK`] period it sees
/// renewals with. kube-lease-manager keeps its last state when a renewal fails (an API server
/// restart), so without this a leader whose lease expired kept writing status beside the
/// replica that took it (tests/e2e_operator_pods.rs t6: 3 s of overlapping status writers).
pub const LEADER_STEP_DOWN: Duration = Duration::from_secs(25);

/// When this replica last saw its own lease renewed, by its own clock: when its lease manager
/// took the lease, or when a read of the Lease showed it as the holder with a `renewTime` not
/// seen before. Pure: the lease task feeds it.
#[derive(Debug, Default)]
struct RenewalSeen {
    renew_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>,
    at: Option<Instant>,
}

impl RenewalSeen {
    /// The lease manager took (or still holds) the lease at `now`.
    fn acquired(&mut self, now: Instant) {
        self.at = Some(now);
    }

    /// A read of the Lease at `now`: a renewal when this replica holds it and its `renewTime`
    /// changed.
    fn observe(&mut self, lease: &k8s_openapi::api::coordination::v1::Lease, identity: &str, now: Instant) {
        let Some(spec) = lease.spec.as_ref() else { return };
        if spec.holder_identity.as_deref() == Some(identity) && spec.renew_time.is_some() && spec.renew_time != self.renew_time {
            self.renew_time = spec.renew_time.clone();
            self.at = Some(now);
        }
    }

    /// Whether a renewal was seen within [`LEADER_STEP_DOWN`] before `now`.
    fn fresh(&self, now: Instant) -> bool {
        self.at.is_some_and(|t| now.saturating_duration_since(t) < LEADER_STEP_DOWN)
    }
}

/// Joins the lease `lease_name` in `namespace` as `identity` and spawns the lease task into
/// `tasks`. Errors: the lease manager could not be built.
///
/// The task keeps competing for the lease (kube-lease-manager: [`LEASE_DURATION_SECONDS`] lease, renewed
/// [`LEASE_GRACE_SECONDS`] before it expires) and publishes whether this replica leads. It releases the lease when the
/// process stops, and also as soon as `own_pod` (this replica's Pod in `namespace`, from the
/// chart's `POD_NAME`) is being deleted: the replica keeps serving the webhook through its
/// preStop sleep.
///
/// This replica leads while its lease manager says so and it has seen the lease renewed within
/// [`LEADER_STEP_DOWN`] ([`RenewalSeen`]): a leader that cannot renew (the API server is away)
/// stops leading before another replica can take the lease.
///
/// A kube-lease-manager follower checks the lease only when the lease it last read would
/// expire, so a release alone is seen 0-30 s later. A follower therefore also reads the Lease
/// every [`RELEASED_LEASE_CHECK`]; when it has no holder, the follower starts over with a new
/// manager (whose first step reads the lease and takes it if still free), so a released lease
/// is taken within about that period. Two followers may both start over: the lease still goes
/// to one, as each applies it as its own field manager ([`lease_field_manager`]).
pub async fn elect(
    client: Client,
    namespace: &str,
    lease_name: &str,
    identity: String,
    own_pod: Option<String>,
    tasks: &mut Tasks,
) -> Result<Leadership, kube_lease_manager::LeaseManagerError> {
    let spec = ManagerSpec { client: client.clone(), namespace: namespace.to_string(), lease_name: lease_name.to_string(), identity };
    let manager = spec.build().await?;
    let (tx, rx) = watch::channel(false);
    let task = LeaseTask { spec, manager, tx, manager_leads: false, leading: false, renewal: RenewalSeen::default() };
    let stop = tasks.stop_token();
    let deleted = own_pod_deleted(client, namespace.to_string(), own_pod);
    tasks.spawn("lease", task.run(stop, deleted));
    Ok(Leadership::elected(rx))
}

/// What a lease manager is built from: a follower that sees the lease released starts over
/// with a new one.
struct ManagerSpec {
    client: Client,
    namespace: String,
    lease_name: String,
    identity: String,
}

impl ManagerSpec {
    async fn build(&self) -> Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError> {
        kube_lease_manager::LeaseManagerBuilder::new(self.client.clone(), &self.lease_name)
            .with_namespace(&self.namespace)
            .with_field_manager(lease_field_manager(&self.identity))
            .with_identity(&self.identity)
            .with_duration(LEASE_DURATION_SECONDS)
            .with_grace(LEASE_GRACE_SECONDS)
            .build()
            .await
    }

    /// The Lease as it is now, within [`RELEASED_LEASE_CHECK`]: `None` when it is absent or the
    /// read failed or hung (a read that hangs must not hold off a step-down).
    async fn read(&self) -> Option<k8s_openapi::api::coordination::v1::Lease> {
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = kube::Api::namespaced(self.client.clone(), &self.namespace);
        tokio::time::timeout(RELEASED_LEASE_CHECK, leases.get_opt(&self.lease_name)).await.ok().and_then(Result::ok).flatten()
    }
}

/// The lease task's state: what the lease manager says (`manager_leads`) and what this replica
/// publishes (`leading`: the manager leads and a renewal was seen lately).
struct LeaseTask {
    spec: ManagerSpec,
    manager: kube_lease_manager::LeaseManager,
    tx: watch::Sender<bool>,
    manager_leads: bool,
    leading: bool,
    renewal: RenewalSeen,
}

impl LeaseTask {
    async fn run(mut self, stop: tokio_util::sync::CancellationToken, deleted: impl Future<Output = ()>) {
        tokio::pin!(deleted);
        let mut check = tokio::time::interval(RELEASED_LEASE_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = &mut deleted => {
                    tracing::info!("this replica's pod is being deleted: releasing the lease");
                    self.release("").await;
                    // a task that ends stops the process: serve out the preStop sleep
                    stop.cancelled().await;
                    return;
                }
                r = self.manager.changed() => self.manager_changed(r).await,
                _ = check.tick() => self.check().await,
            }
        }
        self.release(" on shutdown").await;
    }

    fn publish(&mut self, now: bool) {
        if self.leading != now {
            tracing::info!(leading = now, "leadership changed");
            self.leading = now;
            self.tx.send_replace(now);
        }
    }

    /// Stops leading and gives the lease back; `when` completes the log line.
    async fn release(&mut self, when: &str) {
        self.publish(false);
        if let Err(e) = self.manager.release().await {
            tracing::warn!(error = %e, "cannot release the lease{when}; it expires on its own");
        }
    }

    async fn manager_changed(&mut self, r: Result<bool, kube_lease_manager::LeaseManagerError>) {
        match r {
            Ok(now) => {
                tracing::info!(leading = now, "lease state changed");
                self.manager_leads = now;
                if now {
                    self.renewal.acquired(Instant::now());
                }
                self.publish(now && self.renewal.fresh(Instant::now()));
            }
            Err(e) => {
                // keeps the last state, as kube-lease-manager's own watch loop does
                tracing::warn!(error = %e, "lease check failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    /// Every [`RELEASED_LEASE_CHECK`]: a leader looks for its renewals and steps down without
    /// them; a follower starts over with a new manager when the lease was released.
    async fn check(&mut self) {
        if self.manager_leads {
            if let Some(lease) = self.spec.read().await {
                self.renewal.observe(&lease, &self.spec.identity, Instant::now());
            }
            let fresh = self.renewal.fresh(Instant::now());
            if !fresh && self.leading {
                tracing::warn!("no renewal of this replica's lease seen for {} s: not leading until one is", LEADER_STEP_DOWN.as_secs());
            }
            self.publish(fresh);
            return;
        }
        if self.spec.read().await.is_some_and(|l| released(&l)) {
            match self.spec.build().await {
                Ok(m) => {
                    tracing::info!("the lease was released: competing for it now");
                    self.manager = m;
                }
                Err(e) => tracing::warn!(error = %e, "cannot rebuild the lease manager; waiting for the lease to expire"),
            }
        }
    }
}

/// True when `lease` has no holder (released: kube-lease-manager clears `holderIdentity`).
fn released(lease: &k8s_openapi::api::coordination::v1::Lease) -> bool {
    lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).is_none_or(str::is_empty)
}

/// The server-side-apply field manager of `identity`'s lease writes:
/// `safe-termination-lease-<identity>`, at most 128 bytes (the API server's limit on a field
/// manager; a longer identity is cut at a character boundary, which pod names never need).
///
/// It must differ per replica. kube-lease-manager takes an orphaned lease with a non-forced
/// apply of `holderIdentity` and relies on the API server's 409 conflict, which only a
/// different manager's apply gets: with one manager shared by all replicas, two followers that
/// woke together both "took" the lease, and both wrote status until the loser's next renewal
/// (up to a renewal period; seen in tests/e2e_operator_pods.rs t3 as overlapping status writers).
pub fn lease_field_manager(identity: &str) -> String {
    let mut m = format!("safe-termination-lease-{identity}");
    let mut end = m.len().min(128);
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    m.truncate(end);
    m
}

/// Resolves once Pod `pod` in `namespace` carries a deletionTimestamp (checked every second;
/// a list with a field selector, which the chart's `pods: list` rule allows). Never resolves
/// without a pod name (out of cluster).
async fn own_pod_deleted(client: Client, namespace: String, pod: Option<String>) {
    let Some(pod) = pod else { return std::future::pending().await };
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, &namespace);
    let lp = kube::api::ListParams::default().fields(&format!("metadata.name={pod}"));
    loop {
        if let Ok(list) = api.list_metadata(&lp).await
            && list.items.iter().any(|p| p.metadata.deletion_timestamp.is_some())
        {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::lease_field_manager;

    #[test]
    fn each_replica_applies_its_lease_as_its_own_field_manager() {
        assert_eq!(lease_field_manager("st-7d9f-abcde"), "safe-termination-lease-st-7d9f-abcde");
        assert_ne!(lease_field_manager("a"), lease_field_manager("b"));
        let long = lease_field_manager(&"é".repeat(100));
        assert!(long.len() <= 128 && long.len() >= 127, "{}", long.len());
        assert!(long.starts_with("safe-termination-lease-éé"));
    }
}

#[cfg(test)]
mod renewal_tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: &str, renewed_at_second: i64) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::from_second(renewed_at_second).unwrap())),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_leader_that_sees_no_renewal_steps_down_before_the_lease_expires_for_others() {
        let t0 = Instant::now();
        let mut seen = RenewalSeen::default();
        assert!(!seen.fresh(t0), "no renewal seen yet");
        seen.acquired(t0);
        assert!(seen.fresh(t0 + Duration::from_secs(24)));
        assert!(!seen.fresh(t0 + LEADER_STEP_DOWN), "stepped down at {} s", LEADER_STEP_DOWN.as_secs());
        assert!(LEADER_STEP_DOWN + RELEASED_LEASE_CHECK < Duration::from_secs(LEASE_DURATION_SECONDS), "room for the read period");
        assert!(
            Duration::from_secs(LEASE_DURATION_SECONDS - LEASE_GRACE_SECONDS) + RELEASED_LEASE_CHECK < LEADER_STEP_DOWN,
            "a normal renewal is seen in time"
        );
    }

    #[test]
    fn only_a_new_renew_time_of_its_own_lease_counts() {
        let t0 = Instant::now();
        let mut seen = RenewalSeen::default();
        seen.observe(&lease("me", 100), "me", t0);
        assert!(seen.fresh(t0 + Duration::from_secs(20)));
        // the same renewTime read again 20 s later is no renewal
        seen.observe(&lease("me", 100), "me", t0 + Duration::from_secs(20));
        assert!(!seen.fresh(t0 + Duration::from_secs(26)));
        // another holder's renewal is not ours
        seen.observe(&lease("other", 130), "me", t0 + Duration::from_secs(30));
        assert!(!seen.fresh(t0 + Duration::from_secs(31)));
        seen.observe(&lease("me", 140), "me", t0 + Duration::from_secs(40));
        assert!(seen.fresh(t0 + Duration::from_secs(41)));
    }
}
