//! TF Serving's JSON response writer (`tensorflow_serving/util/json_tensor.cc` over rapidjson's `PrettyWriter`),
//! byte for byte, from the entry's output arrays. The Python reference is `gateway/codec/json_tensor.py`
//! (`predict_response`, `classify_response`, `regress_response`) with `gateway/codec/rapidjson.py`'s `PrettyWriter`
//! and `gateway/codec/numbers.py`'s `format_float`; this module ports the writer's state machine as is, so every
//! layout (row/columnar, one/several outputs, any rank, empty dims, `{"b64": ...}` objects) follows from the same
//! calls in the same order.
//!
//! Checks that word errors (empty map, rank-0 or inconsistent batches in row format, dtypes JSON cannot carry) stay
//! in Python (`gateway.native`), which calls in here only with outputs the reference would write.

use std::fmt::Write as _;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

// ---- numbers (WriteDecimal) ----------------------------------------------------------------------------------------

/// A fixed stack buffer for `core::fmt` output (the longest text written here is 24 bytes).
struct Stack {
    buf: [u8; 48],
    len: usize,
}

impl Stack {
    fn new() -> Stack {
        Stack {
            buf: [0; 48],
            len: 0,
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for Stack {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let b = s.as_bytes();
        let end = self.len + b.len();
        if end > self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(b);
        self.len = end;
        Ok(())
    }
}

/// Appends C's `%.{prec}g` of finite `v` (correctly rounded, ties to even, as glibc and Python print it).
fn push_g(v: f64, prec: usize, out: &mut Vec<u8>) {
    let mut sci = Stack::new();
    // `{:.N e}` is correctly rounded (exact digits, round half to even): "-d.ddddde-7"
    let _ = write!(sci, "{:.*e}", prec - 1, v);
    let text = sci.bytes();
    let neg = text[0] == b'-';
    let body = if neg { &text[1..] } else { text };
    let epos = body.iter().position(|&c| c == b'e').unwrap_or(body.len());
    let mut digits = [0u8; 24];
    let mut n = 0;
    for &c in &body[..epos] {
        if c != b'.' {
            digits[n] = c;
            n += 1;
        }
    }
    let exp: i32 = std::str::from_utf8(&body[epos + 1..])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    while n > 1 && digits[n - 1] == b'0' {
        n -= 1; // %g drops trailing zeros
    }
    push_g_digits(neg, &digits[..n], exp, prec, out);
}

/// The shortest round-trip digits of finite non-zero `v` (its own width: float32 unless `double`), as
/// (digits without leading or trailing zeros, decimal exponent of the first digit); serde_json's shortest writer.
fn shortest(v: f64, double: bool) -> Option<([u8; 24], usize, i32)> {
    let mut buf = [0u8; 40];
    let free = {
        let mut w: &mut [u8] = &mut buf;
        if double {
            serde_json::to_writer(&mut w, &v).ok()?;
        } else {
            serde_json::to_writer(&mut w, &(v as f32)).ok()?;
        }
        w.len()
    };
    let text = &buf[..buf.len() - free];
    let body = text.strip_prefix(b"-").unwrap_or(text);
    let epos = body
        .iter()
        .position(|&c| c == b'e' || c == b'E')
        .unwrap_or(body.len());
    let exp_part = if epos < body.len() {
        small_int(&body[epos + 1..])?
    } else {
        0
    };
    let mantissa = &body[..epos];
    let point = mantissa
        .iter()
        .position(|&c| c == b'.')
        .unwrap_or(mantissa.len());
    let (mut digits, mut n, mut first) = ([0u8; 24], 0usize, None);
    for (i, &c) in mantissa.iter().enumerate() {
        if c == b'.' || (n == 0 && c == b'0') {
            continue;
        }
        if first.is_none() {
            first = Some(i);
        }
        if n == digits.len() {
            return None;
        }
        digits[n] = c;
        n += 1;
    }
    let first = first?;
    while n > 1 && digits[n - 1] == b'0' {
        n -= 1;
    }
    // the first digit's place: point - first - 1 when it is left of the point, else point - first
    let place = if first < point {
        (point - first - 1) as i32
    } else {
        point as i32 - first as i32
    };
    Some((digits, n, place + exp_part))
}

/// A short decimal integer with an optional sign ("-7", "+12", "38").
fn small_int(text: &[u8]) -> Option<i32> {
    let (neg, digits) = match text.first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 4 {
        return None;
    }
    let mut x = 0i32;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        x = x * 10 + i32::from(c - b'0');
    }
    Some(if neg { -x } else { x })
}

/// Appends `digits` (significant, no trailing zeros) times 10^`exp` (exponent of the first digit) in C's `%.{prec}g`
/// layout.
fn push_g_digits(neg: bool, digits: &[u8], exp: i32, prec: usize, out: &mut Vec<u8>) {
    let n = digits.len();
    if neg {
        out.push(b'-');
    }
    if exp < -4 || exp >= prec as i32 {
        out.push(digits[0]);
        if n > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if exp < 0 { b'-' } else { b'+' });
        let e = exp.unsigned_abs();
        if e < 10 {
            out.push(b'0');
        }
        push_uint(u64::from(e), out);
    } else if exp >= 0 {
        let int_len = exp as usize + 1;
        out.extend_from_slice(&digits[..n.min(int_len)]);
        out.resize(out.len() + int_len.saturating_sub(n), b'0');
        if n > int_len {
            out.push(b'.');
            out.extend_from_slice(&digits[int_len..]);
        }
    } else {
        out.extend_from_slice(b"0.");
        for _ in 0..(-exp - 1) {
            out.push(b'0');
        }
        out.extend_from_slice(digits);
    }
}

const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// `a` (positive, finite) correctly rounded (half to even) to `digits` significant digits, as (the digits as an
/// integer, decimal exponent of the first digit), when float64 arithmetic proves the rounding: one correctly rounded
/// scaling by an exact power of ten (10^0..10^22) leaves the result away from a tie by far more than its error.
/// `guess`: floor(log10(a)) or one off. None when float64 cannot tell (the caller formats exactly).
fn round_digits(a: f64, guess: i32, digits: i32) -> Option<(u64, i32)> {
    let (lo, hi) = (POW10[(digits - 1) as usize], POW10[digits as usize]);
    let mut e = guess;
    for _ in 0..3 {
        let p = digits - 1 - e;
        if p.unsigned_abs() > 22 {
            return None;
        }
        let s = if p >= 0 {
            a * POW10[p as usize]
        } else {
            a / POW10[(-p) as usize]
        };
        if s >= hi {
            e += 1;
            continue;
        }
        if s < lo {
            e -= 1;
            continue;
        }
        let fl = s.floor();
        let frac = s - fl;
        if (frac - 0.5).abs() < 1e-6 {
            return None; // a tie, or too close to one to tell in float64
        }
        let mut d = fl as u64 + u64::from(frac > 0.5);
        if d == hi as u64 {
            d = lo as u64;
            e += 1;
        }
        return Some((d, e));
    }
    None
}

/// floor(log10(a)) or one less, from the binary exponent of normal `a` (no libm call).
fn exp10_guess(a: f64) -> i32 {
    let e2 = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    (f64::from(e2) * std::f64::consts::LOG10_2).floor() as i32
}

/// Whether `d` x 10^`p` (a decimal, `d` < 10^6), correctly rounded to float32, is `a`: one float64 operation gives
/// its correctly rounded double; rounding that to float32 is the direct rounding unless the double lies exactly on
/// a float32 midpoint or near float32's edges (None: the caller formats exactly).
fn parses_back_f32(d: u64, p: i32, a: f64) -> Option<bool> {
    if p.unsigned_abs() > 22 {
        return None;
    }
    let back = if p >= 0 {
        d as f64 * POW10[p as usize]
    } else {
        d as f64 / POW10[(-p) as usize]
    };
    let low = back.to_bits() & ((1 << 29) - 1);
    if low == 1 << 28
        || back < 2.0 * f64::from(f32::MIN_POSITIVE)
        || back > f64::from(f32::MAX) / 2.0
    {
        return None;
    }
    Some(f64::from(back as f32) == a)
}

/// Appends `d` (exactly `width` digits) with its trailing zeros dropped, in `%.{prec}g` layout.
fn push_rounded(neg: bool, d: u64, width: usize, exp: i32, prec: usize, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut x = d;
    for k in (0..width).rev() {
        digits[k] = b'0' + (x % 10) as u8;
        x /= 10;
    }
    let n = width
        - digits[..width]
            .iter()
            .rev()
            .take_while(|&&c| c == b'0')
            .count();
    push_g_digits(neg, &digits[..n.max(1)], exp, prec, out);
}

/// The float32 token of normal `v` by float64 arithmetic alone (six digits when they parse back, else nine), or
/// false when that cannot be proved (nothing appended).
fn push_f32_fast(v: f64, out: &mut Vec<u8>) -> bool {
    let a = v.abs();
    let neg = v.is_sign_negative();
    let guess = exp10_guess(a);
    let Some((d6, e6)) = round_digits(a, guess, 6) else {
        return false;
    };
    match parses_back_f32(d6, e6 - 5, a) {
        Some(true) => push_rounded(neg, d6, 6, e6, 6, out),
        Some(false) => match round_digits(a, guess, 9) {
            Some((d9, e9)) => push_rounded(neg, d9, 9, e9, 9, out),
            None => return false,
        },
        None => return false,
    }
    true
}

/// Appends a float as `WriteDecimal` prints it: six-digit `%g` when that text parses back (correctly rounded to the
/// value's own width) to the value, else `%.9g` (float32) / `%.17g` (double); `.0` when the text has neither `.`
/// nor `e`; `NaN`, `Infinity`, `-Infinity`. `v` holds a float32 value unless `double`.
///
/// Float32 (normal values): the six and nine digits come from one float64 scaling each and the six-digit text is
/// parsed back with one float64 operation, each when provably exact (`push_f32_fast`). Doubles (normal values):
/// the six-digit text parses back exactly when the shortest round-trip digits number six or fewer (a six-digit unit
/// is wider than a normal value's whole rounding interval, so the correctly rounded six digits are then those
/// shortest digits, and with more than six no six-digit text can round-trip). Everything else (zeros, subnormals,
/// ties, exponents beyond 10^±22, doubles needing 17 digits) is formatted by the rule's definition with `core::fmt`.
fn push_float(v: f64, double: bool, out: &mut Vec<u8>) {
    if v.is_nan() {
        out.extend_from_slice(b"NaN");
        return;
    }
    if v.is_infinite() {
        out.extend_from_slice(if v > 0.0 { b"Infinity" } else { b"-Infinity" });
        return;
    }
    let start = out.len();
    let neg = v.is_sign_negative();
    let normal = if double {
        v.is_normal()
    } else {
        (v as f32).is_normal()
    };
    if !normal {
        push_exact(v, double, out);
    } else if !double {
        if !push_f32_fast(v, out) {
            push_exact(v, double, out);
        }
    } else {
        match shortest(v, double) {
            Some((digits, n, exp)) if n <= 6 => push_g_digits(neg, &digits[..n], exp, 6, out),
            Some(_) => push_g(v, 17, out),
            None => push_exact(v, double, out),
        }
    }
    if !out[start..].iter().any(|&c| c == b'.' || c == b'e') {
        out.extend_from_slice(b".0");
    }
}

/// `WriteDecimal`'s rule by its definition: six-digit `%g`, parsed back, else nine/seventeen digits.
fn push_exact(v: f64, double: bool, out: &mut Vec<u8>) {
    let start = out.len();
    push_g(v, 6, out);
    let back = std::str::from_utf8(&out[start..]).ok().and_then(|s| {
        if double {
            s.parse::<f64>().ok()
        } else {
            s.parse::<f32>().ok().map(f64::from)
        }
    });
    if back != Some(v) {
        out.truncate(start);
        push_g(v, if double { 17 } else { 9 }, out);
    }
}

fn push_uint(mut u: u64, out: &mut Vec<u8>) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

fn push_int(v: i64, out: &mut Vec<u8>) {
    if v < 0 {
        out.push(b'-');
    }
    push_uint(v.unsigned_abs(), out);
}

// ---- strings (rapidjson Writer::String, default flags) --------------------------------------------------------------

/// Appends `raw` as a JSON string: only `"`, `\` and bytes below 0x20 escaped (`\b \t \n \f \r`, else `\u00XX`
/// upper-case); every other byte, invalid UTF-8 included, copied as is.
fn push_string(raw: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push(b'"');
    for &c in raw {
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0A => out.extend_from_slice(b"\\n"),
            0x0C => out.extend_from_slice(b"\\f"),
            0x0D => out.extend_from_slice(b"\\r"),
            c if c < 0x20 => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(c >> 4)]);
                out.push(HEX[usize::from(c & 15)]);
            }
            c => out.push(c),
        }
    }
    out.push(b'"');
}

/// Standard base64 with `=` padding (RFC 4648 §4), as Python's `base64.b64encode`.
fn b64(raw: &[u8]) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(raw.len().div_ceil(3) * 4);
    for chunk in raw.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * k)) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
    out
}

// ---- the PrettyWriter model ------------------------------------------------------------------------------------------

/// rapidjson's `PrettyWriter<StringBuffer>` (4-space indent); `single` is `kFormatSingleLineArray`, read at every
/// call as rapidjson reads it. Mirrors `gateway.codec.rapidjson.PrettyWriter` call for call.
struct Pretty {
    out: Vec<u8>,
    levels: Vec<(bool, usize)>, // (in an array, values written so far)
    single: bool,
}

impl Pretty {
    fn new(capacity: usize) -> Pretty {
        Pretty {
            out: Vec::with_capacity(capacity),
            levels: Vec::new(),
            single: false,
        }
    }

    fn indent(&mut self) {
        for _ in 0..self.levels.len() {
            self.out.extend_from_slice(b"    ");
        }
    }

    fn prefix(&mut self) {
        let Some(&(in_array, count)) = self.levels.last() else {
            return;
        };
        if in_array {
            if count > 0 {
                self.out
                    .extend_from_slice(if self.single { b", " } else { b"," });
            }
            if !self.single {
                self.out.push(b'\n');
                self.indent();
            }
        } else {
            if count > 0 {
                self.out
                    .extend_from_slice(if count % 2 == 0 { b",\n" } else { b": " });
            } else {
                self.out.push(b'\n');
            }
            if count % 2 == 0 {
                self.indent();
            }
        }
        if let Some(level) = self.levels.last_mut() {
            level.1 += 1;
        }
    }

    fn start_object(&mut self) {
        self.prefix();
        self.levels.push((false, 0));
        self.out.push(b'{');
    }

    fn end_object(&mut self) {
        let empty = self.levels.pop().is_none_or(|l| l.1 == 0);
        if !empty {
            self.out.push(b'\n');
            self.indent();
        }
        self.out.push(b'}');
    }

    fn start_array(&mut self) {
        self.prefix();
        self.levels.push((true, 0));
        self.out.push(b'[');
    }

    fn end_array(&mut self) {
        let empty = self.levels.pop().is_none_or(|l| l.1 == 0);
        if !empty && !self.single {
            self.out.push(b'\n');
            self.indent();
        }
        self.out.push(b']');
    }

    fn key(&mut self, name: &[u8]) {
        self.string(name);
    }

    fn string(&mut self, raw: &[u8]) {
        self.prefix();
        push_string(raw, &mut self.out);
    }

    /// Prefix, then the caller appends one scalar token to `out`.
    fn value(&mut self) -> &mut Vec<u8> {
        self.prefix();
        &mut self.out
    }
}

// ---- tensors -------------------------------------------------------------------------------------------------------

/// The flat (row-major) values of one output, borrowed from numpy or from Python bytes.
enum Values<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    I8(&'a [i8]),
    I16(&'a [i16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    U8(&'a [u8]),
    U32(&'a [u32]),
    U64(&'a [u64]),
    Bool(&'a [bool]),
    Str(Vec<&'a [u8]>),
    B64(Vec<&'a [u8]>),
}

impl Values<'_> {
    fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
            Values::I8(v) => v.len(),
            Values::I16(v) => v.len(),
            Values::I32(v) => v.len(),
            Values::I64(v) => v.len(),
            Values::U8(v) => v.len(),
            Values::U32(v) => v.len(),
            Values::U64(v) => v.len(),
            Values::Bool(v) => v.len(),
            Values::Str(v) | Values::B64(v) => v.len(),
        }
    }

    /// Bytes a token takes at most, for the output buffer's first capacity.
    fn token_width(&self) -> usize {
        match self {
            Values::F32(_) => 16,
            Values::F64(_) => 25,
            Values::Bool(_) | Values::I8(_) | Values::U8(_) => 6,
            Values::Str(_) | Values::B64(_) => 24,
            _ => 21,
        }
    }

    fn emit(&self, w: &mut Pretty, i: usize) {
        match self {
            Values::F32(v) => push_float(f64::from(v[i]), false, w.value()),
            Values::F64(v) => push_float(v[i], true, w.value()),
            Values::I8(v) => push_int(i64::from(v[i]), w.value()),
            Values::I16(v) => push_int(i64::from(v[i]), w.value()),
            Values::I32(v) => push_int(i64::from(v[i]), w.value()),
            Values::I64(v) => push_int(v[i], w.value()),
            Values::U8(v) => push_uint(u64::from(v[i]), w.value()),
            Values::U32(v) => push_uint(u64::from(v[i]), w.value()),
            Values::U64(v) => push_uint(v[i], w.value()),
            Values::Bool(v) => w
                .value()
                .extend_from_slice(if v[i] { b"true" } else { b"false" }),
            Values::Str(v) => w.string(v[i]),
            Values::B64(v) => {
                w.start_object();
                w.key(b"b64");
                w.string(&b64(v[i]));
                w.end_object();
            }
        }
    }
}

struct Output<'a> {
    name: Vec<u8>,
    shape: Vec<usize>,
    values: Values<'a>,
}

fn write_tensor(w: &mut Pretty, out: &Output<'_>, dim: usize, offset: usize) -> usize {
    if dim >= out.shape.len() {
        out.values.emit(w, offset);
        return offset + 1;
    }
    w.start_array();
    let mut offset = offset;
    for _ in 0..out.shape[dim] {
        offset = write_tensor(w, out, dim + 1, offset);
    }
    w.end_array();
    offset
}

/// `{"predictions": [...]}` (row) or `{"outputs": ...}` (columnar), as `json_tensor._reference_predict` writes it;
/// `outputs` sorted by name, already checked (ranks, batch sizes, shapes matching the value counts).
fn write_predict(outputs: &[Output<'_>], row: bool) -> Vec<u8> {
    let capacity: usize = outputs
        .iter()
        .map(|o| o.values.len() * (o.values.token_width() + 2))
        .sum::<usize>()
        + 64;
    let mut w = Pretty::new(capacity);
    let multi = outputs.len() > 1;
    w.start_object();
    if row {
        w.key(b"predictions");
        w.start_array();
        let batch = outputs.first().map_or(0, |o| o.shape[0]);
        let mut offsets = vec![0usize; outputs.len()];
        for _ in 0..batch {
            if multi {
                w.start_object();
            }
            w.single = true;
            for (out, offset) in outputs.iter().zip(offsets.iter_mut()) {
                if multi {
                    w.key(&out.name);
                }
                *offset = write_tensor(&mut w, out, 1, *offset);
            }
            w.single = false;
            if multi {
                w.end_object();
            }
        }
        w.end_array();
    } else {
        w.key(b"outputs");
        if multi {
            w.start_object();
        }
        for out in outputs {
            if multi {
                w.key(&out.name);
            }
            write_tensor(&mut w, out, 0, 0);
        }
        if multi {
            w.end_object();
        }
    }
    w.end_object();
    w.out
}

/// The flat values of a 1-D contiguous numpy array of a dtype the writer handles; None for any other array.
fn numeric<'a>(arr: &'a Bound<'_, PyAny>) -> PyResult<Option<Values<'a>>> {
    macro_rules! try_kind {
        ($t:ty, $variant:ident) => {
            if let Ok(a) = arr.downcast::<PyArray1<$t>>() {
                // SAFETY: the caller holds the arrays for the whole call and Python code cannot run meanwhile
                // (no callbacks into Python while writing), so no one mutates them while borrowed.
                return Ok(unsafe { a.as_slice() }.ok().map(Values::$variant));
            }
        };
    }
    try_kind!(f32, F32);
    try_kind!(f64, F64);
    try_kind!(i64, I64);
    try_kind!(i32, I32);
    try_kind!(bool, Bool);
    try_kind!(u8, U8);
    try_kind!(i8, I8);
    try_kind!(i16, I16);
    try_kind!(u32, U32);
    try_kind!(u64, U64);
    Ok(None)
}

fn bytes_list<'a>(list: &'a Bound<'_, PyList>) -> PyResult<Vec<&'a [u8]>> {
    let mut raws = Vec::with_capacity(list.len());
    for item in list.iter() {
        let b = item.downcast_into::<PyBytes>()?;
        // the bytes object stays alive as an element of `list`, which the caller holds
        raws.push(unsafe { std::slice::from_raw_parts(b.as_bytes().as_ptr(), b.as_bytes().len()) });
    }
    Ok(raws)
}

/// The predict body for `outputs`: `(name, shape, values)` sorted by name, `values` a 1-D C-contiguous numpy array
/// (float32/64, int8/16/32/64, uint8/32/64, bool) or a list of bytes (string tensors; written as `{"b64": ...}`
/// when the name ends in `_bytes`). None when an array has another dtype or layout (the caller then runs the
/// reference). ValueError when the shapes do not fit the values (the caller checks them first). Numeric outputs are
/// written without the GIL: the arrays must be the caller's own (not written to by another thread meanwhile).
#[pyfunction]
pub fn predict_response<'py>(
    py: Python<'py>,
    outputs: Vec<(String, Vec<usize>, Bound<'py, PyAny>)>,
    row: bool,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let mut lists = Vec::new();
    for (_, _, values) in &outputs {
        lists.push(values.downcast::<PyList>().ok().cloned());
    }
    let mut parsed = Vec::with_capacity(outputs.len());
    for ((name, shape, values), list) in outputs.iter().zip(&lists) {
        let vals = match list {
            Some(l) if name.ends_with("_bytes") => Values::B64(bytes_list(l)?),
            Some(l) => Values::Str(bytes_list(l)?),
            None => match numeric(values)? {
                Some(v) => v,
                None => return Ok(None),
            },
        };
        if shape.iter().product::<usize>() != vals.len() || (row && shape.is_empty()) {
            return Err(PyValueError::new_err(format!(
                "output {name}: shape {shape:?} does not fit its values"
            )));
        }
        parsed.push(Output {
            name: name.as_bytes().to_vec(),
            shape: shape.clone(),
            values: vals,
        });
    }
    if row && parsed.iter().any(|o| o.shape[0] != parsed[0].shape[0]) {
        return Err(PyValueError::new_err("outputs of different batch sizes"));
    }
    if parsed.is_empty() {
        return Err(PyValueError::new_err("no outputs"));
    }
    let strings = parsed
        .iter()
        .any(|o| matches!(o.values, Values::Str(_) | Values::B64(_)));
    // bytes objects are borrowed from the caller's lists: those are written with the GIL held
    let body = if strings {
        write_predict(&parsed, row)
    } else {
        py.allow_threads(|| write_predict(&parsed, row))
    };
    Ok(Some(PyBytes::new(py, &body)))
}

/// `{"results": [v, ...]}` of a regress response, as `json_tensor.regress_response` writes it (`values` non-empty).
#[pyfunction]
pub fn regress_response<'py>(py: Python<'py>, values: Vec<f32>) -> Bound<'py, PyBytes> {
    let body = py.allow_threads(|| {
        let mut w = Pretty::new(values.len() * 18 + 32);
        w.start_object();
        w.key(b"results");
        w.single = true;
        w.start_array();
        for &v in &values {
            push_float(f64::from(v), false, w.value());
        }
        w.end_array();
        w.single = false;
        w.end_object();
        w.out
    });
    PyBytes::new(py, &body)
}

/// `{"results": [[[label, score], ...], ...]}` of a classify response, as `json_tensor.classify_response` writes
/// it: example `i` has the classes `counts[i]` after the previous ones in `labels`/`scores` (float32 values).
#[pyfunction]
pub fn classify_response<'py>(
    py: Python<'py>,
    labels: Vec<Vec<u8>>,
    scores: Vec<f32>,
    counts: Vec<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    if labels.len() != scores.len() || counts.iter().sum::<usize>() != labels.len() {
        return Err(PyValueError::new_err(
            "labels, scores and counts do not fit",
        ));
    }
    let body = py.allow_threads(|| {
        let mut w = Pretty::new(labels.len() * 40 + 32);
        w.start_object();
        w.key(b"results");
        w.start_array();
        let mut k = 0;
        for &count in &counts {
            w.single = true;
            w.start_array();
            for _ in 0..count {
                w.start_array();
                w.string(&labels[k]);
                push_float(f64::from(scores[k]), false, w.value());
                w.end_array();
                k += 1;
            }
            w.end_array();
            w.single = false;
        }
        w.end_array();
        w.end_object();
        w.out
    });
    Ok(PyBytes::new(py, &body))
}

/// `WriteDecimal`'s token of one value (tests compare it with `gateway.codec.numbers.format_float`); `exact`
/// formats by the rule's definition only (no shortcut), to test the shortcuts against it.
#[pyfunction]
#[pyo3(signature = (v, double = false, exact = false))]
pub fn format_float(v: f64, double: bool, exact: bool) -> String {
    let v = if double { v } else { f64::from(v as f32) };
    let mut out = Vec::new();
    if exact && v.is_finite() {
        push_exact(v, double, &mut out);
        if !out.iter().any(|&c| c == b'.' || c == b'e') {
            out.extend_from_slice(b".0");
        }
    } else {
        push_float(v, double, &mut out);
    }
    String::from_utf8(out).unwrap_or_default()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(predict_response, m)?)?;
    m.add_function(wrap_pyfunction!(regress_response, m)?)?;
    m.add_function(wrap_pyfunction!(classify_response, m)?)?;
    m.add_function(wrap_pyfunction!(format_float, m)?)?;
    Ok(())
}
