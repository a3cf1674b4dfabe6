//! Whole-message calls: unary methods the gate answers from Python worker threads, without a second HTTP/2 hop.
//!
//! Why: a relayed call is parsed twice (HTTP/2 here, then again by the Python gRPC server), and gRPC's Python
//! server receives a large message in many small pieces under the interpreter lock (serve-local: 3.5-6.5 ms for a
//! 5.3 MB entry request, issue 22). For a method named in `direct`, the gate receives the message here, off the
//! interpreter lock, into one buffer, and queues the call; a Python worker thread takes it with
//! `GrpcGate.next_call` (one copy into a `bytes` object) and answers with `DirectCall.respond` (status, message,
//! trailers), which the gate frames and sends. Everything else (other methods, compressed messages) is relayed.
//!
//! Rules, as gRPC's own server applies them to a unary call: exactly one message; its 5-byte prefix says its length
//! and that it is not compressed; a message longer than `max_message` is refused with RESOURCE_EXHAUSTED before it
//! is read; a call whose client resets it is dropped (its answer, when it comes, is discarded); a call no worker
//! answers (the `DirectCall` dropped without `respond`) gets INTERNAL. Malformed framing is the client's:
//! INVALID_ARGUMENT. At most `max_calls` calls are received or queued at once (a call a worker took no longer
//! counts); more wait for the HTTP/2 window.
//!
//! Two guards for a public port (the gateway's, `grpc_direct`): with tokens set (`GrpcGate.set_tokens`), a call's
//! message is received only when its one `authorization` value names one of them; any other call is queued with its
//! message unread, for the worker to refuse in the gateway's words. And the bytes of messages received and not yet
//! taken are bounded (`max_bytes`): a message that does not fit is refused RESOURCE_EXHAUSTED as soon as its prefix
//! says its length, before it is read.

use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, HeaderValue, Request, Response};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::entry::fresh_bytes;
use crate::gate::{send_all, trailer_map, trailers_only};

pub(crate) const PREFIX: usize = 5; // gRPC message prefix: compressed flag, length (u32, big endian)

/// gRPC status codes the gate and the native client (src/client.rs) word themselves.
pub(crate) const CANCELLED: u16 = 1;
pub(crate) const UNKNOWN: u16 = 2;
pub(crate) const INVALID_ARGUMENT: u16 = 3;
pub(crate) const DEADLINE_EXCEEDED: u16 = 4;
pub(crate) const RESOURCE_EXHAUSTED: u16 = 8;
pub(crate) const INTERNAL: u16 = 13;
pub(crate) const UNAVAILABLE: u16 = 14;

/// The answer a worker gives.
pub(crate) struct Reply {
    code: u16,
    details: String,
    body: Option<Bytes>, // the response message with its gRPC prefix
    trailers: Vec<(String, String)>,
}

/// A received call waiting for a worker (its message None: withheld, not received, see [`Direct::authorized`]).
struct Pending {
    path: String,
    metadata: Vec<(String, Vec<u8>)>,
    deadline: Option<Instant>,
    message: Option<Message>,
    reply: oneshot::Sender<Reply>,
    _permit: OwnedSemaphorePermit, // given back when a worker takes the call
}

/// The bytes of the messages received and not yet taken by a worker, bounded (0: unbounded).
pub(crate) struct Budget {
    held: AtomicUsize,
    pub(crate) refused: AtomicU64, // messages refused for not fitting
    max: usize,
    text: String, // the refusal's text when a message does not fit
}

impl Budget {
    pub(crate) fn new(max: usize, text: String) -> Budget {
        Budget {
            held: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            max,
            text,
        }
    }

    /// `n` bytes held until the returned hold is dropped; None when they do not fit.
    fn reserve(self: &Arc<Self>, n: usize) -> Option<Hold> {
        if self.max == 0 {
            return Some(Hold(self.clone(), 0));
        }
        let before = self.held.fetch_add(n, Ordering::AcqRel);
        if before.saturating_add(n) > self.max {
            self.held.fetch_sub(n, Ordering::AcqRel);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(Hold(self.clone(), n))
    }
}

/// Bytes held in a [`Budget`], given back when dropped.
struct Hold(Arc<Budget>, usize);

impl Drop for Hold {
    fn drop(&mut self) {
        if self.1 > 0 {
            self.0.held.fetch_sub(self.1, Ordering::AcqRel);
        }
    }
}

/// The whole-message methods of one gate and its queue of received calls.
pub(crate) struct Direct {
    paths: Vec<String>,
    max_message: usize,
    tx: Mutex<Option<Sender<Pending>>>,
    rx: Mutex<Receiver<Pending>>,
    permits: Arc<Semaphore>, // calls being received or queued (a worker's taking a call gives its permit back)
    pub(crate) budget: Arc<Budget>,
    /// How long a message may take to arrive once its call came, and the refusal's text (None: no bound).
    receive_timeout: Option<(Duration, String)>,
    /// The bearer tokens a call must carry for its message to be received (None: any call's is received).
    tokens: RwLock<Option<Vec<Vec<u8>>>>,
}

impl Direct {
    pub(crate) fn new(
        paths: Vec<String>,
        max_message: usize,
        max_calls: usize,
        budget: Budget,
    ) -> Direct {
        let (tx, rx) = channel();
        Direct {
            paths,
            max_message,
            tx: Mutex::new(Some(tx)),
            rx: Mutex::new(rx),
            permits: Arc::new(Semaphore::new(max_calls.max(1))),
            budget: Arc::new(budget),
            receive_timeout: None,
            tokens: RwLock::new(None),
        }
    }

    /// Bound the time a message may take to arrive (`text`: the DEADLINE_EXCEEDED refusal's).
    pub(crate) fn with_receive_timeout(mut self, limit: Duration, text: String) -> Direct {
        self.receive_timeout = Some((limit, text));
        self
    }

    pub(crate) fn set_tokens(&self, tokens: Option<Vec<Vec<u8>>>) {
        if let Ok(mut t) = self.tokens.write() {
            *t = tokens;
        }
    }

    /// Whether a call with these headers has its message received: no tokens set, or exactly one `authorization`
    /// value `Bearer <token>` (scheme in any case) naming one of them, compared in constant time against every
    /// token. A call that fails is still queued, its message withheld (never read), so that the worker answers it
    /// with the gateway's own wording of the refusal.
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Ok(guard) = self.tokens.read() else {
            return false;
        };
        let Some(tokens) = guard.as_ref() else {
            return true;
        };
        let mut values = headers.get_all("authorization").iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return false;
        };
        let value = value.as_bytes().trim_ascii();
        let Some(space) = value.iter().position(|b| *b == b' ') else {
            return false;
        };
        let (scheme, token) = (&value[..space], value[space..].trim_ascii());
        if !scheme.eq_ignore_ascii_case(b"bearer") || token.is_empty() {
            return false;
        }
        let mut found = false;
        for t in tokens {
            found |= same_bytes(t, token);
        }
        found
    }

    /// Whether the gate answers `req` itself: a direct method, its message not compressed.
    pub(crate) fn takes<T>(&self, req: &Request<T>) -> bool {
        let path = req.uri().path();
        if !self.paths.iter().any(|p| p == path) {
            return false;
        }
        match req.headers().get("grpc-encoding") {
            None => true,
            Some(v) => v.as_bytes() == b"identity",
        }
    }

    /// No more calls are queued (the workers' `next_call` answers None once the queue is empty).
    pub(crate) fn close(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
    }

    /// The next queued call, waiting up to `timeout` (None: none came, or the gate is closed).
    fn next(&self, timeout: Duration) -> Option<Pending> {
        let rx = self.rx.lock().ok()?;
        match rx.recv_timeout(timeout) {
            Ok(p) => Some(p),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }
}

/// Whether `a == b`, in a time that depends on their lengths only.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `grpc-timeout` (gRPC's HTTP/2 protocol: up to 8 digits and a unit H, M, S, m, u or n).
fn parse_timeout(v: &HeaderValue) -> Option<Duration> {
    let s = v.to_str().ok()?;
    if s.len() < 2 || s.len() > 9 {
        return None;
    }
    let (digits, unit) = s.split_at(s.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The call's metadata as the application sees it: every header but HTTP/2's and gRPC's own.
fn metadata(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .filter(|(k, _)| {
            let k = k.as_str();
            !(k.starts_with("grpc-") || k == "content-type" || k == "te" || k == "user-agent")
        })
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect()
}

/// A received message: the HTTP/2 frames' chunks as they came (no copy here), the gRPC prefix left out.
pub(crate) struct Message {
    chunks: Vec<Bytes>,
    len: usize,
    _hold: Option<Hold>, // its bytes in the budget until the message is taken or dropped
}

impl Message {
    fn copy_to(&self, out: &mut [u8]) {
        let mut at = 0;
        for c in &self.chunks {
            out[at..at + c.len()].copy_from_slice(c);
            at += c.len();
        }
    }
}

/// The one message of a unary call; or the status and text to refuse it with.
async fn receive(body: &mut RecvStream, direct: &Direct) -> Result<Message, (u16, String)> {
    let max_message = direct.max_message;
    let mut head = [0u8; PREFIX];
    let mut got = 0usize; // bytes received, prefix included
    let mut declared: Option<usize> = None;
    let mut hold = None;
    let mut chunks = Vec::new();
    while let Some(chunk) = body.data().await {
        let mut chunk =
            chunk.map_err(|e| (UNAVAILABLE, format!("the request stream failed: {e}")))?;
        let n = chunk.len();
        let _ = body.flow_control().release_capacity(n);
        if got < PREFIX {
            let take = (PREFIX - got).min(n);
            head[got..got + take].copy_from_slice(&chunk[..take]);
            chunk = chunk.slice(take..);
        }
        got += n;
        if declared.is_none() && got >= PREFIX {
            if head[0] != 0 {
                return Err((
                    INVALID_ARGUMENT,
                    "the request message is marked compressed but the call names no grpc-encoding"
                        .into(),
                ));
            }
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            if len > max_message {
                return Err((
                    RESOURCE_EXHAUSTED,
                    format!("Received message larger than max ({len} vs. {max_message})"),
                ));
            }
            hold = Some(
                direct
                    .budget
                    .reserve(len)
                    .ok_or_else(|| (RESOURCE_EXHAUSTED, direct.budget.text.clone()))?,
            );
            declared = Some(len);
        }
        if let Some(len) = declared {
            if got > PREFIX + len {
                return Err((
                    INVALID_ARGUMENT,
                    "a unary call carries exactly one request message".into(),
                ));
            }
        }
        if !chunk.is_empty() {
            chunks.push(chunk);
        }
    }
    match declared {
        None => Err((
            INVALID_ARGUMENT,
            "the call carries no request message".into(),
        )),
        Some(len) if got < PREFIX + len => Err((
            INVALID_ARGUMENT,
            format!(
                "the request message was cut short: {} of {len} bytes",
                got - PREFIX
            ),
        )),
        Some(len) => Ok(Message {
            chunks,
            len,
            _hold: hold,
        }),
    }
}

/// `message` with its gRPC prefix (not compressed, its length), in one copy.
fn framed(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(PREFIX + message.len());
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out.freeze()
}

async fn answer(respond: &mut SendResponse<Bytes>, reply: Reply) -> Result<(), h2::Error> {
    let body = match reply.body {
        Some(b) if reply.code == 0 => b,
        _ => {
            trailers_only(respond, reply.code, &reply.details, &reply.trailers);
            return Ok(());
        }
    };
    let resp = Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .expect("static response parts");
    let mut out = respond.send_response(resp, false)?;
    send_all(&mut out, body).await?;
    out.send_trailers(trailer_map(0, "", &reply.trailers))
}

/// Serve one whole-message call: receive it, queue it for a worker, send the worker's answer.
pub(crate) async fn serve(
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    direct: &Direct,
) {
    let Ok(permit) = direct.permits.clone().acquire_owned().await else {
        return;
    };
    let (head, mut body) = req.into_parts();
    let deadline = head
        .headers
        .get("grpc-timeout")
        .and_then(parse_timeout)
        .map(|t| Instant::now() + t);
    let message = if direct.authorized(&head.headers) {
        let receiving = async {
            match direct.receive_timeout {
                None => receive(&mut body, direct).await,
                Some((limit, ref text)) => tokio::time::timeout(limit, receive(&mut body, direct))
                    .await
                    .unwrap_or_else(|_| Err((DEADLINE_EXCEEDED, text.clone()))),
            }
        };
        let received = tokio::select! {
            m = receiving => m,
            _ = poll_fn(|cx| respond.poll_reset(cx)) => return,
        };
        match received {
            Ok(m) => Some(m),
            Err((code, text)) => {
                trailers_only(&mut respond, code, &text, &[]);
                return;
            }
        }
    } else {
        None // not read: the worker refuses the call (see Direct::authorized)
    };
    let (tx, rx) = oneshot::channel();
    let pending = Pending {
        path: head.uri.path().to_string(),
        metadata: metadata(&head.headers),
        deadline,
        message,
        reply: tx,
        _permit: permit,
    };
    let queued = direct
        .tx
        .lock()
        .ok()
        .and_then(|tx| tx.as_ref().map(|tx| tx.send(pending).is_ok()));
    if queued != Some(true) {
        trailers_only(
            &mut respond,
            UNAVAILABLE,
            "the server is shutting down; retry later",
            &[],
        );
        return;
    }
    let reply = tokio::select! {
        r = rx => r,
        _ = poll_fn(|cx| respond.poll_reset(cx)) => return,
    };
    match reply {
        Ok(reply) => {
            if answer(&mut respond, reply).await.is_err() {
                respond.send_reset(h2::Reason::CANCEL);
            }
        }
        Err(_) => trailers_only(
            &mut respond,
            INTERNAL,
            "the server gave no answer to the call",
            &[],
        ),
    }
}

/// Whether a copy is long enough to be made without the interpreter lock (other threads run meanwhile).
fn copied_off_lock(len: usize) -> bool {
    len >= 1 << 20
}

/// One call taken by a Python worker thread (from `GrpcGate.next_call`).
#[pyclass(module = "embedgate_native")]
pub struct DirectCall {
    #[pyo3(get)]
    path: String,
    metadata: Vec<(String, Vec<u8>)>,
    deadline: Option<Instant>,
    message: Mutex<Option<Message>>,
    received: bool,
    reply: Mutex<Option<oneshot::Sender<Reply>>>,
}

#[pymethods]
impl DirectCall {
    /// The call's metadata: (key, value) pairs, keys in lower case, values as sent (``-bin`` ones base64).
    fn metadata<'py>(&self, py: Python<'py>) -> Vec<(String, Bound<'py, PyBytes>)> {
        self.metadata
            .iter()
            .map(|(k, v)| (k.clone(), PyBytes::new(py, v)))
            .collect()
    }

    /// Seconds left before the call's deadline (None: sent without one; 0 once passed).
    fn time_remaining(&self) -> Option<f64> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()).as_secs_f64())
    }

    /// Whether the message was received (False: withheld, the call carrying no token the gate knows; see
    /// `GrpcGate.set_tokens`).
    #[getter]
    fn received(&self) -> bool {
        self.received
    }

    /// Whether the client is gone (it reset the call, or the gate closed): an answer would be discarded.
    #[getter]
    fn cancelled(&self) -> bool {
        self.reply
            .lock()
            .ok()
            .and_then(|r| r.as_ref().map(|tx| tx.is_closed()))
            .unwrap_or(true)
    }

    /// The request message (once; its buffer is freed).
    fn take_message<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let taken = self.message.lock().ok().and_then(|mut m| m.take());
        match taken {
            Some(m) => {
                // one copy, from the frames' chunks straight into the bytes object; off the interpreter lock when
                // the message is large
                let len = m.len;
                fresh_bytes(py, len, copied_off_lock(len), move |buf: &mut [u8]| {
                    m.copy_to(buf)
                })
            }
            None if !self.received => Err(pyo3::exceptions::PyValueError::new_err(
                "the message was withheld",
            )),
            None => Err(pyo3::exceptions::PyValueError::new_err(
                "the message was already taken",
            )),
        }
    }

    /// Answer the call: `code` 0 with `body` (the serialized response), or a status `code` and `details`;
    /// `trailers` go with the status. False when the call was already answered or its client is gone.
    #[pyo3(signature = (code, details, body=None, trailers=Vec::new()))]
    fn respond(
        &self,
        code: u16,
        details: &str,
        body: Option<&[u8]>,
        trailers: Vec<(String, String)>,
    ) -> bool {
        let Some(tx) = self.reply.lock().ok().and_then(|mut r| r.take()) else {
            return false;
        };
        let reply = Reply {
            code,
            details: details.to_string(),
            body: body.map(framed),
            trailers,
        };
        tx.send(reply).is_ok()
    }
}

/// The next call for a worker, waiting up to `timeout_s` without the interpreter lock (None: none came, or the
/// gate is closed and its queue empty).
pub(crate) fn next_call(py: Python<'_>, direct: &Direct, timeout_s: f64) -> Option<DirectCall> {
    let timeout = Duration::from_secs_f64(timeout_s.clamp(0.0, 3600.0));
    let p = py.allow_threads(|| direct.next(timeout))?;
    Some(DirectCall {
        path: p.path,
        metadata: p.metadata,
        deadline: p.deadline,
        received: p.message.is_some(),
        message: Mutex::new(p.message),
        reply: Mutex::new(Some(p.reply)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit() {
        let t = |s: &'static str| parse_timeout(&HeaderValue::from_static(s));
        assert_eq!(t("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(t("3M"), Some(Duration::from_secs(180)));
        assert_eq!(t("5S"), Some(Duration::from_secs(5)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(t("7n"), Some(Duration::from_nanos(7)));
        assert_eq!(t("5"), None);
        assert_eq!(t("123456789S"), None); // more than 8 digits
        assert_eq!(t("5x"), None);
        assert_eq!(t("-5S"), None);
    }

    #[test]
    fn metadata_leaves_out_the_protocol_headers() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/grpc"));
        h.insert("grpc-timeout", HeaderValue::from_static("1S"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("authorization", HeaderValue::from_static("Bearer t"));
        h.insert("x-id-bin", HeaderValue::from_static("AAE="));
        let mut got = metadata(&h);
        got.sort();
        assert_eq!(
            got,
            vec![
                ("authorization".into(), b"Bearer t".to_vec()),
                ("x-id-bin".into(), b"AAE=".to_vec())
            ]
        );
    }

    #[test]
    fn a_message_is_received_only_with_one_known_bearer_token() {
        let d = Direct::new(vec!["/p".into()], 1 << 20, 4, Budget::new(0, String::new()));
        let with = |values: &[&'static str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append("authorization", HeaderValue::from_static(v));
            }
            h
        };
        assert!(d.authorized(&with(&[]))); // no tokens set: every call's message is received
        d.set_tokens(Some(vec![b"tok-1".to_vec(), b"tok-22".to_vec()]));
        assert!(d.authorized(&with(&["Bearer tok-1"])));
        assert!(d.authorized(&with(&["bearer  tok-22 "])));
        assert!(!d.authorized(&with(&[])));
        assert!(!d.authorized(&with(&["Bearer tok-2"])));
        assert!(!d.authorized(&with(&["Bearer tok-1x"])));
        assert!(!d.authorized(&with(&["Basic tok-1"])));
        assert!(!d.authorized(&with(&["Bearer"])));
        assert!(!d.authorized(&with(&["Bearer tok-1", "Bearer tok-1"]))); // two values: never one of them
        d.set_tokens(None);
        assert!(d.authorized(&with(&[])));
    }

    #[test]
    fn the_budget_refuses_what_does_not_fit_and_takes_bytes_back() {
        let b = Arc::new(Budget::new(100, "full".into()));
        let first = b.reserve(60).expect("fits");
        assert!(b.reserve(41).is_none());
        assert_eq!(b.refused.load(Ordering::Relaxed), 1);
        let second = b.reserve(40).expect("fits exactly");
        drop(first);
        assert!(b.reserve(60).is_some()); // dropped at once: its bytes back
        drop(second);
        assert_eq!(b.held.load(Ordering::Relaxed), 0);
        let unbounded = Arc::new(Budget::new(0, String::new()));
        assert!(unbounded.reserve(usize::MAX / 2).is_some());
    }

    #[test]
    fn trailers_carry_the_status_its_text_and_the_extras() {
        let map = trailer_map(
            3,
            "bad é",
            &[("x-a".into(), "1".into()), ("Bad Name".into(), "2".into())],
        );
        assert_eq!(map.get("grpc-status").unwrap(), "3");
        assert_eq!(map.get("grpc-message").unwrap(), "bad %C3%A9");
        assert_eq!(map.get("x-a").unwrap(), "1");
        assert_eq!(map.len(), 3); // an invalid header name is left out
    }
}
