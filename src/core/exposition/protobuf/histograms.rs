//! One of our histogram families from its `Metric` messages (the module docs of [`super`],
//! "What is read" and "Our histograms"): each series' classic buckets and native parts read
//! and checked, the classic buckets summed per bound across series, the native series kept
//! apart; native or classic as Prometheus decides, integer deltas made absolute counts.

use super::framing::ProtobufError;
use super::wire::{self, series_key, series_name};
use crate::core::exposition::histogram::{Bucket, Histogram, HistogramError};
use crate::core::exposition::native::{NativeHistogram, NativeParts, Span};
use crate::core::exposition::scrape::{HistogramFamily, KubeProxyScrape, check_duration_bound};

/// One of our histogram families, across the messages and series that carry it.
#[derive(Default)]
pub(super) struct HistAcc {
    /// Every series' classic buckets, in seconds, for [`Histogram::new`] to sum per bound.
    buckets: Vec<Bucket>,
    /// Sum of `sample_sum` over series, seconds; `None` when no series had one.
    sum: Option<f64>,
    /// The native series (labels, histogram).
    native: Vec<(String, NativeHistogram)>,
    /// Series seen, and their keys (a series twice is an error).
    series_count: usize,
    keys: std::collections::HashSet<String>,
    /// Ordinal and offset of the last message of the family, for errors of the whole family.
    pub(super) last: (usize, usize),
}

impl HistAcc {
    /// Checks and takes the series of one message of family `fam`.
    pub(super) fn add(&mut self, fam: HistogramFamily, metrics: &[wire::Metric]) -> Result<(), String> {
        for (n, m) in metrics.iter().enumerate() {
            let key = series_key(&m.label);
            let which = if m.label.is_empty() { String::new() } else { format!(" (series {{{key}}})") };
            let Some(h) = m.histogram.as_ref() else {
                return Err(format!("series {} has no histogram", series_name(n, &m.label)));
            };
            if !self.keys.insert(key.clone()) {
                return Err(format!("series {} appears twice", series_name(n, &m.label)));
            }
            self.series_count += 1;
            // a float count that is NaN, infinite or negative is refused wherever it sits, also
            // where it would not be used (an integer histogram's `sample_count_float` of NaN is
            // not "above 0", so it would otherwise be skipped without a word)
            for (what, f) in [("sample_count_float", h.sample_count_float), ("zero_count_float", h.zero_count_float)] {
                count_of(what, None, f).map_err(|e| format!("{e}{which}"))?;
            }
            let native = native_parts(h).map_err(|e| format!("native histogram{which}: {e}"))?;
            if native.is_none() || !h.bucket.is_empty() {
                let buckets = classic_buckets(h).map_err(|e| format!("{e}{which}"))?;
                for (le, _) in &buckets {
                    check_duration_bound(&format!("bucket le=\"{le:e}\"{which}"), le * fam.to_seconds())?;
                }
                self.buckets.extend(buckets.into_iter().map(|(le, count)| Bucket { upper_bound_seconds: le * fam.to_seconds(), count }));
            }
            if let Some(parts) = native {
                let hist = NativeHistogram::new(parts).map_err(|e| format!("native histogram{which}: {e}"))?;
                check_duration_native(&hist).map_err(|e| format!("native histogram{which}: {e}"))?;
                self.native.push((key, hist));
            }
            if let Some(sum) = h.sample_sum {
                self.sum = Some(self.sum.unwrap_or(0.0) + sum * fam.to_seconds());
            }
        }
        Ok(())
    }
}

/// Each family's classic histogram (its buckets summed per bound) set in `scrape`, the legacy
/// microsecond sync family only where the sync family is absent; returns each family's native
/// series, kept only when every series of the family is native.
///
/// Errors: a family whose buckets make no histogram, at its last message.
pub(super) fn finish_histograms(mut acc: [Option<HistAcc>; 5], scrape: &mut KubeProxyScrape) -> Result<[Vec<(String, NativeHistogram)>; 5], ProtobufError> {
    let mut native: [Vec<(String, NativeHistogram)>; 5] = Default::default();
    for fam in HistogramFamily::ALL {
        let Some(a) = acc[fam.index()].take() else { continue };
        let (index, offset) = a.last;
        let classic = match Histogram::new(a.buckets, a.sum) {
            Ok(h) => Some(h),
            Err(HistogramError::Empty) => None, // native-only series: no classic histogram
            Err(e) => return Err(ProtobufError { message_index: index, offset, family: fam.name().to_string(), message: e.to_string() }),
        };
        if a.series_count > 0 && a.native.len() == a.series_count {
            native[fam.index()] = a.native;
        }
        if let Some(classic) = classic {
            scrape.set_classic(fam, classic);
        }
    }
    Ok(native)
}

/// A native histogram of durations: no observation below 0 (Prometheus' negative buckets hold
/// them) and no bound above [`super::scrape::MAX_DURATION_SECONDS`] (the zero threshold, and the upper bound
/// of every bucket that holds an observation: a bucket index that overflows gives an infinite
/// one).
fn check_duration_native(h: &NativeHistogram) -> Result<(), String> {
    let below_zero: f64 = h.negative().iter().map(|b| b.1).sum();
    if below_zero > 0.0 {
        return Err(format!("its negative buckets hold {below_zero} observations: a duration is never below 0"));
    }
    check_duration_bound("the zero threshold", h.zero_threshold())?;
    match h.highest_positive_upper_bound() {
        Some(top) if !top.is_finite() => Err("a bucket holding observations has an infinite upper bound (its index overflows the schema's range)".into()),
        Some(top) => check_duration_bound("the upper bound of the highest bucket holding observations", top),
        None => Ok(()),
    }
}

/// A count field of a histogram that is no count.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum CountError {
    /// A float count (`sample_count_float`, `cumulative_count_float`, `zero_count_float`) that is
    /// NaN, infinite or negative.
    #[error("{field} is {value}: a count is a finite number >= 0")]
    NotACount {
        /// The field's name in `metrics.proto`.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// Integer deltas (`positive_delta`, `negative_delta`) whose running sum overflows `i64`.
    #[error("{side} delta {index} overflows the running count")]
    DeltaOverflow {
        /// `positive` or `negative`.
        side: &'static str,
        /// The delta's 1-based position.
        index: usize,
    },
    /// Integer deltas whose running sum goes below 0.
    #[error("{side} delta {index} brings the bucket count to {count}: the deltas must sum to counts >= 0")]
    NegativeCount {
        /// `positive` or `negative`.
        side: &'static str,
        /// The delta's 1-based position.
        index: usize,
        /// The running sum there.
        count: i64,
    },
}

/// A float field that overrides an integer one when above 0 (`sample_count_float`,
/// `cumulative_count_float`, `zero_count_float`): the count to use. A float that is present
/// and NaN, infinite or negative is an error (`field` names it); 0 or absent gives the integer.
fn count_of(field: &'static str, int: Option<u64>, float: Option<f64>) -> Result<f64, CountError> {
    match float {
        Some(value) if !(value.is_finite() && value >= 0.0) => Err(CountError::NotACount { field, value }),
        Some(f) if f > 0.0 => Ok(f),
        _ => Ok(int.unwrap_or(0) as f64),
    }
}

/// The classic buckets of one series as (bound, cumulative count), sorted by bound, the `+Inf`
/// bucket added from the sample count when absent; checked as the module docs say.
fn classic_buckets(h: &wire::Histogram) -> Result<Vec<(f64, f64)>, String> {
    let mut out = Vec::with_capacity(h.bucket.len() + 1);
    for (i, b) in h.bucket.iter().enumerate() {
        let le = b.upper_bound.ok_or_else(|| format!("bucket {} has no upper_bound", i + 1))?;
        if le.is_nan() {
            return Err(format!("bucket {} has the upper bound NaN", i + 1));
        } else if le == f64::NEG_INFINITY {
            return Err(format!("bucket {} has the upper bound -Inf: no bucket can be below every value", i + 1));
        } else if le < 0.0 {
            return Err(format!("bucket {} has the negative upper bound {le}: a duration histogram has no bucket below 0", i + 1));
        }
        // the field's name in the error, formatted only for an error
        let count =
            count_of("cumulative_count_float", b.cumulative_count, b.cumulative_count_float).map_err(|e| format!("bucket le=\"{}\" {e}", fmt_le(le)))?;
        out.push((le, count));
    }
    if !out.iter().any(|(le, _)| *le == f64::INFINITY) {
        out.push((f64::INFINITY, count_of("sample_count_float", h.sample_count, h.sample_count_float).map_err(|e| e.to_string())?));
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in out.windows(2) {
        let ((lo, lo_count), (hi, hi_count)) = (w[0], w[1]);
        if lo == hi {
            return Err(format!("bucket le=\"{}\" appears twice", fmt_le(hi)));
        }
        if hi_count < lo_count {
            let implicit = if hi == f64::INFINITY && !h.bucket.iter().any(|b| b.upper_bound == Some(f64::INFINITY)) { " (the sample count)" } else { "" };
            return Err(format!(
                "bucket le=\"{}\" counts {hi_count}{implicit} but le=\"{}\" counts {lo_count}: bucket counts are cumulative and never decrease as le grows",
                fmt_le(hi),
                fmt_le(lo)
            ));
        }
    }
    Ok(out)
}

fn fmt_le(v: f64) -> String {
    if v == f64::INFINITY { "+Inf".into() } else { v.to_string() }
}

/// Prometheus' `isNativeHistogram` (see the module docs).
fn is_native(h: &wire::Histogram) -> bool {
    !h.positive_span.is_empty() || !h.negative_span.is_empty() || h.zero_threshold.unwrap_or(0.0) > 0.0 || h.zero_count.unwrap_or(0) > 0
}

/// Prometheus' `isFloatHistogram`.
fn is_float(h: &wire::Histogram) -> bool {
    h.sample_count_float.unwrap_or(0.0) > 0.0 || h.zero_count_float.unwrap_or(0.0) > 0.0 || !h.positive_count.is_empty() || !h.negative_count.is_empty()
}

/// The native parts of `h` with absolute counts, or `None` when `h` is not native.
///
/// Errors: a delta sum that goes below 0 or overflows, a float count field that is not a count
/// ([`CountError`]).
pub fn native_parts(h: &wire::Histogram) -> Result<Option<NativeParts>, CountError> {
    if !is_native(h) {
        return Ok(None);
    }
    let spans = |s: &[wire::BucketSpan]| s.iter().map(|s| Span { offset: s.offset.unwrap_or(0), length: s.length.unwrap_or(0) }).collect::<Vec<_>>();
    let float = is_float(h);
    let (positive_counts, negative_counts) = if float {
        (h.positive_count.clone(), h.negative_count.clone())
    } else {
        (absolute("positive", &h.positive_delta)?, absolute("negative", &h.negative_delta)?)
    };
    let (count, zero_count) = if float {
        (count_of("sample_count_float", None, h.sample_count_float)?, count_of("zero_count_float", None, h.zero_count_float)?)
    } else {
        (h.sample_count.unwrap_or(0) as f64, h.zero_count.unwrap_or(0) as f64)
    };
    Ok(Some(NativeParts {
        schema: h.schema.unwrap_or(0),
        zero_threshold: h.zero_threshold.unwrap_or(0.0),
        zero_count,
        count,
        sum: h.sample_sum.unwrap_or(0.0),
        positive_spans: spans(&h.positive_span),
        positive_counts,
        negative_spans: spans(&h.negative_span),
        negative_counts,
    }))
}

/// Integer deltas (each bucket's count minus the previous one's, the first against 0) as
/// absolute counts, with checked arithmetic: a running sum below 0 or beyond `i64` is an error.
fn absolute(side: &'static str, deltas: &[i64]) -> Result<Vec<f64>, CountError> {
    let mut count: i64 = 0;
    let mut out = Vec::with_capacity(deltas.len());
    for (i, &d) in deltas.iter().enumerate() {
        count = count.checked_add(d).ok_or(CountError::DeltaOverflow { side, index: i + 1 })?;
        if count < 0 {
            return Err(CountError::NegativeCount { side, index: i + 1, count });
        }
        out.push(count as f64);
    }
    Ok(out)
}
