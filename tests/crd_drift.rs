//! The committed CRD (crds/terminationpolicy.yaml) is generated from src/core/crd.rs: this test fails
//! when it is stale, and checks what `kubectl` users rely on (short name, status subresource,
//! printer columns, a description on every spec field for `kubectl explain`).

use serde_json::Value;
use std::path::Path;

const REGENERATE: &str = "run `cargo run --bin crdgen > crds/terminationpolicy.yaml` and commit the result";

fn generated() -> Value {
    serde_saphyr::from_str(&safe_termination::core::crd::crd_yaml()).expect("generated CRD is YAML")
}

#[test]
fn committed_crd_matches_the_rust_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/terminationpolicy.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}; {REGENERATE}", path.display()));
    let generated = safe_termination::core::crd::crd_yaml();
    if committed != generated {
        let first_diff = committed
            .lines()
            .zip(generated.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .map(|(i, (a, b))| format!("first difference at line {}:\n  committed: {a}\n  generated: {b}", i + 1))
            .unwrap_or_else(|| format!("committed has {} lines, generated {}", committed.lines().count(), generated.lines().count()));
        panic!("crds/terminationpolicy.yaml is stale: {REGENERATE}.\n{first_diff}");
    }
}

#[test]
fn committed_parameters_crd_matches_the_rust_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/terminationparameters.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        committed == safe_termination::core::admission::params::crd_yaml(),
        "crds/terminationparameters.yaml is stale: run `cargo run --bin crdgen terminationparameters > crds/terminationparameters.yaml` and commit the result"
    );
    let crd: Value = serde_saphyr::from_str(&committed).unwrap();
    assert_eq!(crd["metadata"]["name"], "terminationparameters.safetermination.io");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    // the policy's CEL reads these without has(): they must be required
    let required: Vec<&str> = spec["required"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(required, ["defaultPolicies", "namespaces", "nativeSleep"]);
}

#[test]
fn names_scope_and_subresources() {
    let crd = generated();
    assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1");
    assert_eq!(crd["kind"], "CustomResourceDefinition");
    assert_eq!(crd["metadata"]["name"], "terminationpolicies.safetermination.io");
    let spec = &crd["spec"];
    assert_eq!(spec["group"], "safetermination.io");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["kind"], "TerminationPolicy");
    assert_eq!(spec["names"]["plural"], "terminationpolicies");
    assert_eq!(spec["names"]["singular"], "terminationpolicy");
    assert_eq!(spec["names"]["shortNames"], serde_json::json!(["tpol"]));
    let versions = spec["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1);
    let v = &versions[0];
    assert_eq!(v["name"], "v1alpha1");
    assert_eq!(v["served"], true);
    assert_eq!(v["storage"], true);
    assert_eq!(v["subresources"]["status"], serde_json::json!({}));
}

#[test]
fn printer_columns() {
    let crd = generated();
    let cols = crd["spec"]["versions"][0]["additionalPrinterColumns"].as_array().unwrap();
    let got: Vec<(&str, &str, &str, u64)> = cols
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["type"].as_str().unwrap(), c["jsonPath"].as_str().unwrap(), c["priority"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(
        got,
        [
            ("Mode", "string", ".spec.mode", 0),
            ("PreStop", "integer", ".status.recommendation.preStopSeconds", 0),
            ("Grace", "integer", ".status.recommendation.terminationGracePeriodSeconds", 0),
            ("SyncP99", "number", ".status.measurement.syncP99Seconds", 0),
            ("Window", "number", ".status.measurement.propagationWindowSeconds", 1),
            ("CPLagP99", "number", ".status.measurement.controlPlaneLag.p99Seconds", 1),
            ("ObservedP99", "number", ".status.measurement.observedRemovals.p99Seconds", 1),
            ("Covered", "number", ".status.measurement.observedRemovals.coverageRatio", 1),
            ("DataPlanes", "string", ".status.measurement.observedRemovals.dataPlanesSummary", 1),
            ("Waits", "string", ".status.measurement.waits.summary", 1),
            ("ProxyMode", "string", ".status.proxy.mode", 1),
            ("Age", "date", ".metadata.creationTimestamp", 0),
        ]
    );
    // every column points at a field the schema has
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for (name, _, path, _) in got {
        if path.starts_with(".metadata") {
            continue;
        }
        let mut node = schema;
        for part in path.trim_start_matches('.').split('.') {
            node = &node["properties"][part];
            assert!(!node.is_null(), "printer column {name}: {path} is not in the schema");
        }
    }
}

/// Walks every `properties` map under `schema` (through arrays and maps) and collects the paths
/// of properties without a non-empty description.
fn undocumented(path: &str, schema: &Value, out: &mut Vec<String>) {
    if let Some(props) = schema["properties"].as_object() {
        for (name, sub) in props {
            let p = format!("{path}.{name}");
            if sub["description"].as_str().is_none_or(|d| d.trim().is_empty()) {
                out.push(p.clone());
            }
            undocumented(&p, sub, out);
        }
    }
    if schema["items"].is_object() {
        undocumented(&format!("{path}[]"), &schema["items"], out);
    }
    if schema["additionalProperties"].is_object() {
        undocumented(&format!("{path}{{}}"), &schema["additionalProperties"], out);
    }
}

#[test]
fn every_field_has_a_description() {
    let crd = generated();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let root_doc = root["description"].as_str().unwrap();
    assert!(!root_doc.contains("Auto-generated"), "kubectl explain terminationpolicy shows: {root_doc}");
    let mut missing = Vec::new();
    undocumented("spec", &root["properties"]["spec"], &mut missing);
    assert!(missing.is_empty(), "spec fields without a description (kubectl explain): {missing:?}");
    undocumented("status", &root["properties"]["status"], &mut missing);
    assert!(missing.is_empty(), "status fields without a description (kubectl explain): {missing:?}");
    // the walk really visits nested fields
    fn count(schema: &Value, n: &mut usize) {
        if let Some(props) = schema["properties"].as_object() {
            for sub in props.values() {
                *n += 1;
                count(sub, n);
            }
        }
        if schema["items"].is_object() {
            count(&schema["items"], n);
        }
    }
    let mut n = 0;
    count(&root["properties"]["spec"], &mut n);
    assert!(n >= 18, "only {n} spec properties visited");
}

#[test]
fn spec_fields_have_defaults_and_bounds() {
    let crd = generated();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let pre = &spec["preStop"]["properties"];
    for (field, default, min, max) in [
        ("minSeconds", 3.0, 0.0, 3600.0),
        ("maxSeconds", 60.0, 1.0, 3600.0),
        ("defaultSeconds", 10.0, 0.0, 3600.0),
        ("safetyFactor", 1.25, 1.0, 10.0),
        ("extraSeconds", 0.0, 0.0, 3600.0),
        ("minSamples", 5.0, 1.0, 1_000_000.0),
    ] {
        let f = &pre[field];
        assert_eq!(f["default"].as_f64(), Some(default), "preStop.{field} default");
        assert_eq!(f["minimum"].as_f64(), Some(min), "preStop.{field} minimum");
        assert_eq!(f["maximum"].as_f64(), Some(max), "preStop.{field} maximum");
    }
    let grace = &spec["grace"]["properties"];
    assert_eq!(grace["appShutdownSeconds"]["default"].as_f64(), Some(30.0));
    assert_eq!(grace["maxSeconds"]["default"].as_f64(), Some(600.0));
    assert_eq!(grace["maxSeconds"]["maximum"].as_f64(), Some(604800.0));
    assert_eq!(spec["mode"]["enum"], serde_json::json!(["Enforce", "Audit", "Disabled"]));
    assert_eq!(spec["scope"]["enum"], serde_json::json!(["ServiceBacked", "AllLongRunning"]));
    assert_eq!(pre["handler"]["enum"], serde_json::json!(["Auto", "Sleep", "Exec", "Wait"]));
    // the cross-field rules the CLI also checks are enforced by the API server with CEL
    let rules = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"].as_array().unwrap();
    let text: Vec<&str> = rules.iter().map(|r| r["rule"].as_str().unwrap()).collect();
    assert!(text.iter().any(|r| r.contains("minSeconds <= self.spec.preStop.maxSeconds")), "{text:?}");
    assert!(text.iter().any(|r| r.contains("defaultSeconds >= self.spec.preStop.minSeconds")), "{text:?}");
}
