//! A native gRPC client for the gateway's unary backend calls (the entry's `Predict`, the PS lookups).
//!
//! Why (issue 17): through `grpc.aio`, a call costs the event loop's thread about 0.5 ms of CPU for a 0.9 MB entry
//! request (the call object, its metadata and deadline, gRPC core's completion queue and its poller thread taking
//! the interpreter lock), and in a profile of the cached gateway on the DLRM model the entry call was the largest
//! single item of the samples holding the lock (20 %). Here a call is one Python method that hands the request's
//! bytes (borrowed, not copied) to a tokio runtime on a thread of its own; the HTTP/2 framing, flow control, the
//! deadline and the answer's receipt run there without the lock. Completions are queued and announced by one byte
//! on a socket pair whose reading end the gateway's event loop watches (`fileno`, `drain`), so the answer wakes the
//! loop once and no other thread takes the lock for it.
//!
//! What it speaks: gRPC over cleartext HTTP/2 (`h2c`, prior knowledge), one connection per target opened on first
//! use and again when it breaks, uncompressed messages. A call has the rules of a gRPC unary call: the request's
//! `grpc-timeout` is the time left; past it the call ends DEADLINE_EXCEEDED and its stream is reset; a connection
//! that cannot be opened or breaks is UNAVAILABLE; an answer longer than `max_receive` is RESOURCE_EXHAUSTED; the
//! status and details are the server's `grpc-status` / `grpc-message` (percent-decoded). TLS targets keep
//! `grpc.aio` (the Python facade decides: gateway/backends/native_client.py).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use h2::{Reason, RecvStream};
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::direct::{
    CANCELLED, DEADLINE_EXCEEDED, INTERNAL, PREFIX, RESOURCE_EXHAUSTED, UNAVAILABLE, UNKNOWN,
};
use crate::gate::{send_all, Reconnecting, MAX_FRAME};

const CONN_WINDOW_FACTOR: u32 = 4;

/// How a call ended: its status, details and (status 0) the answer's message.
struct Done {
    token: u64,
    code: u16,
    details: String,
    body: Option<Bytes>,
}

impl Done {
    fn failed(token: u64, code: u16, details: impl Into<String>) -> Done {
        Done {
            token,
            code,
            details: details.into(),
            body: None,
        }
    }
}

/// Finished calls, announced on the socket pair (one byte per batch, not per call).
struct Hub {
    done: Mutex<Vec<Done>>,
    wake: StdUnixStream,
    signalled: AtomicBool,
    running: Mutex<HashMap<u64, AbortHandle>>,
}

impl Hub {
    fn finish(&self, done: Done) {
        self.running
            .lock()
            .expect("running calls")
            .remove(&done.token);
        self.done.lock().expect("finished calls").push(done);
        if !self.signalled.swap(true, Ordering::AcqRel) {
            let _ = (&self.wake).write(&[1]); // a full pair is already signalled
        }
    }
}

/// Why a connection could not be had.
struct NoConnection(String);

impl From<h2::Error> for NoConnection {
    fn from(e: h2::Error) -> Self {
        NoConnection(format!("connection lost: {e}"))
    }
}

/// One HTTP/2 connection to a target, opened on first use and again when it breaks.
struct Conn {
    target: String,
    window: u32,
    max_receive: usize,
    conn: Reconnecting,
}

impl Conn {
    async fn sender(&self) -> Result<SendRequest<Bytes>, String> {
        let target = self.target.as_str();
        self.conn
            .sender(|| async {
                let io = TcpStream::connect(target)
                    .await
                    .map_err(|e| NoConnection(format!("failed to connect to {target}: {e}")))?;
                let _ = io.set_nodelay(true);
                let (send, conn) = h2::client::Builder::new()
                    .max_frame_size(MAX_FRAME)
                    .initial_window_size(self.window)
                    .initial_connection_window_size(
                        self.window
                            .saturating_mul(CONN_WINDOW_FACTOR)
                            .min((1 << 31) - 1),
                    )
                    .max_concurrent_reset_streams(4096)
                    .handshake::<_, Bytes>(io)
                    .await
                    .map_err(|e| {
                        NoConnection(format!("HTTP/2 handshake with {target} failed: {e}"))
                    })?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(send)
            })
            .await
            .map_err(|NoConnection(e)| {
                if e.contains(target) {
                    e
                } else {
                    format!("{target}: {e}")
                }
            })
    }
}

/// gRPC's `grpc-timeout`: at most 8 digits and a unit.
fn grpc_timeout(t: Duration) -> HeaderValue {
    let micros = t.as_micros().max(1);
    let text = if micros < 100_000_000 {
        format!("{micros}u")
    } else if micros / 1000 < 100_000_000 {
        format!("{}m", micros / 1000)
    } else {
        format!("{}S", (micros / 1_000_000).min(99_999_999))
    };
    HeaderValue::from_str(&text).expect("digits and a unit")
}

/// `grpc-message` percent-decoded (gRPC's HTTP/2 protocol); invalid sequences are kept as they are.
fn percent_decoded(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            let hex = std::str::from_utf8(&raw[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(b) = hex {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The status in `headers` (trailers, or the headers of a trailers-only answer), if any.
fn status_of(headers: &HeaderMap) -> Option<(u16, String)> {
    let code = headers.get("grpc-status")?;
    let code = std::str::from_utf8(code.as_bytes())
        .ok()
        .and_then(|c| c.trim().parse::<u16>().ok())
        .unwrap_or(UNKNOWN);
    let details = headers
        .get("grpc-message")
        .map(|m| percent_decoded(m.as_bytes()))
        .unwrap_or_default();
    Some((code, details))
}

/// An HTTP/2 error as the call's status: a reset by the server in gRPC's mapping, anything else UNAVAILABLE.
fn h2_status(e: &h2::Error, target: &str) -> (u16, String) {
    match e.reason() {
        Some(Reason::CANCEL) if e.is_remote() => (CANCELLED, format!("call cancelled by {target}")),
        Some(Reason::REFUSED_STREAM) => (UNAVAILABLE, format!("{target} refused the stream")),
        Some(Reason::ENHANCE_YOUR_CALM) => (RESOURCE_EXHAUSTED, format!("{target}: {e}")),
        Some(Reason::NO_ERROR) | None if e.is_io() || e.is_go_away() => {
            (UNAVAILABLE, format!("connection to {target} lost: {e}"))
        }
        Some(Reason::PROTOCOL_ERROR)
        | Some(Reason::INTERNAL_ERROR)
        | Some(Reason::FLOW_CONTROL_ERROR)
            if e.is_remote() =>
        {
            (INTERNAL, format!("{target} reset the call: {e}"))
        }
        _ => (UNAVAILABLE, format!("connection to {target} lost: {e}")),
    }
}

/// Read the answer's body: one message (at most `max_receive` bytes), then the trailers.
async fn answer(
    mut body: RecvStream,
    max_receive: usize,
    target: &str,
) -> Result<(Option<Bytes>, HeaderMap), (u16, String)> {
    let mut buf = BytesMut::new();
    let mut want: Option<usize> = None;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| h2_status(&e, target))?;
        let n = chunk.len();
        buf.extend_from_slice(&chunk);
        let _ = body.flow_control().release_capacity(n);
        if want.is_none() && buf.len() >= PREFIX {
            if buf[0] != 0 {
                return Err((
                    INTERNAL,
                    format!("{target} sent a compressed message, which was not asked for"),
                ));
            }
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len > max_receive {
                return Err((
                    RESOURCE_EXHAUSTED,
                    format!("Received message larger than max ({len} vs. {max_receive})"),
                ));
            }
            buf.reserve((PREFIX + len).saturating_sub(buf.len()));
            want = Some(PREFIX + len);
        }
        if let Some(w) = want {
            if buf.len() > w {
                return Err((
                    INTERNAL,
                    format!("{target} sent more than one message in a unary answer"),
                ));
            }
        }
    }
    let trailers = body
        .trailers()
        .await
        .map_err(|e| h2_status(&e, target))?
        .unwrap_or_default();
    let message = match want {
        Some(w) if buf.len() == w => Some(buf.freeze().slice(PREFIX..)),
        Some(_) => {
            return Err((
                INTERNAL,
                format!("{target} ended the answer inside a message"),
            ))
        }
        None if buf.is_empty() => None,
        None => {
            return Err((
                INTERNAL,
                format!("{target} sent a truncated message prefix"),
            ))
        }
    };
    Ok((message, trailers))
}

async fn unary(
    conn: &Conn,
    path: &str,
    message: Bytes,
    timeout: Duration,
) -> Result<Bytes, (u16, String)> {
    let target = conn.target.as_str();
    let mut sender = conn.sender().await.map_err(|e| (UNAVAILABLE, e))?;
    let uri = Uri::builder()
        .scheme("http")
        .authority(target)
        .path_and_query(path)
        .build()
        .map_err(|e| (INTERNAL, format!("bad call path {path}: {e}")))?;
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .body(())
        .expect("request parts");
    let h = req.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/grpc"));
    h.insert("te", HeaderValue::from_static("trailers"));
    h.insert("grpc-timeout", grpc_timeout(timeout));
    h.insert(
        "user-agent",
        HeaderValue::from_static("embedgate-native-client"),
    );
    let (response, mut out) = sender
        .send_request(req, false)
        .map_err(|e| h2_status(&e, target))?;
    let mut prefix = BytesMut::with_capacity(PREFIX);
    prefix.put_u8(0);
    prefix.put_u32(message.len() as u32);
    let sending = async {
        send_all(&mut out, prefix.freeze()).await?;
        send_all(&mut out, message).await?;
        out.send_data(Bytes::new(), true)
    };
    // The answer may come (a refusal) before the request is sent whole: wait for either.
    let mut response = std::pin::pin!(response);
    tokio::select! {
        sent = sending => {
            if let Err(e) = sent {
                // the server may have answered and reset the rest of the request: its answer says why
                if let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_millis(0), &mut response).await {
                    return finish(resp, conn).await;
                }
                return Err(h2_status(&e, target));
            }
        }
        resp = &mut response => {
            let resp = resp.map_err(|e| h2_status(&e, target))?;
            return finish(resp, conn).await;
        }
    }
    let resp = response.await.map_err(|e| h2_status(&e, target))?;
    finish(resp, conn).await
}

async fn finish(resp: http::Response<RecvStream>, conn: &Conn) -> Result<Bytes, (u16, String)> {
    let target = conn.target.as_str();
    let (parts, body) = resp.into_parts();
    if parts.status != http::StatusCode::OK {
        let code = match parts.status.as_u16() {
            400 => INTERNAL,
            401 => 16,
            403 => 7,
            404 => 12,
            429 | 502 | 503 | 504 => UNAVAILABLE,
            _ => UNKNOWN,
        };
        return Err((
            code,
            format!("{target} answered HTTP status {}", parts.status.as_u16()),
        ));
    }
    if let Some(status) = status_of(&parts.headers) {
        return Err(if status.0 == 0 {
            (INTERNAL, format!("{target} answered OK without a message"))
        } else {
            status
        });
    }
    let (message, trailers) = answer(body, conn.max_receive, target).await?;
    match status_of(&trailers) {
        Some((0, _)) => {
            message.ok_or_else(|| (INTERNAL, format!("{target} answered OK without a message")))
        }
        Some(status) => Err(status),
        None => Err((
            INTERNAL,
            format!("{target} ended the call without a status"),
        )),
    }
}

/// The gateway's native backend client: every target's connection on one runtime thread.
#[pyclass(module = "embedgate_native")]
pub struct GrpcClient {
    handle: Handle,
    hub: Arc<Hub>,
    reader: StdUnixStream,
    conns: Mutex<HashMap<String, Arc<Conn>>>,
    next: AtomicU64,
    window: u32,
    max_receive: usize,
    stop: watch::Sender<bool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[pymethods]
impl GrpcClient {
    /// `max_receive`: the largest answer accepted (bytes); `window`: each call's HTTP/2 receive window (the
    /// connection's is four times it).
    #[new]
    #[pyo3(signature = (max_receive=512 << 20, window=8 << 20))]
    fn new(max_receive: usize, window: u32) -> PyResult<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| PyOSError::new_err(format!("gRPC client runtime: {e}")))?;
        let handle = runtime.handle().clone();
        let (stop, mut stop_rx) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("embedgate-client".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let _ = stop_rx.wait_for(|s| *s).await;
                });
            })
            .map_err(|e| PyOSError::new_err(format!("gRPC client thread: {e}")))?;
        let (reader, wake) =
            StdUnixStream::pair().map_err(|e| PyOSError::new_err(format!("socket pair: {e}")))?;
        reader
            .set_nonblocking(true)
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        wake.set_nonblocking(true)
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let hub = Arc::new(Hub {
            done: Mutex::new(Vec::new()),
            wake,
            signalled: AtomicBool::new(false),
            running: Mutex::new(HashMap::new()),
        });
        Ok(GrpcClient {
            handle,
            hub,
            reader,
            conns: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            window: window.clamp(1 << 16, (1 << 31) - 1),
            max_receive,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The socket to watch for readability: finished calls are waiting for `drain`.
    fn fileno(&self) -> i32 {
        self.reader.as_raw_fd()
    }

    /// Start a unary call of `path` on `target` (`host:port`) with `message` (a serialized request, borrowed until
    /// the call ends) and `timeout_s` seconds; returns the call's token, which `drain` gives back with its outcome.
    fn call(
        &self,
        target: &str,
        path: &str,
        message: PyBackedBytes,
        timeout_s: f64,
    ) -> PyResult<u64> {
        if *self.stop.borrow() {
            return Err(PyRuntimeError::new_err("the gRPC client is closed"));
        }
        if !(timeout_s.is_finite() && timeout_s > 0.0) {
            return Err(PyValueError::new_err(format!(
                "timeout must be a positive number of seconds, not {timeout_s}"
            )));
        }
        let conn = {
            let mut conns = self.conns.lock().expect("connections");
            conns
                .entry(target.to_string())
                .or_insert_with(|| {
                    Arc::new(Conn {
                        target: target.to_string(),
                        window: self.window,
                        max_receive: self.max_receive,
                        conn: Reconnecting::new(),
                    })
                })
                .clone()
        };
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        let timeout = Duration::from_secs_f64(timeout_s.min(86_400.0 * 365.0));
        let path = path.to_string();
        let message = Bytes::from_owner(message);
        let hub = self.hub.clone();
        let mut running = self.hub.running.lock().expect("running calls");
        let task = self.handle.spawn(async move {
            let done =
                match tokio::time::timeout(timeout, unary(&conn, &path, message, timeout)).await {
                    Ok(Ok(body)) => Done {
                        token,
                        code: 0,
                        details: String::new(),
                        body: Some(body),
                    },
                    Ok(Err((code, details))) => Done::failed(token, code, details),
                    Err(_) => Done::failed(token, DEADLINE_EXCEEDED, "Deadline Exceeded"),
                };
            hub.finish(done);
        });
        running.insert(token, task.abort_handle());
        Ok(token)
    }

    /// Cancel a call still running (its stream is reset); `drain` gives it back CANCELLED. A finished call: no-op.
    fn cancel(&self, token: u64) {
        let handle = self
            .hub
            .running
            .lock()
            .expect("running calls")
            .remove(&token);
        if let Some(h) = handle {
            h.abort();
            self.hub.finish(Done::failed(token, CANCELLED, "Cancelled"));
        }
    }

    /// The calls finished since the last drain: `(token, code, details, message)` (message None unless code 0).
    fn drain<'py>(&self, py: Python<'py>) -> Vec<(u64, u16, String, Option<Bound<'py, PyBytes>>)> {
        let mut sink = [0u8; 64];
        while matches!((&self.reader).read(&mut sink), Ok(n) if n > 0) {}
        self.hub.signalled.store(false, Ordering::Release);
        let done = std::mem::take(&mut *self.hub.done.lock().expect("finished calls"));
        done.into_iter()
            .map(|d| {
                (
                    d.token,
                    d.code,
                    d.details,
                    d.body.map(|b| PyBytes::new(py, &b)),
                )
            })
            .collect()
    }

    /// Calls started and not yet finished.
    fn running(&self) -> usize {
        self.hub.running.lock().expect("running calls").len()
    }

    /// Stop the runtime: running calls are dropped (their streams reset) and never finish.
    fn close(&self, py: Python<'_>) {
        let _ = self.stop.send(true);
        let thread = self.thread.lock().expect("client thread").take();
        if let Some(t) = thread {
            py.allow_threads(|| {
                let _ = t.join();
            });
        }
    }
}

impl Drop for GrpcClient {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_keeps_eight_digits() {
        assert_eq!(grpc_timeout(Duration::from_micros(1500)), "1500u");
        assert_eq!(grpc_timeout(Duration::from_secs(30)), "30000000u");
        assert_eq!(grpc_timeout(Duration::from_secs(1000)), "1000000m");
        assert_eq!(grpc_timeout(Duration::from_secs(10_000_000)), "10000000S");
        assert_eq!(grpc_timeout(Duration::from_nanos(1)), "1u");
    }

    #[test]
    fn grpc_message_is_percent_decoded() {
        assert_eq!(percent_decoded(b"a%20b%25c"), "a b%c");
        assert_eq!(percent_decoded(b"bad %zz end %4"), "bad %zz end %4");
        assert_eq!(percent_decoded("é".as_bytes()), "é");
        assert_eq!(percent_decoded(b"%C3%A9"), "é");
    }

    #[test]
    fn status_comes_from_grpc_status_and_message() {
        let mut h = HeaderMap::new();
        assert!(status_of(&h).is_none());
        h.insert("grpc-status", HeaderValue::from_static("5"));
        h.insert(
            "grpc-message",
            HeaderValue::from_static("Servable%20not%20found"),
        );
        assert_eq!(status_of(&h), Some((5, "Servable not found".to_string())));
        h.insert("grpc-status", HeaderValue::from_static("x"));
        assert_eq!(status_of(&h).map(|s| s.0), Some(UNKNOWN));
    }
}
