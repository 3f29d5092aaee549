//! The body as bytes (the module docs of [`super`], "Shape" and "What is an error",
//! "Framing"): the length-delimited messages framed one by one, a message's family name read
//! from its top-level fields, and a family not read checked field by field along the shapes of
//! `metrics.proto` without building it ("Speed"); [`ProtobufError`] names a message by its
//! place in the body.

use prost::encoding::{DecodeContext, WireType, check_wire_type, decode_key, decode_varint, skip_field};

/// A protobuf body that cannot be trusted: where (the message's 1-based ordinal and the byte
/// offset of its length prefix), the family when known, and what was wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.what())]
pub struct ProtobufError {
    /// 1-based ordinal of the message in the body.
    pub message_index: usize,
    /// Byte offset of the message's length prefix in the body.
    pub offset: usize,
    /// The family concerned; empty when unknown.
    pub family: String,
    /// What was wrong.
    pub message: String,
}

impl ProtobufError {
    /// `message N at byte B: family: message` (the family left out when unknown).
    fn what(&self) -> String {
        let place = format!("protobuf message {} at byte {}", self.message_index, self.offset);
        if self.family.is_empty() { format!("{place}: {}", self.message) } else { format!("{place}: {}: {}", self.family, self.message) }
    }

    /// The error as `SOURCE: protobuf message N at byte B: family: message`, the form the
    /// command line prints for a file or URL (the text reader's [`super::ParseError::at`]).
    pub fn at(&self, source: &str) -> String {
        format!("{source}: {}", self.what())
    }
}

/// One length-delimited message of a body, as framed: where it is and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Framed<'a> {
    /// 1-based ordinal.
    pub index: usize,
    /// Byte offset of its length prefix.
    pub offset: usize,
    /// The length prefix and the message, as they are in the body.
    pub raw: &'a [u8],
    /// The message alone.
    pub message: &'a [u8],
}

/// The length-delimited messages of a body in order; stops after the first framing error.
pub struct Messages<'a> {
    body: &'a [u8],
    pos: usize,
    index: usize,
}

/// The messages of `body` (see [`Messages`]).
pub fn messages(body: &[u8]) -> Messages<'_> {
    Messages { body, pos: 0, index: 0 }
}

/// A base-128 varint at the start of `bytes` (prost's `decode_varint`): its value and length;
/// `Err` says why not (cut short; longer than 10 bytes or beyond 64 bits).
fn varint(bytes: &[u8]) -> Result<(u64, usize), &'static str> {
    let mut buf = bytes;
    match decode_varint(&mut buf) {
        Ok(value) => Ok((value, bytes.len() - buf.len())),
        // prost refuses both alike: fewer than 10 bytes, each with the continuation bit, were cut
        Err(_) if bytes.len() < 10 && bytes.iter().all(|b| b & 0x80 != 0) => Err("the body ends inside a length prefix: the scrape was cut off"),
        Err(_) => Err("the length prefix is longer than 10 bytes or beyond 64 bits"),
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Framed<'a>, ProtobufError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.body.len() {
            return None;
        }
        self.index += 1;
        let body = self.body;
        let (offset, rest) = (self.pos, &body[self.pos..]);
        let fail = |message: String| ProtobufError { message_index: self.index, offset, family: String::new(), message };
        let framed = match varint(rest) {
            Err(why) => Err(fail(why.to_string())),
            Ok((len, prefix)) => {
                let remaining = rest.len() - prefix;
                match usize::try_from(len) {
                    Ok(len) if len <= remaining => Ok(Framed { index: self.index, offset, raw: &rest[..prefix + len], message: &rest[prefix..prefix + len] }),
                    _ => Err(fail(format!("the message declares {len} bytes but only {remaining} remain: the scrape was cut off"))),
                }
            }
        };
        // after an error nothing more is framed
        self.pos = match &framed {
            Ok(f) => offset + f.raw.len(),
            Err(_) => self.body.len(),
        };
        Some(framed)
    }
}

/// The family name of a framed message as its errors name it: the first field 1 of wire type
/// 2, read without decoding the rest (the fields before it skipped by their wire types with
/// prost's `decode_key` and `skip_field`; client_golang writes the name first). `None` when the
/// message has no name, garbage before it, or a name that is not UTF-8.
pub fn family_name(message: &[u8]) -> Option<String> {
    let mut buf = message;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).ok()?;
        if tag == 1 && wire_type == WireType::LengthDelimited {
            return std::str::from_utf8(delimited(&mut buf).ok()?).ok().map(str::to_string);
        }
        skip_field(wire_type, tag, &mut buf, DecodeContext::default()).ok()?;
    }
    None
}

/// The family name of a framed message as prost decodes it: the last field 1 (proto2 merges a
/// repeated optional field; client_golang writes one), found by walking every top-level field
/// by its wire type and hopping over the nested messages by their lengths. `None` when the top
/// level is not well-formed, or has no name of wire type 2 that is UTF-8: what the decoder and
/// the filter go by (without allocating); the full decode then says what is wrong.
pub(super) fn name_field(message: &[u8]) -> Option<&str> {
    let mut buf = message;
    let mut name = None;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).ok()?;
        if tag == 1 && wire_type == WireType::LengthDelimited {
            name = Some(delimited(&mut buf).ok()?);
        } else {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default()).ok()?;
        }
    }
    std::str::from_utf8(name?).ok()
}

/// What a field of a `metrics.proto` message holds, as far as its wire format goes: what
/// [`check_value`] checks where prost would decode it.
#[derive(Clone, Copy)]
enum Kind {
    /// A varint scalar: `uint64`, `int64`, `uint32`, `sint32`, `sint64`, an enum (wire type 0;
    /// prost takes any value of at most 10 bytes and 64 bits, and truncates).
    Varint,
    /// A `double` (wire type 1: 8 bytes).
    Double,
    /// A `string` (wire type 2, UTF-8).
    Str,
    /// A message (wire type 2) of this shape.
    Message(&'static Shape),
    /// A repeated varint scalar: one per field (wire type 0) or packed (wire type 2).
    RepeatedVarint,
    /// A repeated `double`: one per field (wire type 1) or packed (wire type 2, 8 bytes each).
    RepeatedDouble,
}

/// A message of `metrics.proto` for [`check_unread`]: its name and its fields (number, name,
/// [`Kind`]) as the [`super::wire`] structs declare them; any other field number is skipped by its
/// wire type, as prost skips unknown fields. Names are prost's, for the same error texts.
struct Shape {
    name: &'static str,
    fields: &'static [(u32, &'static str, Kind)],
}

static METRIC_FAMILY: Shape = Shape {
    name: "MetricFamily",
    fields: &[(1, "name", Kind::Str), (2, "help", Kind::Str), (3, "r#type", Kind::Varint), (4, "metric", Kind::Message(&METRIC)), (5, "unit", Kind::Str)],
};

static METRIC: Shape = Shape {
    name: "Metric",
    fields: &[
        (1, "label", Kind::Message(&LABEL_PAIR)),
        (2, "gauge", Kind::Message(&VALUE)),
        (3, "counter", Kind::Message(&VALUE)),
        (4, "summary", Kind::Message(&SUMMARY)),
        (5, "untyped", Kind::Message(&VALUE)),
        (6, "timestamp_ms", Kind::Varint),
        (7, "histogram", Kind::Message(&HISTOGRAM)),
    ],
};

static LABEL_PAIR: Shape = Shape { name: "LabelPair", fields: &[(1, "name", Kind::Str), (2, "value", Kind::Str)] };

static VALUE: Shape = Shape { name: "Value", fields: &[(1, "value", Kind::Double)] };

static SUMMARY: Shape =
    Shape { name: "Summary", fields: &[(1, "sample_count", Kind::Varint), (2, "sample_sum", Kind::Double), (3, "quantile", Kind::Message(&QUANTILE))] };
static QUANTILE: Shape = Shape { name: "Quantile", fields: &[(1, "quantile", Kind::Double), (2, "value", Kind::Double)] };

static HISTOGRAM: Shape = Shape {
    name: "Histogram",
    fields: &[
        (1, "sample_count", Kind::Varint),
        (2, "sample_sum", Kind::Double),
        (3, "bucket", Kind::Message(&BUCKET)),
        (4, "sample_count_float", Kind::Double),
        (5, "schema", Kind::Varint),
        (6, "zero_threshold", Kind::Double),
        (7, "zero_count", Kind::Varint),
        (8, "zero_count_float", Kind::Double),
        (9, "negative_span", Kind::Message(&BUCKET_SPAN)),
        (10, "negative_delta", Kind::RepeatedVarint),
        (11, "negative_count", Kind::RepeatedDouble),
        (12, "positive_span", Kind::Message(&BUCKET_SPAN)),
        (13, "positive_delta", Kind::RepeatedVarint),
        (14, "positive_count", Kind::RepeatedDouble),
    ],
};

static BUCKET: Shape =
    Shape { name: "Bucket", fields: &[(1, "cumulative_count", Kind::Varint), (2, "upper_bound", Kind::Double), (4, "cumulative_count_float", Kind::Double)] };
static BUCKET_SPAN: Shape = Shape { name: "BucketSpan", fields: &[(1, "offset", Kind::Varint), (2, "length", Kind::Varint)] };

/// Checks that `message` is a `MetricFamily` prost would decode, without building it: every
/// field's key, wire type and length, every string's UTF-8, every nested message to its exact
/// end, read as [`wire::MetricFamily::decode`] reads them: prost's wire-format helpers in the
/// order prost's derived decoders call them (`decode_key`, `check_wire_type`, `decode_varint`,
/// `skip_field`, and `merge_loop` for nested messages and packed fields, which reads a nested
/// field through the enclosing buffer and checks its end afterwards). For the families this
/// reader does not interpret (most of a kube-proxy body), where the full decode would
/// allocate a `String` per label and a `Vec` per series and bucket only to drop them.
///
/// Errors: prost's own [`prost::DecodeError`], its location stack filled as prost's derived
/// decoders fill it (`LabelPair.name: Metric.label: MetricFamily.metric: invalid string value:
/// ...`), the same as the full decode's. The one difference: prost counts nested messages and
/// groups against a recursion limit of 100 with a crate-private counter, so an unknown field
/// holding groups nested about 100 deep (which no exposition writer produces) is refused by
/// the full decode and let through here.
pub(super) fn check_unread(message: &[u8]) -> Result<(), prost::DecodeError> {
    let mut buf = message;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        check_field(&METRIC_FAMILY, tag, wire_type, &mut buf, DecodeContext::default())?;
    }
    Ok(())
}

/// One field of a `shape` message whose key (`tag`, `wire_type`) has been read, as prost's
/// derived `merge_field` reads it: a known field by its [`Kind`], its (message, field) pushed
/// on an error's location stack; an unknown one skipped by its wire type. `buf` is advanced
/// past it.
fn check_field(shape: &Shape, tag: u32, wire_type: WireType, buf: &mut &[u8], ctx: DecodeContext) -> Result<(), prost::DecodeError> {
    let Some(&(_, field, kind)) = shape.fields.iter().find(|f| f.0 == tag) else {
        return skip_field(wire_type, tag, buf, ctx);
    };
    check_value(kind, wire_type, buf, ctx).map_err(|mut e| {
        e.push(shape.name, field);
        e
    })
}

/// The value of a field of [`Kind`] `kind` whose key said `wire_type`, as prost's decoder for
/// that type reads it (`prost::encoding::{uint64, double, string, message}::merge` and their
/// `merge_repeated`), without keeping it.
fn check_value(kind: Kind, wire_type: WireType, buf: &mut &[u8], ctx: DecodeContext) -> Result<(), prost::DecodeError> {
    match (kind, wire_type) {
        (Kind::Varint | Kind::RepeatedVarint, WireType::Varint) => decode_varint(buf).map(drop),
        // 8 bytes: `double::merge` and `skip_field` refuse fewer with the same underflow error
        (Kind::Double | Kind::RepeatedDouble, WireType::SixtyFourBit) => skip_field(wire_type, 1, buf, ctx),
        (Kind::Str, WireType::LengthDelimited) => {
            let start = *buf;
            // labels and help texts are ASCII: a word-wise check first, the full one for the rest
            let bytes = delimited(buf)?;
            if bytes.is_ascii() || std::str::from_utf8(bytes).is_ok() {
                return Ok(());
            }
            // not UTF-8: prost's string decoder on the same bytes, for its error
            *buf = start;
            prost::encoding::string::merge(wire_type, &mut String::new(), buf, ctx)
        }
        (Kind::Message(inner), WireType::LengthDelimited) => prost::encoding::merge_loop(&mut (), buf, ctx, |_, buf, ctx| {
            let (tag, wire_type) = decode_key(buf)?;
            check_field(inner, tag, wire_type, buf, ctx)
        }),
        (Kind::RepeatedVarint, WireType::LengthDelimited) => prost::encoding::merge_loop(&mut (), buf, ctx, |_, buf, _| decode_varint(buf).map(drop)),
        (Kind::RepeatedDouble, WireType::LengthDelimited) => {
            prost::encoding::merge_loop(&mut (), buf, ctx, |_, buf, ctx| skip_field(WireType::SixtyFourBit, 1, buf, ctx))
        }
        (Kind::Varint | Kind::RepeatedVarint, _) => check_wire_type(WireType::Varint, wire_type),
        (Kind::Double | Kind::RepeatedDouble, _) => check_wire_type(WireType::SixtyFourBit, wire_type),
        (Kind::Str | Kind::Message(_), _) => check_wire_type(WireType::LengthDelimited, wire_type),
    }
}

/// The bytes of a length-delimited field whose key has been read: a varint length and that
/// many bytes; `buf` is advanced past them. Errors: prost's (a bad varint; a length beyond what
/// remains, from `skip_field` on the same bytes).
fn delimited<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], prost::DecodeError> {
    let start = *buf;
    let len = decode_varint(buf)?;
    match usize::try_from(len).ok().and_then(|n| buf.split_at_checked(n)) {
        Some((bytes, rest)) => {
            *buf = rest;
            Ok(bytes)
        }
        None => {
            *buf = start;
            skip_field(WireType::LengthDelimited, 1, buf, DecodeContext::default()).map(|()| &[][..])
        }
    }
}
