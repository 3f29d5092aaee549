//! Fills a cluster with Services and EndpointSlices for the operator's memory benchmark
//! (results in docs/benchmarks/memory.md "Operator memory"; driven by
//! `bench/operator-memory.sh`).
//!
//! Creates `--services` Services spread over `--namespaces` namespaces `bench-<i>`, each with a
//! selector `app: s<i>` and one TCP port, plus one EndpointSlice per Service with
//! `--endpoints-per-service` ready endpoints shaped like the EndpointSlice controller's (address,
//! conditions, nodeName, zone, targetRef to a pod). The slices are labelled
//! `endpointslice.kubernetes.io/managed-by: safe-termination-bench`, so the controller leaves
//! them alone (it adds its own empty slice per selector Service, as in a real cluster with no
//! pods behind the Service yet). Already existing objects are kept (409 is not an error), so a
//! second run only fills the gaps.
//!
//! ```text
//! KUBECONFIG=... cargo run --release --example populate_services -- \
//!     [--services 10000] [--endpoints-per-service 10] [--namespaces 20] [--concurrency 48] [--only-namespace K]
//! ```
//!
//! `--only-namespace K` creates only the objects of namespace `bench-K` (Service i goes to
//! `bench-<i mod namespaces>`): the churn step of the benchmark re-creates one namespace's
//! Services after deleting them.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use serde_json::json;
use std::time::Instant;

/// Flags (see the module docs).
#[derive(clap::Parser)]
struct Args {
    /// Services to create.
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Endpoints in each Service's EndpointSlice.
    #[arg(long, default_value_t = 10)]
    endpoints_per_service: usize,
    /// Namespaces `bench-<i>` the Services are spread over.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    namespaces: u32,
    /// Create requests in flight.
    #[arg(long, default_value_t = 48, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Only the objects of namespace `bench-K`.
    #[arg(long)]
    only_namespace: Option<usize>,
}

/// Creates `obj`; an AlreadyExists answer counts as done. Returns 1 when created.
async fn create<K>(api: &Api<K>, obj: &K) -> Result<usize, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(1),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(0),
        Err(e) => Err(e),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = <Args as clap::Parser>::parse();
    let (services, per_service, namespaces, concurrency, only) =
        (args.services, args.endpoints_per_service, args.namespaces as usize, args.concurrency as usize, args.only_namespace);
    let client = kube::Client::try_default().await?;
    let started = Instant::now();

    let ns_api: Api<Namespace> = Api::all(client.clone());
    for n in 0..namespaces {
        let ns: Namespace = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("bench-{n}")}}))?;
        create(&ns_api, &ns).await?;
    }

    let results: Vec<Result<usize, kube::Error>> = futures::stream::iter((0..services).filter(|i| only.is_none_or(|k| i % namespaces == k)))
        .map(|i| {
            let client = client.clone();
            async move {
                let ns = format!("bench-{}", i % namespaces);
                let name = format!("s{i}");
                let svc: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
                    "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}))
                .expect("a valid Service");
                let endpoints: Vec<serde_json::Value> = (0..per_service)
                    .map(|e| {
                        let k = i * per_service + e;
                        json!({"addresses": [format!("10.{}.{}.{}", 128 + k / 65_536 % 64, k / 256 % 256, k % 256)],
                            "conditions": {"ready": true, "serving": true, "terminating": false},
                            "nodeName": format!("node-{}", k % 100), "zone": format!("zone-{}", k % 3),
                            "targetRef": {"kind": "Pod", "namespace": ns, "name": format!("{name}-{e}-7f9c8d6b5-x2x4z"),
                                "uid": format!("00000000-0000-4000-8000-{k:012}")}})
                    })
                    .collect();
                let slice: EndpointSlice = serde_json::from_value(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": format!("{name}-bench"), "namespace": ns,
                        "labels": {"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": "safe-termination-bench"}},
                    "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": endpoints}))
                .expect("a valid EndpointSlice");
                let created = create(&Api::<Service>::namespaced(client.clone(), &ns), &svc).await?;
                Ok(created + create(&Api::<EndpointSlice>::namespaced(client, &ns), &slice).await?)
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut created = 0;
    for r in results {
        created += r?;
    }
    println!("{services} Services x {per_service} endpoints in {namespaces} namespaces: {created} objects created in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
