//! The leader's certificate task (see the module above): one round reads the Secret, renews
//! what [`decide`] says, writes the Secret and the node agents' Secret, keeps the caBundle
//! current, and copies the serving pair to files out of cluster.

use super::*;
use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the certificate task manages.
#[derive(Debug, Clone)]
pub struct CertConfig {
    /// The Secret's name (in `namespace`).
    pub secret: String,
    /// The operator's namespace.
    pub namespace: String,
    /// The webhook Service's name.
    pub service: String,
    /// More names or IP addresses for the serving certificate (out-of-cluster runs).
    pub extra_sans: Vec<String>,
    /// The MutatingWebhookConfiguration whose caBundle is kept current (none: not patched).
    pub webhook_configuration: Option<String>,
    /// Also write `tls.crt`/`tls.key` to these files (certificate, key).
    pub files: Option<(PathBuf, PathBuf)>,
    /// The node agents' Secret (in `agent_namespace`), kept equal to [`agent_secret_data`]
    /// (none: not written).
    pub agent_secret: Option<String>,
    /// Namespace of the node agents' Secret (none: `namespace`). The agents need the
    /// `privileged` Pod Security level (`hostNetwork`), so they may run in a namespace of their
    /// own, and a pod can only mount a Secret of its namespace.
    pub agent_namespace: Option<String>,
    /// Lifetime of a new CA.
    pub ca_validity: Duration,
    /// Lifetime of a new serving certificate.
    pub serving_validity: Duration,
    /// Time between checks.
    pub interval: Duration,
}

impl CertConfig {
    /// A configuration with the default lifetimes and a 60 s check interval.
    pub fn new(secret: &str, namespace: &str, service: &str) -> Self {
        Self {
            secret: secret.into(),
            namespace: namespace.into(),
            service: service.into(),
            extra_sans: Vec::new(),
            webhook_configuration: None,
            files: None,
            agent_secret: None,
            agent_namespace: None,
            ca_validity: CA_VALIDITY,
            serving_validity: SERVING_VALIDITY,
            interval: Duration::from_secs(60),
        }
    }
}

/// A certificate problem.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The API call failed.
    #[error("{0}")]
    Kube(#[from] kube::Error),
    /// A certificate could not be generated.
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// Another writer changed the Secret between our read and our write; retried next round.
    #[error("Secret {0} changed while we renewed it; retrying")]
    Conflict(String),
    /// A patch could not be built (a bug).
    #[error("internal error: {0}")]
    Internal(String),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What one [`reconcile_once`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The decision: the first renewal made (a requested CA rotation, or [`decide`]'s), or
    /// `Keep`.
    pub action: Action,
    /// When the next renewal is due (Unix seconds), once everything is current.
    pub renew_at: Option<i64>,
    /// The Secret was created or replaced.
    pub secret_written: bool,
    /// Webhooks whose caBundle was patched.
    pub ca_bundle_patched: usize,
    /// The node agents' Secret ([`CertConfig::agent_secret`]) was created or replaced.
    pub agent_secret_written: bool,
}

fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data.as_ref().map(|d| d.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect()).unwrap_or_default()
}

/// One leader round: reads the Secret, renews what [`decide`] says, writes the Secret (create,
/// or replace at the read resourceVersion: a concurrent writer makes it a
/// [`CertError::Conflict`]), and keeps the webhook configuration's caBundle equal to `ca.crt`
/// (a CA rotation patches the caBundle first).
pub async fn reconcile_once(client: &Client, cfg: &CertConfig) -> Result<Outcome, CertError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let existing = api.get_opt(&cfg.secret).await?;
    let current = existing.as_ref().map(secret_data).unwrap_or_default();
    let names = subject_alt_names(&cfg.service, &cfg.namespace, &cfg.extra_sans);
    let now = unix_now();
    let requested = existing.as_ref().and_then(|s| rotation_requested(s.metadata.annotations.as_ref()));
    // a usable Secret rotates on request; an unusable one is renewed as decide says anyway
    let first = requested
        .as_ref()
        .filter(|_| existing.is_some() && observe(&current).ca.is_ok())
        .map(|token| Action::RenewCa(format!("rotation requested ({ANNOTATION_ROTATE_CA}={token})")));
    let (actions, data) = renew_all(&current, existing.is_some(), first, &names, now, cfg.ca_validity, cfg.serving_validity)?;
    let new_ca = actions.iter().any(|a| matches!(a, Action::RenewCa(_)));
    let mut patched = 0;
    if new_ca {
        // trust the new CA before any replica can serve a leaf it signed
        patched += patch_ca_bundle(client, cfg, &data).await?;
    }
    let mut written = false;
    if data != current || existing.is_none() {
        for action in &actions {
            if let Action::RenewCa(why) | Action::RenewServing(why) | Action::RenewAgent(why) = action {
                tracing::info!(secret = %cfg.secret, namespace = %cfg.namespace, reason = %why, new_ca = matches!(action, Action::RenewCa(_)), "renewing the operator's certificates");
            }
        }
        let bytes = data.iter().map(|(k, v)| (k.clone(), ByteString(v.clone()))).collect();
        match existing {
            None => create_secret(&api, &cfg.secret, &cfg.namespace, bytes).await?,
            Some(mut secret) => {
                if let (Some(token), true) = (&requested, new_ca) {
                    secret.metadata.annotations.get_or_insert_with(Default::default).insert(ANNOTATION_ROTATED_CA.into(), token.clone());
                }
                secret.data = Some(bytes);
                replace_secret(&api, &cfg.secret, secret).await?;
            }
        }
        written = true;
    }
    if !new_ca {
        // also repairs a caBundle something else reset
        patched += patch_ca_bundle(client, cfg, &data).await?;
    }
    let agent_secret_written = match (&cfg.agent_secret, agent_secret_data(&data)) {
        (Some(name), Some(want)) => {
            let namespace = cfg.agent_namespace.as_deref().unwrap_or(&cfg.namespace);
            write_agent_secret(&Api::namespaced(client.clone(), namespace), name, namespace, want).await?
        }
        _ => false,
    };
    let action = actions.first().cloned().unwrap_or(Action::Keep { renew_at: now });
    let renew_at = match actions.last() {
        Some(Action::Keep { renew_at }) => Some(*renew_at),
        _ => None,
    };
    Ok(Outcome { action, renew_at, secret_written: written, ca_bundle_patched: patched, agent_secret_written })
}

/// Creates Secret `name` (type `kubernetes.io/tls`, labelled as managed by safe-termination)
/// holding `data`; an existing one is a [`CertError::Conflict`].
async fn create_secret(api: &Api<Secret>, name: &str, namespace: &str, data: BTreeMap<String, ByteString>) -> Result<(), CertError> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some([("app.kubernetes.io/managed-by".to_string(), "safe-termination".to_string())].into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    };
    let pp = PostParams { dry_run: false, field_manager: Some(FIELD_MANAGER.into()) };
    match api.create(&pp, &secret).await {
        Err(kube::Error::Api(s)) if s.code == 409 => Err(CertError::Conflict(name.to_string())),
        r => r.map(|_| ()).map_err(CertError::from),
    }
}

/// Replaces Secret `name` with `secret` at the resourceVersion it was read at (a concurrent
/// writer makes it a [`CertError::Conflict`]).
async fn replace_secret(api: &Api<Secret>, name: &str, mut secret: Secret) -> Result<(), CertError> {
    secret.string_data = None;
    let pp = PostParams { dry_run: false, field_manager: Some(FIELD_MANAGER.into()) };
    match api.replace(name, &pp, &secret).await {
        Err(kube::Error::Api(s)) if s.code == 409 => Err(CertError::Conflict(name.to_string())),
        r => r.map(|_| ()).map_err(CertError::from),
    }
}

/// Keeps the node agents' Secret `name` equal to `want` ([`agent_secret_data`]): created when
/// missing, replaced when its data differs. Returns whether it wrote.
async fn write_agent_secret(api: &Api<Secret>, name: &str, namespace: &str, want: BTreeMap<String, Vec<u8>>) -> Result<bool, CertError> {
    let existing = api.get_opt(name).await?;
    if existing.as_ref().map(secret_data).as_ref() == Some(&want) {
        return Ok(false);
    }
    let bytes = want.into_iter().map(|(k, v)| (k, ByteString(v))).collect();
    match existing {
        None => create_secret(api, name, namespace, bytes).await?,
        Some(mut secret) => {
            secret.data = Some(bytes);
            replace_secret(api, name, secret).await?;
        }
    }
    tracing::info!(secret = %name, namespace = %namespace, "node agents' certificate Secret written");
    Ok(true)
}

/// Patches the configured webhook configuration's caBundle to `data[ca.crt]`; returns how many
/// webhooks changed (0 when none is configured, it does not exist yet, or all are current).
async fn patch_ca_bundle(client: &Client, cfg: &CertConfig, data: &BTreeMap<String, Vec<u8>>) -> Result<usize, CertError> {
    let (Some(name), Some(ca)) = (cfg.webhook_configuration.as_deref(), data.get(CA_CERT)) else { return Ok(0) };
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let Some(config) = api.get_opt(name).await? else {
        tracing::warn!(webhook_configuration = name, "MutatingWebhookConfiguration not found: caBundle not patched yet");
        return Ok(0);
    };
    let ops = ca_bundle_patch(&config, &base64::engine::general_purpose::STANDARD.encode(ca));
    if ops.is_empty() {
        return Ok(0);
    }
    let n = ops.len() / 2;
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops)).map_err(|e| CertError::Internal(e.to_string()))?;
    api.patch(name, &PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &Patch::<()>::Json(patch)).await?;
    tracing::info!(webhook_configuration = name, webhooks = n, "caBundle patched");
    Ok(n)
}

/// Writes `content` to `path` if it differs, by a rename of a temporary file in the same
/// directory (a reader never sees half a file). Returns whether it wrote.
pub fn write_if_changed(path: &Path, content: &[u8]) -> Result<bool, CertError> {
    if std::fs::read(path).is_ok_and(|old| old == content) {
        return Ok(false);
    }
    let io = |source| CertError::Io { path: path.to_path_buf(), source };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!(".{}.tmp-{}", path.file_name().and_then(|n| n.to_str()).unwrap_or("cert"), std::process::id()));
    {
        use std::io::Write as _;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(&tmp).map_err(io)?;
        f.write_all(content).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(true)
}

/// Copies `tls.crt`/`tls.key` from the Secret to the configured files (`--write-cert-files`).
/// Returns whether a file changed (false when the Secret does not exist yet).
pub async fn sync_files(client: &Client, cfg: &CertConfig) -> Result<bool, CertError> {
    let Some((cert_path, key_path)) = &cfg.files else { return Ok(false) };
    let api: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let Some(secret) = api.get_opt(&cfg.secret).await? else { return Ok(false) };
    let data = secret_data(&secret);
    let (Some(cert), Some(key)) = (data.get(TLS_CERT), data.get(TLS_KEY)) else { return Ok(false) };
    // key first: a reader that sees the new certificate with the old key rejects the pair and
    // retries on the next change, which the certificate write is
    let k = write_if_changed(key_path, key)?;
    let c = write_if_changed(cert_path, cert)?;
    Ok(k || c)
}

/// Starts the certificate task in `tasks`: the lease holder writes the Secret; with
/// [`CertConfig::files`], every replica copies it to the files.
pub fn spawn(shared: &crate::runtime::Shared, tasks: &mut crate::runtime::Tasks, cfg: CertConfig) {
    tasks.spawn("certificates", run(shared.client.clone(), cfg, shared.leader.clone(), shared.stop.clone()));
}

/// The certificate task: while this replica leads, [`reconcile_once`] now and every
/// `interval` (sooner at a renewal point); every replica copies the Secret to files when
/// `files` is set. Errors are logged and retried; returns on `stop` (or when the lease
/// channel closes).
pub async fn run(client: Client, cfg: CertConfig, mut leader: watch::Receiver<bool>, stop: CancellationToken) {
    tracing::info!(secret = %cfg.secret, namespace = %cfg.namespace, service = %cfg.service, webhook_configuration = ?cfg.webhook_configuration, write_files = cfg.files.is_some(), "operator-managed webhook certificates");
    loop {
        let mut wait = cfg.interval;
        if *leader.borrow_and_update() {
            match reconcile_once(&client, &cfg).await {
                Ok(o) => {
                    if let Some(renew_at) = o.renew_at {
                        let until = Duration::from_secs(renew_at.saturating_sub(unix_now()).max(1) as u64);
                        wait = wait.min(until);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, secret = %cfg.secret, "webhook certificate check failed; retrying");
                    wait = wait.min(Duration::from_secs(5));
                }
            }
        }
        if cfg.files.is_some() {
            match sync_files(&client, &cfg).await {
                Ok(true) => tracing::info!(secret = %cfg.secret, "webhook certificate files written"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot copy the webhook certificate to its files");
                    wait = wait.min(Duration::from_secs(5));
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            r = leader.changed() => if r.is_err() { return },
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_replaced_atomically_and_only_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tls/tls.crt");
        assert!(write_if_changed(&p, b"one").unwrap());
        assert!(!write_if_changed(&p, b"one").unwrap());
        assert!(write_if_changed(&p, b"two").unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let leftovers: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    }
}
