//! The operator's webhook where pods on the real nodes reach it, for the preStop `Wait` handler's
//! tests (tests/e2e_wait.rs, the experiment's wait runs): on the host end of the first real
//! node's veth (an address of the test cluster's own), behind a selector-less Service `st-wait`
//! with a serving certificate for `st-wait.<ns>.svc` and that address signed by the cluster's CA
//! (openssl), and the waiter's image `st.local/waiter:1` (e2e/cluster/build-images.sh).
//!
//! A node's network namespace routes only to its own host end (e2e/cluster/nodes.sh), so the
//! Service has `internalTrafficPolicy: Local` and one endpoint per real node, the host end of
//! that node's veth, with its `nodeName`: each node's data plane sends its pods to its own. On
//! every node but the first, a relay of this test (a TCP copy, TLS passing through) forwards
//! from there to the operator.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;
use std::path::PathBuf;

/// The image the init container copies the waiter from (e2e/cluster/build-images.sh).
pub const WAITER_IMAGE: &str = "st.local/waiter:1";

/// The Service and certificate, and the operator flags that go with them.
pub struct WaitEndpoint {
    /// The address the operator's webhook listens on.
    pub ip: String,
    /// Its port.
    pub port: u16,
    /// The serving certificate and key.
    pub tls: (PathBuf, PathBuf),
    /// `--webhook-service st-wait --wait-ca-file <the cluster's CA> --wait-image st.local/waiter:1
    /// --wait-listen <ip>:<its port>`.
    pub operator_args: Vec<String>,
    namespace: String,
    relays: Vec<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for WaitEndpoint {
    fn drop(&mut self) {
        for r in &self.relays {
            r.abort();
        }
    }
}

/// The host end of `node`'s veth (`10.x.y.1` beside the node's `10.x.y.2`), after checking that
/// it is an address of this host (the cluster is up).
pub fn host_ip_of(node: &super::rules::RealNode) -> String {
    let (prefix, _) = node.ip.rsplit_once('.').expect("an IPv4 node address");
    let ip = format!("{prefix}.1");
    let addrs = String::from_utf8(std::process::Command::new("ip").args(["-o", "-4", "addr", "show"]).output().unwrap().stdout).unwrap();
    assert!(addrs.contains(&format!(" {ip}/")), "{ip} (the host end of {}'s veth) is not an address of this host: is the cluster up?", node.name);
    ip
}

/// Forwards every connection to `listen` (ip:port) to `to`, until dropped.
async fn relay(listen: String, to: String) -> tokio::task::JoinHandle<()> {
    let l = tokio::net::TcpListener::bind(&listen).await.unwrap_or_else(|e| panic!("relay on {listen}: {e}"));
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = l.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

/// A serving certificate for `DNS:<service>.<ns>.svc` and `IP:<ip>` signed by the cluster's CA
/// (openssl): (cert, key) files in `dir`.
pub fn mint_certificate(dir: &std::path::Path, service: &str, ns: &str, ip: &str) -> (PathBuf, PathBuf) {
    let pki = format!("{}/pki", super::state_dir());
    let (key, csr, crt, ext) = (dir.join("tls.key"), dir.join("tls.csr"), dir.join("tls.crt"), dir.join("ext.cnf"));
    std::fs::write(&ext, format!("subjectAltName=DNS:{service}.{ns}.svc,IP:{ip}\nextendedKeyUsage=serverAuth\n")).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let p = |p: &PathBuf| p.to_str().unwrap().to_string();
    run(&["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", &p(&key), "-subj", "/CN=st-wait", "-out", &p(&csr)]);
    run(&[
        "x509",
        "-req",
        "-in",
        &p(&csr),
        "-CA",
        &format!("{pki}/ca.crt"),
        "-CAkey",
        &format!("{pki}/ca.key"),
        "-CAcreateserial",
        "-CAserial",
        &p(&dir.join("ca.srl")),
        "-days",
        "1",
        "-out",
        &p(&crt),
        "-extfile",
        &p(&ext),
    ]);
    (crt, key)
}

impl WaitEndpoint {
    /// Mints the certificate and creates the Service `st-wait` and its EndpointSlice in
    /// `namespace` (the operator's).
    pub async fn create(client: &Client, namespace: &str) -> WaitEndpoint {
        let nodes = super::rules::real_nodes();
        let ip = host_ip_of(&nodes[0]);
        // the webhook's port, and the waiter endpoint's own (--wait-listen)
        let (port, wait_port) = (super::free_port(), super::free_port());
        let mut relays = Vec::new();
        let mut endpoints = vec![json!({"addresses": [ip], "nodeName": nodes[0].name, "conditions": {"ready": true}})];
        for n in &nodes[1..] {
            let host = host_ip_of(n);
            relays.push(relay(format!("{host}:{wait_port}"), format!("{ip}:{wait_port}")).await);
            endpoints.push(json!({"addresses": [host], "nodeName": n.name, "conditions": {"ready": true}}));
        }
        let dir = tempfile::tempdir().unwrap();
        let tls = mint_certificate(dir.path(), "st-wait", namespace, &ip);
        let svc: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "st-wait", "namespace": namespace},
            "spec": {"internalTrafficPolicy": "Local", "ports": [{"name": "wait", "port": 8444, "targetPort": wait_port}]}}))
        .unwrap();
        let _ = Api::<Service>::namespaced(client.clone(), namespace).delete("st-wait", &Default::default()).await;
        Api::<Service>::namespaced(client.clone(), namespace).create(&PostParams::default(), &svc).await.unwrap();
        let slice: EndpointSlice = serde_json::from_value(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "st-wait-1", "namespace": namespace, "labels": {"kubernetes.io/service-name": "st-wait", "endpointslice.kubernetes.io/managed-by": "e2e"}},
            "addressType": "IPv4", "ports": [{"name": "wait", "port": wait_port, "protocol": "TCP"}],
            "endpoints": endpoints}))
        .unwrap();
        let _ = Api::<EndpointSlice>::namespaced(client.clone(), namespace).delete("st-wait-1", &Default::default()).await;
        Api::<EndpointSlice>::namespaced(client.clone(), namespace).create(&PostParams::default(), &slice).await.unwrap();
        let ca = format!("{}/pki/ca.crt", super::state_dir());
        let listen = format!("{ip}:{wait_port}");
        let operator_args =
            ["--webhook-service", "st-wait", "--wait-ca-file", &ca, "--wait-image", WAITER_IMAGE, "--wait-listen", &listen].map(String::from).to_vec();
        WaitEndpoint { ip, port, tls, operator_args, namespace: namespace.to_string(), relays, _dir: dir }
    }

    /// Starts the operator in `namespace` listening here with a rolling window of
    /// `window_seconds`, with `extra` flags (which must hold [`WaitEndpoint::operator_args`]).
    pub async fn start_operator(&self, namespace: &str, window_seconds: u64, extra: &[&str]) -> super::operator::Operator {
        super::operator::Operator::start_listening(namespace, &self.ip, self.port, self.tls.clone(), window_seconds, extra).await
    }

    /// The webhook's URL for the API server.
    pub fn mutate_url(&self) -> String {
        format!("https://{}:{}/mutate", self.ip, self.port)
    }

    /// Deletes the Service (its EndpointSlice goes with it: garbage collection does not, so both).
    pub async fn delete(&self, client: &Client) {
        let _ = Api::<Service>::namespaced(client.clone(), &self.namespace).delete("st-wait", &Default::default()).await;
        let _ = Api::<EndpointSlice>::namespaced(client.clone(), &self.namespace).delete("st-wait-1", &Default::default()).await;
    }
}
