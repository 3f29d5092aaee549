//! A `/api/v1/query` answer decoded (Prometheus' HTTP API, `web/api/v1/json_codec.go`): the
//! instant vector's float and histogram samples, its numbers read as Go writes them, and every
//! other answer (an error body, another result type, a proxy's page) a [`PrometheusError`]
//! naming the query.

use super::api_histogram::{ApiBucket, ApiHistogram, BoundaryRule};
use super::error::PrometheusError;
use serde::Deserialize;
use std::collections::BTreeMap;

/// One element of an instant vector: a float sample (`value`) or a native histogram sample
/// (`histogram`, with `value` NaN).
#[derive(Debug, Clone, PartialEq)]
pub struct VectorSample {
    /// The series' labels.
    pub labels: BTreeMap<String, String>,
    /// Evaluation time, Unix seconds.
    pub timestamp: f64,
    /// The value (`NaN` and `±Inf` accepted); NaN for a histogram sample.
    pub value: f64,
    /// The native histogram of a histogram sample (the answer's `histogram` field).
    pub histogram: Option<ApiHistogram>,
}

#[derive(Deserialize)]
struct ApiResponse {
    status: String,
    #[serde(default)]
    data: Option<ApiData>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct ApiData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct ApiVectorElement {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    value: Option<(f64, String)>,
    #[serde(default)]
    histogram: Option<(f64, RawHistogram)>,
}

#[derive(Deserialize)]
struct RawHistogram {
    count: String,
    sum: String,
    #[serde(default)]
    buckets: Vec<(u64, String, String, String)>,
}

impl RawHistogram {
    /// The numbers parsed; the message says which one is wrong.
    fn parse(self) -> Result<ApiHistogram, String> {
        let number = |what: &str, s: &str| parse_sample_value(s).ok_or_else(|| format!("histogram {what} {s:?} is not a number"));
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(n, (rule, lower, upper, count))| {
                let rule = BoundaryRule::from_code(*rule).ok_or_else(|| format!("histogram bucket {n}: boundary rule {rule} is not 0..=3"))?;
                let at = |what: &str, s: &str| number(&format!("bucket {n} {what}"), s);
                Ok(ApiBucket { rule, lower: at("lower", lower)?, upper: at("upper", upper)?, count: at("count", count)? })
            })
            .collect::<Result<_, String>>()?;
        Ok(ApiHistogram { count: number("count", &self.count)?, sum: number("sum", &self.sum)?, buckets })
    }
}

/// Parses a Prometheus sample value (`"3"`, `"1.5e3"`, `"NaN"`, `"+Inf"`, `"-Inf"`).
pub fn parse_sample_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// Decodes a `/api/v1/query` answer body into an instant vector. `http_status` is used in
/// error messages; a `"status": "error"` body is an [`PrometheusError::Api`] whatever the
/// status code.
pub fn decode_query_response(query: &str, http_status: u16, body: &str) -> Result<Vec<VectorSample>, PrometheusError> {
    let decode = |message: String| PrometheusError::Decode { query: query.to_string(), message };
    let resp: ApiResponse = match serde_json::from_str(body) {
        Ok(r) => r,
        Err(e) if (200..300).contains(&http_status) => return Err(decode(format!("not Prometheus API JSON: {e}"))),
        Err(_) => {
            let body: String = body.chars().take(200).collect();
            return Err(PrometheusError::Http { query: query.to_string(), http_status, body: body.trim().to_string() });
        }
    };
    if resp.status != "success" {
        return Err(PrometheusError::Api {
            query: query.to_string(),
            error_type: resp.error_type.unwrap_or_else(|| "unknown".into()),
            error: resp.error.unwrap_or_else(|| format!("status {:?}", resp.status)),
            http_status,
        });
    }
    let data = resp.data.ok_or_else(|| decode("status success without data".into()))?;
    if data.result_type != "vector" {
        return Err(decode(format!("resultType {:?}, expected \"vector\"", data.result_type)));
    }
    let elements: Vec<ApiVectorElement> = serde_json::from_value(data.result).map_err(|e| decode(format!("vector result: {e}")))?;
    elements
        .into_iter()
        .enumerate()
        .map(|(n, e)| match (e.value, e.histogram) {
            (Some((timestamp, v)), None) => {
                let value = parse_sample_value(&v).ok_or_else(|| decode(format!("value {v:?} is not a number")))?;
                Ok(VectorSample { labels: e.metric, timestamp, value, histogram: None })
            }
            (None, Some((timestamp, h))) => {
                let h = h.parse().map_err(|m| decode(format!("element {n}: {m}")))?;
                Ok(VectorSample { labels: e.metric, timestamp, value: f64::NAN, histogram: Some(h) })
            }
            (Some(_), Some(_)) => Err(decode(format!("element {n} has both a value and a histogram"))),
            (None, None) => Err(decode(format!("element {n} has neither a value nor a histogram"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_answers() {
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"instance":"10.0.0.1:10249","le":"+Inf"},"value":[1700000000.5,"NaN"]},{"metric":{},"value":[1700000000,"2"]}]}}"#;
        let v = decode_query_response("q", 200, ok).unwrap();
        assert_eq!(v.len(), 2);
        assert!(v[0].value.is_nan());
        assert_eq!(v[0].timestamp, 1700000000.5);
        assert_eq!(v[1].value, 2.0);

        let err = r#"{"status":"error","errorType":"bad_data","error":"1:10: parse error: unexpected identifier"}"#;
        let e = decode_query_response("sum(", 400, err).unwrap_err();
        assert_eq!(e.to_string(), "Prometheus rejected the query \"sum(\": bad_data: 1:10: parse error: unexpected identifier (HTTP 400)");
        let e = decode_query_response("q", 502, "<html>Bad Gateway</html>").unwrap_err();
        assert!(matches!(e, PrometheusError::Http { http_status: 502, .. }), "{e}");
        let e = decode_query_response("q", 200, "{\"status\":\"success\"").unwrap_err();
        assert!(e.to_string().contains("not Prometheus API JSON"), "{e}");
        let m = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(decode_query_response("q", 200, m).unwrap_err().to_string().contains("resultType \"matrix\""));
        let bad = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}"#;
        assert!(decode_query_response("q", 200, bad).unwrap_err().to_string().contains("\"x\" is not a number"));
    }

    #[test]
    fn go_float_strings_read_back_exactly() {
        // strconv.FormatFloat(f, 'e', -1, 64) of 2^-128, kube-proxy's zero threshold
        assert_eq!(parse_sample_value("2.938735877055719e-39"), Some(2f64.powi(-128)));
        // a sum as the capture has it: the shortest string of a float that is not 0.011692241
        assert_eq!(parse_sample_value("0.011692240999999999").unwrap().to_bits(), 0.011692240999999999f64.to_bits());
        assert_ne!(parse_sample_value("0.011692240999999999"), parse_sample_value("0.011692241"));
    }

    #[test]
    fn malformed_histogram_answers_name_the_query() {
        let body = |element: &str| format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{element}]}}}}"#);
        let err = |element: &str| decode_query_response("sum(h)", 200, &body(element)).unwrap_err().to_string();
        let e = err(r#"{"metric":{},"histogram":[1,{"count":"x","sum":"1"}]}"#);
        assert!(e.starts_with("Prometheus query \"sum(h)\": unexpected answer:") && e.contains("histogram count \"x\" is not a number"), "{e}");
        let e = err(r#"{"metric":{},"histogram":[1,{"count":"1","sum":"1","buckets":[[7,"1","2","1"]]}]}"#);
        assert!(e.contains("boundary rule 7 is not 0..=3"), "{e}");
        let e = err(r#"{"metric":{},"histogram":[1,{"count":"1","sum":"1","buckets":[[0,"1","2","z"]]}]}"#);
        assert!(e.contains("bucket 0 count \"z\""), "{e}");
        let e = err(r#"{"metric":{},"histogram":[1,{"count":"1","sum":"1","buckets":[[0,"1","2"]]}]}"#);
        assert!(e.contains("vector result"), "{e}");
        let e = err(r#"{"metric":{},"histogram":[1,{"sum":"1"}]}"#);
        assert!(e.contains("vector result") && e.contains("count"), "{e}");
        assert!(err(r#"{"metric":{},"value":[1,"1"],"histogram":[1,{"count":"0","sum":"0"}]}"#).contains("both a value and a histogram"));
        assert!(err(r#"{"metric":{}}"#).contains("neither a value nor a histogram"));
        // boundary rules by code
        assert_eq!(BoundaryRule::from_code(0), Some(BoundaryRule::OpenLower));
        assert_eq!(BoundaryRule::from_code(1), Some(BoundaryRule::OpenUpper));
        assert_eq!(BoundaryRule::from_code(2), Some(BoundaryRule::Open));
        assert_eq!(BoundaryRule::from_code(3), Some(BoundaryRule::Closed));
        assert_eq!(BoundaryRule::from_code(4), None);
    }
}
