//! Generated pods the API server accepts, over the inputs of the mutation's rules: labels that
//! pick each policy of tests/e2e_admission_policy.rs (several at once: precedence), the opt-out
//! and override annotations, existing hooks of every handler, native sidecars, grace (0 to a
//! week), restart policies, Windows by `os` and by nodeSelector. The policy e2e sends 1,000 of
//! them through both admission backends; tests/webhook_cases.rs checks the mutation's rules on
//! them without a cluster.

use proptest::prelude::*;
use safe_termination::core::annotations::{
    ANNOTATION_AUDIT_PRESTOP_SECONDS, ANNOTATION_POLICY, ANNOTATION_PRESTOP_SECONDS, ANNOTATION_SKIP, ANNOTATION_SKIP_CONTAINERS,
};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

fn lifecycle() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        5 => Just(None),
        2 => (1i64..=30).prop_map(|s| Some(json!({"preStop": {"sleep": {"seconds": s}}}))),
        1 => Just(Some(json!({"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 5"]}}}))),
        1 => Just(Some(json!({"preStop": {"httpGet": {"path": "/drain", "port": 8080}}}))),
        1 => Just(Some(json!({"postStart": {"exec": {"command": ["true"]}}}))),
        1 => Just(Some(json!({}))),
    ]
}

fn container(name: &'static str) -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec![
            "nginx",
            "docker.io/library/nginx:1.27",
            "busybox:1.36",
            "busybox:1.37",
            "gcr.io/distroless/static",
            "mcr.microsoft.com/windows/servercore:ltsc2022",
        ]),
        lifecycle(),
    )
        .prop_map(move |(image, lifecycle)| {
            let mut c = json!({"name": name, "image": image});
            if let Some(l) = lifecycle {
                c["lifecycle"] = l;
            }
            c
        })
}

fn containers() -> impl Strategy<Value = Vec<Value>> {
    prop::sample::subsequence(vec!["app", "web", "istio-proxy", "linkerd-proxy", "sidecar"], 1..4)
        .prop_flat_map(|names| names.into_iter().map(container).collect::<Vec<_>>())
}

pub fn valid_pod() -> impl Strategy<Value = Value> {
    (
        containers(),
        prop::option::weighted(0.25, (container("init"), any::<bool>())),
        prop::sample::select(vec![None, Some(0i64), Some(1), Some(2), Some(3), Some(5), Some(25), Some(30), Some(45), Some(300), Some(604_800)]),
        prop::sample::select(vec![None, Some("Always"), Some("Never"), Some("OnFailure")]),
        prop::sample::select(vec![None, Some("linux"), Some("windows"), Some("nodeSelector")]),
        // label pairs that pick each policy (several at once: precedence)
        prop::sample::subsequence(
            vec![
                ("app", "web"),
                ("app", "worker"),
                ("tier", "fe"),
                ("tier", "batch"),
                ("mode", "audit"),
                ("mode", "off"),
                ("mode", "zero"),
                ("handler", "exec"),
                ("scope", "svc"),
                ("legacy", "x"),
            ],
            0..=3,
        )
        .prop_map(|pairs| pairs.into_iter().collect::<BTreeMap<_, _>>()),
        prop::collection::btree_map(
            prop::sample::select(vec![
                ANNOTATION_SKIP,
                ANNOTATION_SKIP_CONTAINERS,
                ANNOTATION_PRESTOP_SECONDS,
                ANNOTATION_AUDIT_PRESTOP_SECONDS,
                ANNOTATION_POLICY,
                "example.com/other",
            ]),
            prop::sample::select(vec!["true", " TRUE ", "false", "app", "web, sidecar", "app,istio-proxy", "9", "10", ""]),
            0..3,
        ),
    )
        .prop_map(|(mut containers, init, grace, restart, os, labels, annotations)| {
            let mut spec = Map::new();
            // an existing sleep longer than the grace period is invalid: keep the input valid
            let g = grace.unwrap_or(30);
            for c in &mut containers {
                if let Some(s) = c.pointer("/lifecycle/preStop/sleep/seconds").and_then(Value::as_i64)
                    && s > g
                {
                    c["lifecycle"]["preStop"]["sleep"]["seconds"] = json!(g);
                }
            }
            spec.insert("containers".into(), Value::Array(containers));
            if let Some((mut c, sidecar)) = init {
                if let Some(l) = c.get_mut("lifecycle")
                    && !sidecar
                {
                    // only native sidecars may have a lifecycle among init containers
                    *l = Value::Null;
                    c.as_object_mut().unwrap().remove("lifecycle");
                }
                if sidecar {
                    c["restartPolicy"] = json!("Always");
                }
                spec.insert("initContainers".into(), json!([c]));
            }
            if let Some(g) = grace {
                spec.insert("terminationGracePeriodSeconds".into(), json!(g));
            }
            if let Some(r) = restart {
                spec.insert("restartPolicy".into(), json!(r));
            }
            match os {
                Some("nodeSelector") => {
                    spec.insert("nodeSelector".into(), json!({"kubernetes.io/os": "windows"}));
                }
                Some(os) => {
                    spec.insert("os".into(), json!({"name": os}));
                }
                None => {}
            }
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "gen", "labels": labels, "annotations": annotations},
                "spec": spec,
            })
        })
}
