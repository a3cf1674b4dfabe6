//! The gRPC gate: the gateway's public gRPC port, served natively, in front of the Python gRPC front.
//!
//! Why: a call refused in Python costs the `grpc.aio` server about 0.4 ms of CPU before any gateway code runs, and
//! under a flood the calls wait in gRPC core's queue for the Python thread, refusals included (issue 21: a
//! RESOURCE_EXHAUSTED median of seconds at 3x capacity). The gate is an HTTP/2 server on its own OS thread (a tokio
//! runtime; it never takes the GIL). Each call to an admitted method (`/tensorflow.serving.PredictionService/*`,
//! `/tensorflow.serving.ModelService/*`) is either refused at once, here, or relayed frame by frame to the Python
//! front on a private Unix socket (one HTTP/2 connection, every call a stream of it; headers, messages, trailers and
//! resets as they come, within HTTP/2 flow control on both sides). A call is refused while
//! * the gateway's admission would refuse any request now (the state the gateway publishes with
//!   [`GrpcGate::set_state`] on every change: no free slot and the queue full, or the loop lagging), with the very
//!   text the gateway's own refusal has; or
//! * the calls relayed and not yet answered are as many as the gateway can take (its concurrency limit plus its
//!   queue): a call past that would wait in the Python front's queue, unseen by admission.
//!
//! Every other call (the health service, reflection) is relayed as it is. Refusals are counted here by reason and
//! read by the gateway's metrics ([`GrpcGate::take_refused`]).

use std::collections::HashMap;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use tokio::net::{TcpListener, TcpSocket, TcpStream, UnixStream};
use tokio::sync::watch;

use crate::direct::{self, Budget, Direct, DirectCall};

const GUARDED: [&str; 2] = [
    "/tensorflow.serving.PredictionService/",
    "/tensorflow.serving.ModelService/",
];

/// Why admission refuses now (published by the gateway).
pub(crate) const OPEN: u8 = 0;
pub(crate) const QUEUE_FULL: u8 = 1;
pub(crate) const LOOP_LAG: u8 = 2;

const WINDOW: u32 = 1 << 20; // per stream, both connections (clients' streams: `stream_window`, at least this)
const CONN_WINDOW: u32 = 1 << 24; // per connection (clients' connections: at least 16 x their stream window)
pub(crate) const MAX_FRAME: u32 = 1 << 20; // what the gate accepts in one DATA frame (clients may send smaller)
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

struct Shared {
    adm: AdmissionState,     // what the gateway's admission published
    relayed: AtomicI64,      // relayed guarded calls not yet answered
    refused: [AtomicU64; 3], // queue_full, loop_lag, gate_full
    status: u16,             // gRPC code of a refusal: 8 RESOURCE_EXHAUSTED or 14 UNAVAILABLE
    closing: AtomicBool,
    direct: Option<Direct>, // whole-message methods answered by Python worker threads (src/direct.rs)
    window: u32,            // HTTP/2 flow-control window of a client's stream
}

impl Shared {
    /// The refusal's reason index and text, or None to relay (takes a relay slot when it answers None).
    fn admit(&self) -> Option<(usize, String)> {
        if let Some(refusal) = self.adm.refusal() {
            return Some(refusal);
        }
        let cap = self.adm.capacity.load(Ordering::Acquire);
        let before = self.relayed.fetch_add(1, Ordering::AcqRel);
        if before < cap {
            return None;
        }
        self.relayed.fetch_sub(1, Ordering::AcqRel);
        Some((
            2,
            format!(
                "Too many calls in flight at the gRPC front: {before} at its limit of {cap} (the concurrency limit \
                 plus the admission queue and a margin, max_in_flight={}); retry later",
                self.adm.max_in_flight
            ),
        ))
    }
}

/// The gateway's admission as it publishes it to a native gate (`gateway.admission.Admission.observe`): why a
/// request arriving now would be refused, the numbers of the refusal's text, and the relay bound.
pub(crate) struct AdmissionState {
    reason: AtomicU8,
    pub(crate) in_flight: AtomicI64, // admitted and not released
    pub(crate) limit: AtomicI64,     // the concurrency limit
    pub(crate) waiting: AtomicI64,   // the queue
    lag_ms: AtomicI64,               // how late its loop runs
    pub(crate) capacity: AtomicI64,  // requests a gate may relay at once
    pub(crate) room: AtomicI64, // requests admission holds at most (limit plus queue room); REST gate only
    pub(crate) pending: AtomicI64, // let through by the Python server, body in, not yet admitted; REST gate only
    pub(crate) max_in_flight: i64,
    max_lag_text: String, // admission.max_loop_lag_s as the gateway words it
}

impl AdmissionState {
    pub(crate) fn new(capacity: i64, max_in_flight: i64, max_lag_text: &str) -> AdmissionState {
        AdmissionState {
            reason: AtomicU8::new(OPEN),
            in_flight: AtomicI64::new(0),
            limit: AtomicI64::new(max_in_flight),
            waiting: AtomicI64::new(0),
            lag_ms: AtomicI64::new(0),
            capacity: AtomicI64::new(capacity),
            room: AtomicI64::new(i64::MAX),
            pending: AtomicI64::new(0),
            max_in_flight,
            max_lag_text: max_lag_text.to_string(),
        }
    }

    /// What the gateway published (its `set_state` call, the same for both gates).
    pub(crate) fn set(
        &self,
        reason: u8,
        in_flight: i64,
        limit: i64,
        waiting: i64,
        lag_ms: i64,
        capacity: i64,
        (room, pending): (i64, i64),
    ) {
        self.in_flight.store(in_flight, Ordering::Relaxed);
        self.room.store(room, Ordering::Relaxed);
        self.pending.store(pending, Ordering::Relaxed);
        self.limit.store(limit, Ordering::Relaxed);
        self.waiting.store(waiting, Ordering::Relaxed);
        self.lag_ms.store(lag_ms, Ordering::Relaxed);
        self.capacity.store(capacity, Ordering::Release);
        self.reason.store(reason.min(LOOP_LAG), Ordering::Release);
    }

    /// The refusal's reason index (0 queue full, 1 loop lagging) and text, as the gateway's admission words it
    /// (`gateway.admission.Admission._shed`); None while it admits.
    pub(crate) fn refusal(&self) -> Option<(usize, String)> {
        let max_in_flight = self.max_in_flight;
        match self.reason.load(Ordering::Acquire) {
            QUEUE_FULL => Some((
                0,
                format!(
                    "Too many requests in flight: {} at the concurrency limit of {} (max_in_flight={max_in_flight}), \
                     {} waiting (admission.max_queue); retry later",
                    self.in_flight.load(Ordering::Relaxed),
                    self.limit.load(Ordering::Relaxed),
                    self.waiting.load(Ordering::Relaxed)
                ),
            )),
            LOOP_LAG => Some((
                1,
                format!(
                    "Overloaded: the gateway is running {} ms behind (admission.max_loop_lag_s={}); retry later",
                    self.lag_ms.load(Ordering::Relaxed),
                    self.max_lag_text
                ),
            )),
            _ => None,
        }
    }
}

/// A relay slot, given back when the call ends however it ends.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.relayed.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An HTTP/2 client connection, opened on first use and again when it breaks (the gate's to the Python front, the
/// native client's to each backend: src/client.rs). The lock is held only to read or replace the sender, never while
/// a call waits for the connection to take another stream.
pub(crate) struct Reconnecting {
    conn: tokio::sync::Mutex<(u64, Option<SendRequest<Bytes>>)>, // (how many times it was opened, the sender)
}

impl Reconnecting {
    pub(crate) fn new() -> Reconnecting {
        Reconnecting {
            conn: tokio::sync::Mutex::new((0, None)),
        }
    }

    /// A sender ready for a new stream: the current connection's, or one `open` makes when it is gone.
    pub(crate) async fn sender<E, F, Fut>(&self, open: F) -> Result<SendRequest<Bytes>, E>
    where
        E: From<h2::Error>,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<SendRequest<Bytes>, E>>,
    {
        let (opened, current) = {
            let guard = self.conn.lock().await;
            (guard.0, guard.1.clone())
        };
        if let Some(s) = current {
            if let Ok(ready) = s.ready().await {
                return Ok(ready);
            }
        }
        let mut guard = self.conn.lock().await;
        if guard.0 != opened {
            // another call opened it again meanwhile: use that connection
            if let Some(s) = guard.1.clone() {
                drop(guard);
                return Ok(s.ready().await?);
            }
        }
        let send = open().await?;
        *guard = (guard.0 + 1, Some(send.clone()));
        drop(guard);
        Ok(send.ready().await?)
    }
}

/// The one HTTP/2 connection to the Python front.
struct Upstream {
    path: PathBuf,
    conn: Reconnecting,
}

impl Upstream {
    async fn sender(&self) -> Result<SendRequest<Bytes>, h2::Error> {
        self.conn
            .sender(|| async {
                let io = UnixStream::connect(&self.path)
                    .await
                    .map_err(|_| h2::Error::from(Reason::REFUSED_STREAM))?;
                let (send, conn) = h2::client::Builder::new()
                    .max_frame_size(MAX_FRAME)
                    .initial_window_size(WINDOW)
                    .initial_connection_window_size(CONN_WINDOW)
                    .max_concurrent_reset_streams(4096)
                    .handshake::<_, Bytes>(io)
                    .await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(send)
            })
            .await
    }
}

/// The percent-encoding of a `grpc-message` (gRPC's HTTP/2 protocol: bytes outside 0x20-0x7E and '%').
pub(crate) fn grpc_message(text: &str) -> HeaderValue {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static("refused"))
}

pub(crate) fn trailer_map(code: u16, details: &str, extra: &[(String, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert("grpc-status", HeaderValue::from(code));
    if !details.is_empty() {
        map.insert("grpc-message", grpc_message(details));
    }
    for (k, v) in extra {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            map.append(k, v);
        }
    }
    map
}

/// A trailers-only answer (status, text and trailers in the one HEADERS frame that ends the stream).
pub(crate) fn trailers_only(
    respond: &mut SendResponse<Bytes>,
    code: u16,
    details: &str,
    extra: &[(String, String)],
) {
    let mut resp = Response::builder()
        .status(200)
        .body(())
        .expect("static response parts");
    let headers = resp.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.extend(trailer_map(code, details, extra));
    if respond.send_response(resp, true).is_err() {
        respond.send_reset(Reason::INTERNAL_ERROR);
    }
}

/// Send `chunk` on `out` as flow control allows (so the gate holds at most a window of it).
pub(crate) async fn send_all(
    out: &mut SendStream<Bytes>,
    mut chunk: Bytes,
) -> Result<(), h2::Error> {
    while !chunk.is_empty() {
        out.reserve_capacity(chunk.len());
        let granted = match poll_fn(|cx| out.poll_capacity(cx)).await {
            Some(r) => r?,
            None => return Err(h2::Error::from(Reason::CANCEL)),
        };
        if granted == 0 {
            continue;
        }
        let piece = chunk.split_to(granted.min(chunk.len()));
        out.send_data(piece, false)?;
    }
    Ok(())
}

/// Copy a body (data, then trailers or its end) from `body` to `out`, giving `body`'s window back as it goes.
async fn pump(mut body: RecvStream, out: &mut SendStream<Bytes>) -> Result<(), h2::Error> {
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let n = chunk.len();
        send_all(out, chunk).await?;
        let _ = body.flow_control().release_capacity(n);
    }
    match body.trailers().await? {
        Some(trailers) => out.send_trailers(trailers),
        None => out.send_data(Bytes::new(), true),
    }
}

fn upstream_request(head: &http::request::Parts) -> Request<()> {
    let path = head.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let uri = Uri::builder()
        .scheme("http")
        .authority(
            head.uri
                .authority()
                .map(|a| a.as_str())
                .unwrap_or("localhost"),
        )
        .path_and_query(path)
        .build()
        .unwrap_or_else(|_| Uri::from_static("http://localhost/"));
    let mut req = Request::builder()
        .method(head.method.clone())
        .uri(uri)
        .body(())
        .expect("request parts");
    *req.headers_mut() = head.headers.clone();
    req
}

/// Relay one call to the Python front and its answer back.
async fn relay(
    req: Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
    up: &Upstream,
) -> Result<(), h2::Error> {
    let (head, body) = req.into_parts();
    let mut sender = up.sender().await?;
    let ended = body.is_end_stream();
    let (answer, mut out) = sender.send_request(upstream_request(&head), ended)?;
    // The request body goes up while the answer is awaited: the front may answer (a refusal, a missing token)
    // before it reads the message.
    let up_task = tokio::spawn(async move {
        if ended {
            return Ok(());
        }
        let r = pump(body, &mut out).await;
        if r.is_err() {
            out.send_reset(Reason::CANCEL);
        }
        r
    });
    let answer = tokio::select! {
        a = answer => a,
        reset = poll_fn(|cx| respond.poll_reset(cx)) => {
            up_task.abort(); // dropping its SendStream resets the upstream stream
            return reset.map(|_| ());
        }
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            up_task.abort();
            return Err(e);
        }
    };
    let (parts, rbody) = answer.into_parts();
    let done = rbody.is_end_stream();
    let mut down = respond.send_response(Response::from_parts(parts, ()), done)?;
    if !done {
        let r = pump(rbody, &mut down).await;
        if r.is_err() {
            down.send_reset(Reason::CANCEL);
        }
    }
    // An answer before the whole request was read (trailers-only refusal): the rest of the request is not needed.
    up_task.abort();
    Ok(())
}

async fn call(
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    shared: Arc<Shared>,
    up: Arc<Upstream>,
) {
    let path = req.uri().path();
    let guarded = GUARDED.iter().any(|p| path.starts_with(p));
    let _slot = if guarded {
        if let Some((reason, text)) = shared.admit() {
            shared.refused[reason].fetch_add(1, Ordering::Relaxed);
            trailers_only(&mut respond, shared.status, &text, &[]);
            return;
        }
        Some(Slot(shared.clone()))
    } else {
        None
    };
    if let Some(direct) = shared.direct.as_ref() {
        if direct.takes(&req) {
            direct::serve(req, respond, direct).await;
            return;
        }
    }
    if relay(req, &mut respond, &up).await.is_err() {
        // Upstream gone before it answered: UNAVAILABLE (14), as a client of a restarting server sees it.
        if shared.closing.load(Ordering::Acquire) {
            respond.send_reset(Reason::REFUSED_STREAM);
        } else {
            trailers_only(
                &mut respond,
                14,
                "The gateway's gRPC front is not reachable; retry later",
                &[],
            );
        }
    }
}

async fn connection(
    sock: TcpStream,
    shared: Arc<Shared>,
    up: Arc<Upstream>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = sock.set_nodelay(true);
    let handshake = h2::server::Builder::new()
        .max_frame_size(MAX_FRAME)
        .initial_window_size(shared.window)
        .initial_connection_window_size(CONN_WINDOW.max(shared.window.saturating_mul(16)))
        .max_concurrent_streams(4096)
        .max_concurrent_reset_streams(4096)
        .handshake::<_, Bytes>(sock);
    // A client that connects and never finishes the HTTP/2 preface holds a task and a socket: not for long.
    let mut conn = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(c)) => c,
        _ => return,
    };
    let mut stopping = *stop.borrow();
    if stopping {
        conn.graceful_shutdown();
    }
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    tokio::spawn(call(req, respond, shared.clone(), up.clone()));
                }
                _ => break,
            },
            changed = stop.changed(), if !stopping => {
                stopping = true;
                if changed.is_ok() {
                    conn.graceful_shutdown();
                }
            }
        }
    }
}

async fn serve(
    listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
    up: Arc<Upstream>,
    stop: watch::Receiver<bool>,
) {
    let mut tasks = Vec::new();
    for listener in listeners {
        let (shared, up, mut stop) = (shared.clone(), up.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut conns = Vec::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        if let Ok((sock, _)) = accepted {
                            conns.push(tokio::spawn(connection(sock, shared.clone(), up.clone(), stop.clone())));
                            conns.retain(|t: &tokio::task::JoinHandle<()>| !t.is_finished());
                        }
                    }
                    _ = stop.changed() => break,
                }
            }
            drop(listener);
            for t in conns {
                let _ = t.await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Listeners on every address `host` resolves to (brackets around an IPv6 address allowed), one port for all of
/// them (`port` 0: the first one's free port).
pub(crate) async fn bind_host(
    host: &str,
    port: u16,
    reuse_port: bool,
) -> std::io::Result<Vec<TcpListener>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    if addrs.is_empty() {
        return Err(std::io::Error::other("no address"));
    }
    let mut seen = HashMap::new();
    let addrs: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|a| seen.insert(*a, ()).is_none())
        .collect();
    bind(&addrs, 4096, reuse_port)
}

fn bind(addrs: &[SocketAddr], backlog: u32, reuse_port: bool) -> std::io::Result<Vec<TcpListener>> {
    let mut out = Vec::new();
    let mut port = addrs.first().map(|a| a.port()).unwrap_or(0);
    for addr in addrs {
        let mut addr = *addr;
        addr.set_port(port);
        let sock = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        sock.set_reuseaddr(true)?;
        sock.set_reuseport(reuse_port)?; // several gateway workers share the port, as gRPC's own server does
        sock.set_nodelay(true)?;
        sock.bind(addr)?;
        let listener = sock.listen(backlog)?;
        port = listener.local_addr()?.port();
        out.push(listener);
    }
    Ok(out)
}

/// The gate. Built by the gateway's gRPC front (`gateway.grpc_front.server`) through `gateway.native.grpc_gate`.
#[pyclass(module = "embedgate_native")]
pub struct GrpcGate {
    shared: Arc<Shared>,
    port: u16,
    stop: watch::Sender<bool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[pymethods]
impl GrpcGate {
    /// Listen on `host:port` (0: any free port; every address `host` resolves to) and relay to the HTTP/2 server on
    /// the Unix socket `upstream`. `max_in_flight`, `max_lag_text` and `status` word refusals as the gateway's
    /// admission does; `capacity` is the first relay bound (see `set_state`). The unary methods named in `direct`
    /// (paths such as `/tensorflow.serving.PredictionService/Predict`) are answered by Python worker threads instead
    /// (`next_call`; src/direct.rs), with messages of at most `max_message` bytes and at most `max_calls` of them
    /// received or queued at once. `reuse_port`: share the port with other processes (SO_REUSEPORT).
    /// `stream_window`: the HTTP/2 flow-control window of a client's call (at least 1 MiB): what a client may send
    /// before the gate reads it, so a larger one takes a large message in fewer round trips. `max_bytes` bounds the
    /// bytes of whole messages received and not yet taken (0: no bound); a message that does not fit is refused
    /// RESOURCE_EXHAUSTED with `bytes_text` as soon as its prefix says its length. A message not received within
    /// `receive_timeout_s` of its call (0: no bound) is refused DEADLINE_EXCEEDED with `timeout_text`. `tokens`: as
    /// `set_tokens`, from the first call on.
    #[new]
    #[pyo3(signature = (
        host, port, upstream, capacity, max_in_flight, max_lag_text, status,
        direct=Vec::new(), max_message=64 << 20, max_calls=256, reuse_port=true, stream_window=1 << 20,
        max_bytes=0, bytes_text=String::new(), receive_timeout_s=0.0, timeout_text=String::new(), tokens=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        host: &str,
        port: u16,
        upstream: &str,
        capacity: i64,
        max_in_flight: i64,
        max_lag_text: &str,
        status: u16,
        direct: Vec<String>,
        max_message: usize,
        max_calls: usize,
        reuse_port: bool,
        stream_window: u32,
        max_bytes: usize,
        bytes_text: String,
        receive_timeout_s: f64,
        timeout_text: String,
        tokens: Option<Vec<Vec<u8>>>,
    ) -> PyResult<Self> {
        if status != 8 && status != 14 {
            return Err(PyValueError::new_err(format!(
                "refusal status must be 8 or 14, not {status}"
            )));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| PyOSError::new_err(format!("gRPC gate runtime: {e}")))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let listeners = runtime
            .block_on(bind_host(&host, port, reuse_port))
            .map_err(|e| {
                PyOSError::new_err(format!("cannot listen for gRPC on {host}:{port}: {e}"))
            })?;
        let bound = listeners[0].local_addr().map(|a| a.port()).unwrap_or(0);
        let shared = Arc::new(Shared {
            adm: AdmissionState::new(capacity, max_in_flight, max_lag_text),
            relayed: AtomicI64::new(0),
            refused: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            status,
            closing: AtomicBool::new(false),
            direct: (!direct.is_empty()).then(|| {
                let d = Direct::new(
                    direct,
                    max_message,
                    max_calls,
                    Budget::new(max_bytes, bytes_text),
                );
                d.set_tokens(tokens);
                if receive_timeout_s > 0.0 {
                    d.with_receive_timeout(
                        Duration::from_secs_f64(receive_timeout_s.min(86_400.0)),
                        timeout_text,
                    )
                } else {
                    d
                }
            }),
            window: stream_window.clamp(WINDOW, (1 << 31) - 1),
        });
        let up = Arc::new(Upstream {
            path: PathBuf::from(upstream),
            conn: Reconnecting::new(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("embedgate-gate".into())
            .spawn(move || runtime.block_on(serve(listeners, s, up, stop_rx)))
            .map_err(|e| PyOSError::new_err(format!("gRPC gate thread: {e}")))?;
        Ok(GrpcGate {
            shared,
            port: bound,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The port listened on.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// The gateway's admission now: `reason` 0 (admits), 1 (queue full) or 2 (loop lagging), its numbers for the
    /// refusal's text, and `capacity`, the relayed calls allowed at once (its limit, queue room and a margin).
    /// `room` and `pending` are what admission publishes to every observer for the REST gate, which needs them to
    /// count requests uvicorn has taken but admission not yet seen; this gate stores them and bounds its calls by
    /// `capacity` alone, because every call it lets through counts in `relayed` from that moment until it is
    /// answered, so none is on its way to admission uncounted.
    #[pyo3(signature = (reason, in_flight, limit, waiting, lag_ms, capacity, room = i64::MAX, pending = 0))]
    #[allow(clippy::too_many_arguments)]
    fn set_state(
        &self,
        reason: u8,
        in_flight: i64,
        limit: i64,
        waiting: i64,
        lag_ms: i64,
        capacity: i64,
        room: i64,
        pending: i64,
    ) {
        self.shared.adm.set(
            reason,
            in_flight,
            limit,
            waiting,
            lag_ms,
            capacity,
            (room, pending),
        );
    }

    /// The next whole-message call for a worker thread, waiting up to `timeout_s` without the interpreter lock;
    /// None when none came (or the gate has none: no `direct` methods, or closed and its queue empty).
    fn next_call(&self, py: Python<'_>, timeout_s: f64) -> Option<DirectCall> {
        direct::next_call(py, self.shared.direct.as_ref()?, timeout_s)
    }

    /// The bearer tokens whose calls to whole-message methods have their message received (None: every call's).
    /// A call without exactly one `authorization: Bearer <token>` naming one of them is still handed to a worker,
    /// its message never read (`DirectCall.received` False), for the worker to refuse in its own words.
    #[pyo3(signature = (tokens))]
    fn set_tokens(&self, tokens: Option<Vec<Vec<u8>>>) {
        if let Some(direct) = self.shared.direct.as_ref() {
            direct.set_tokens(tokens);
        }
    }

    /// Refusals since the last call, by reason: (queue_full, loop_lag, gate_full, buffered_bytes: whole messages
    /// that did not fit `max_bytes`).
    fn take_refused(&self) -> (u64, u64, u64, u64) {
        let r = &self.shared.refused;
        let bytes = self
            .shared
            .direct
            .as_ref()
            .map(|d| d.budget.refused.swap(0, Ordering::Relaxed))
            .unwrap_or(0);
        (
            r[0].swap(0, Ordering::Relaxed),
            r[1].swap(0, Ordering::Relaxed),
            r[2].swap(0, Ordering::Relaxed),
            bytes,
        )
    }

    /// Whether `close` was called (`next_call` then answers None once the queued calls are taken).
    #[getter]
    fn closed(&self) -> bool {
        self.shared.closing.load(Ordering::Acquire)
    }

    /// Guarded calls relayed and not yet answered.
    #[getter]
    fn relayed(&self) -> i64 {
        self.shared.relayed.load(Ordering::Acquire)
    }

    /// Stop listening, tell every client to go away (HTTP/2 GOAWAY) and wait up to `grace_s` for the calls in
    /// flight (whole-message calls need their workers meanwhile); then the thread ends with the process or at the
    /// next close, and `next_call` answers None once the queued calls are taken.
    fn close(&self, py: Python<'_>, grace_s: f64) {
        self.shared.closing.store(true, Ordering::Release);
        let _ = self.stop.send(true);
        if let Some(direct) = self.shared.direct.as_ref() {
            direct.close(); // calls already queued are still taken; new ones are refused UNAVAILABLE
        }
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(handle) = handle {
            py.allow_threads(|| {
                let deadline =
                    std::time::Instant::now() + Duration::from_secs_f64(grace_s.max(0.0));
                while !handle.is_finished() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if handle.is_finished() {
                    let _ = handle.join();
                }
            });
        }
        if let Some(direct) = self.shared.direct.as_ref() {
            direct.close(); // after the drain: the workers' next_call answers None once the queue is empty
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(capacity: i64) -> Shared {
        let adm = AdmissionState::new(capacity, 8, "0.25");
        adm.limit.store(2, Ordering::Relaxed);
        Shared {
            adm,
            relayed: AtomicI64::new(0),
            refused: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            status: 8,
            closing: AtomicBool::new(false),
            direct: None,
            window: WINDOW,
        }
    }

    #[test]
    fn relays_up_to_the_capacity_then_refuses_and_gives_slots_back() {
        let s = Arc::new(shared(2));
        let a = s.admit();
        let b = s.admit();
        assert!(a.is_none() && b.is_none());
        let (reason, text) = s.admit().expect("third call refused");
        assert_eq!(reason, 2);
        assert!(
            text.starts_with("Too many calls in flight at the gRPC front: 2 at its limit of 2"),
            "{text}"
        );
        assert_eq!(s.relayed.load(Ordering::Acquire), 2); // the refused call took no slot
        drop(Slot(s.clone()));
        assert!(s.admit().is_none());
    }

    #[test]
    fn admission_state_words_the_refusal_as_the_gateway_does() {
        let s = shared(100);
        s.adm.in_flight.store(2, Ordering::Relaxed);
        s.adm.waiting.store(3, Ordering::Relaxed);
        s.adm.reason.store(QUEUE_FULL, Ordering::Release);
        let (reason, text) = s.admit().expect("refused");
        assert_eq!(reason, 0);
        assert_eq!(
            text,
            "Too many requests in flight: 2 at the concurrency limit of 2 (max_in_flight=8), 3 waiting \
             (admission.max_queue); retry later"
        );
        s.adm.lag_ms.store(380, Ordering::Relaxed);
        s.adm.reason.store(LOOP_LAG, Ordering::Release);
        let (reason, text) = s.admit().expect("refused");
        assert_eq!(reason, 1);
        assert_eq!(
            text,
            "Overloaded: the gateway is running 380 ms behind (admission.max_loop_lag_s=0.25); retry later"
        );
        assert_eq!(s.relayed.load(Ordering::Acquire), 0);
    }

    #[test]
    fn grpc_message_percent_encodes() {
        assert_eq!(grpc_message("a b%c").to_str().unwrap(), "a b%25c");
        assert_eq!(grpc_message("é").to_str().unwrap(), "%C3%A9");
    }
}
