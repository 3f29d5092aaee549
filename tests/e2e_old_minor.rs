//! On an older minor where the native sleep gate is off (Kubernetes 1.29: `PodLifecycleSleepAction`
//! alpha, off), the capability probe finds that the API server drops `lifecycle.preStop.sleep`,
//! and the webhook falls back to `exec sleep N` for allow-listed images and skips the rest:
//! no pod is rejected. Run by `make e2e` on a second cluster started with
//! `ST_K8S_VERSION=1.29.15` (built only with `--features cluster-tests`).

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use safe_termination::cli::mutate::{documents, pod_of};
use safe_termination::controller::probe::{ProbeResult, probe_native_sleep};
use safe_termination::core::crd::TerminationPolicy;
use serde_json::json;

mod common;

#[tokio::test]
async fn gate_off_probe_picks_the_exec_fallback_and_no_pod_is_rejected() {
    let client = common::client().await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "29"), "this test needs the 1.29 cluster");
    let (system, ns, hook) = ("e2e-old-system", "e2e-old", "safe-termination-e2e-old");
    common::apply_crd(&client).await;
    common::own_namespace(&client, system).await;
    common::own_namespace(&client, ns).await;

    // the probe itself: the API server dropped the field and rejected the pod
    match probe_native_sleep(client.clone(), system).await.unwrap() {
        ProbeResult::NoNativeSleep(why) => println!("probe: {why}"),
        ProbeResult::NativeSleep => panic!("1.29 with the gate off must not keep a native sleep"),
    }

    let op = common::Operator::start(system, &["--admission-backend", "auto"]).await;
    // --admission-backend auto (the binary's default): 1.29 serves no MutatingAdmissionPolicy v1
    let metrics = op.metrics().await;
    assert_eq!(
        common::metric_sum(&metrics, "safe_termination_admission_backend", &["backend=\"webhook\""]),
        Some(1.0),
        "auto on 1.29 falls back to the webhook"
    );
    assert_eq!(common::metric_sum(&metrics, "safe_termination_admission_backend", &["backend=\"policy\""]), None);
    common::register_webhook(&client, hook, ns, op.webhook).await;
    let policies: Api<TerminationPolicy> = Api::namespaced(client.clone(), ns);
    let policy: TerminationPolicy = serde_json::from_value(json!({
        "apiVersion": "safetermination.io/v1alpha1", "kind": "TerminationPolicy",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"scope": "AllLongRunning", "preStop": {"execImages": ["busybox*"]}}
    }))
    .unwrap();
    policies.create(&PostParams::default(), &policy).await.unwrap();
    let status = common::wait_policy_status(&client, ns, "web", 60, "the admission backend", |s| s.pointer("/admission/backend").is_some()).await;
    assert_eq!(status.pointer("/admission/backend"), Some(&json!("webhook")));
    assert!(status.pointer("/admission/differences").is_none(), "the webhook has no differences from itself");

    // --admission-backend policy cannot be honoured here: a usage error (exit 2) naming why
    let dir = common::state_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_safe-termination"))
        .args(["run", "--no-leader-election", "--admission-backend", "policy", "--namespace", system])
        .args(["--listen", &format!("127.0.0.1:{}", common::free_port()), "--admin-listen", &format!("127.0.0.1:{}", common::free_port())])
        .args(["--tls-cert-file", &format!("{dir}/pki/webhook.crt"), "--tls-key-file", &format!("{dir}/pki/webhook.key")])
        .env("KUBECONFIG", format!("{dir}/kubeconfig"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "--admission-backend policy on 1.29: {stderr}");
    assert!(stderr.contains("mutatingadmissionpolicies"), "the error names what is missing: {stderr}");

    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // an allow-listed image gets `exec: [sleep, N]` (the webhook saw the probe's answer)
    let busybox: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busybox", "namespace": ns},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}
    }))
    .unwrap();
    common::wait_for("the webhook to inject the exec fallback", 30, async || {
        let pp = PostParams { dry_run: true, ..Default::default() };
        let p = pods.create(&pp, &busybox).await.expect("never rejected");
        p.spec.as_ref().unwrap().containers[0].lifecycle.as_ref().map(|_| ())
    })
    .await;
    let created = pods.create(&PostParams::default(), &busybox).await.expect("never rejected");
    let handler = created.spec.as_ref().unwrap().containers[0].lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap();
    assert!(handler.sleep.is_none(), "no native sleep on 1.29 with the gate off");
    let cmd = handler.exec.as_ref().and_then(|e| e.command.clone()).unwrap();
    assert_eq!(cmd[0], "sleep");
    let secs: i64 = cmd[1].parse().unwrap();
    assert!(secs >= 3 && secs <= created.spec.as_ref().unwrap().termination_grace_period_seconds.unwrap());

    // distroless images are not on the list: admitted unchanged, never with a shell
    for doc in documents("tests/data/pods/kube-state-metrics-distroless-multicontainer.yaml").unwrap() {
        let (mut pod, _) = pod_of(&doc, ns).unwrap();
        pod["metadata"]["name"] = json!("ksm");
        pod["metadata"]["namespace"] = json!(ns);
        // its ServiceAccount is not part of the test: the point is the containers
        if let Some(spec) = pod["spec"].as_object_mut() {
            spec.remove("serviceAccountName");
        }
        let typed: Pod = serde_json::from_value(pod).unwrap();
        let created = pods.create(&PostParams::default(), &typed).await.expect("never rejected");
        for c in &created.spec.as_ref().unwrap().containers {
            assert!(c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()).is_none(), "{}: no hook", c.name);
        }
    }
    drop(op);
    common::cleanup(&client, hook, ns).await;
}
