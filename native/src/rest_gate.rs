//! The REST gate: the gateway's public REST port, served natively, in front of the Python HTTP server (uvicorn).
//!
//! Why: under overload a 429 written by the gateway's HTTP protocol costs about 0.14 ms of CPU on the event loop,
//! mostly asyncio's transport work for a request (issue 21: at 3x capacity those refusals took the CPU the admitted
//! requests needed, and each waited for the loop's turn). The gate is an HTTP/1.1 listener on its own OS thread (a
//! tokio runtime; it never takes the GIL). For each request on a client connection it either
//! * answers the 429 (503 with `overload_status: 503`) itself, with the very bytes the gateway's protocol writes, when
//!   the request is to `/v1/...` and the gateway's admission would refuse any request now (the state it publishes on
//!   every change, as for the gRPC gate), or when admission's holdings plus the `/v1/` requests relayed and not yet
//!   judged by the Python server fill admission's room (it would refuse the request on arrival), or when the
//!   requests relayed and not yet answered are as many as the gateway can take (its limit, its queue room and a
//!   margin: more would wait in the Python server, unseen); or
//! * relays it to the Python server on a private Unix socket (one upstream connection per client connection, opened
//!   at its first relayed request): the head and the body as they come, then the answer back, framed by its
//!   `Content-Length`.
//!
//! Only plain requests are judged here: one read holding the whole head of an HTTP/1.1 request that parses, with no
//! `Transfer-Encoding`, `Expect` or `Upgrade`, at most one `Content-Length`, and `Connection` absent, `keep-alive` or
//! `close`. At the first request or answer that is anything else (a head split across reads, chunked bodies,
//! HTTP/1.0, an answer without a length) the connection becomes a byte tunnel to the Python server for good, which
//! then applies every rule of its own (limits, timeouts, errors) exactly as without the gate. A client connection
//! idle for `keep_alive_s` with no upstream connection is closed; one with an upstream connection is closed when the
//! Python server closes that one (its own keep-alive).

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::unix::{OwnedReadHalf as UpRead, OwnedWriteHalf as UpWrite};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::watch;

use crate::gate::{bind_host, AdmissionState};

const READ: usize = 64 * 1024; // bytes read at once from either side
const MAX_HEADERS: usize = 64; // a request or answer with more headers goes through the tunnel
const MAX_ANSWER_HEAD: usize = 64 * 1024; // an answer head longer than this: tunnel
const MAX_PIPELINED: usize = 1 << 20; // bytes read ahead from a client while its answer is awaited

struct State {
    adm: AdmissionState, // what the gateway's admission published
    relayed: AtomicI64,  // relayed, body up, answer not yet relayed back
    // `/v1/` requests whose head went up and that the Python server has not yet reported (`seen`); and the `/v1/`
    // requests relayed and not yet answered, which bound it (see `admit`)
    unseen: AtomicI64,
    outstanding: AtomicI64,
    uploading: AtomicI64, // of those not yet reported, the ones whose body is still coming up (not on their way yet)
    refused: [AtomicU64; 3], // queue_full, loop_lag, rest_gate
    status_line: &'static str, // "429 Too Many Requests" or "503 Service Unavailable"
    retry_after: u32,
    upstream: PathBuf,
    keep_alive: Duration,
}

impl State {
    /// The refusal (reason index and text) of a request arriving now, or None to relay it: refused while admission
    /// refuses; while the requests admission holds (in flight and waiting) plus those on their way to it (let
    /// through by the Python server and not yet counted, or relayed and not yet judged there) fill its room (its
    /// limit plus its queue room), as admission would refuse it on arrival, at three times the CPU; and at the relay
    /// bound, which counts requests whose body is up and whose answer is awaited (`relay` takes the slot).
    fn admit(&self) -> Option<(usize, String)> {
        if let Some(refusal) = self.adm.refusal() {
            return Some(refusal);
        }
        let adm = &self.adm;
        let unseen = self
            .unseen
            .load(Ordering::Acquire)
            .min(self.outstanding.load(Ordering::Acquire));
        let on_way = (unseen - self.uploading.load(Ordering::Acquire)).max(0)
            + adm.pending.load(Ordering::Relaxed).max(0);
        if on_way > 0 {
            let (in_flight, waiting) = (
                adm.in_flight.load(Ordering::Relaxed),
                adm.waiting.load(Ordering::Relaxed),
            );
            if in_flight + waiting + on_way >= adm.room.load(Ordering::Relaxed) {
                return Some((
                    2,
                    format!(
                        "Too many requests in flight: {in_flight} at the concurrency limit of {} \
                         (max_in_flight={}), {waiting} waiting (admission.max_queue) and {on_way} on their way; \
                         retry later",
                        adm.limit.load(Ordering::Relaxed),
                        adm.max_in_flight
                    ),
                ));
            }
        }
        let cap = self.adm.capacity.load(Ordering::Acquire);
        let before = self.relayed.load(Ordering::Acquire);
        if before < cap {
            return None;
        }
        Some((
            2,
            format!(
                "Too many requests in flight at the REST front: {before} at its limit of {cap} (the concurrency \
                 limit plus the admission queue and a margin, max_in_flight={}); retry later",
                self.adm.max_in_flight
            ),
        ))
    }

    /// The whole refusal answer: status line, headers (those of the gateway's protocol, in its order) and body.
    fn refusal(&self, text: &str, keep: bool) -> Vec<u8> {
        self.answer(self.status_line, text, keep)
    }

    /// An error answer with `status_line` and `{"error": text}`, framed as the gateway's protocol frames a refusal.
    fn answer(&self, status_line: &str, text: &str, keep: bool) -> Vec<u8> {
        let body = format!(
            "{{\n    \"error\": {}\n}}",
            serde_json::to_string(text).unwrap_or_else(|_| "\"refused\"".into())
        );
        let date = httpdate::fmt_http_date(std::time::SystemTime::now());
        let mut out = format!(
            "HTTP/1.1 {}\r\ndate: {date}\r\nserver: uvicorn\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nretry-after: {}\r\n",
            status_line,
            body.len(),
            self.retry_after
        );
        if !keep {
            out.push_str("connection: close\r\n");
        }
        out.push_str("\r\n");
        out.push_str(&body);
        out.into_bytes()
    }
}

/// A `/v1/` request relayed and not yet answered, counted as not yet judged by the Python server until it reports
/// one (`RestGate.seen`: when it refused one at its head, or one's body is in, or one ended before that), and as on
/// its way to admission once its body is up (`up`): a slow sender is not. When none is left unanswered nothing can
/// be on its way: the count starts again from 0, so a request the server never reported (a tunnelled one reported
/// instead, a head it never read) cannot leave it high.
struct OnTheWay(Arc<State>, bool);

impl OnTheWay {
    fn new(st: Arc<State>) -> OnTheWay {
        st.outstanding.fetch_add(1, Ordering::AcqRel);
        st.unseen.fetch_add(1, Ordering::AcqRel);
        st.uploading.fetch_add(1, Ordering::AcqRel);
        OnTheWay(st, true)
    }

    /// Its body is up.
    fn up(&mut self) {
        if std::mem::replace(&mut self.1, false) {
            self.0.uploading.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for OnTheWay {
    fn drop(&mut self) {
        self.up();
        if self.0.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.unseen.store(0, Ordering::Release);
        }
    }
}

/// A relay slot, given back when the relayed request ends however it ends.
struct Slot(Arc<State>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.relayed.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a request's head says, when the gate may judge it.
#[derive(Debug, PartialEq)]
struct Plain {
    head_len: usize,
    body_len: u64,
    close: bool,   // `Connection: close`: the connection ends after the answer
    guarded: bool, // a `/v1/...` request: refused while admission refuses
    head: bool,    // a HEAD request: its answer has no body
}

/// `buf`'s request head if it is whole and plain (module docs); None: the connection goes through the tunnel.
fn plain_request(buf: &[u8]) -> Option<Plain> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return None,
    };
    if req.version != Some(1) {
        return None;
    }
    let mut body_len = None;
    let mut close = false;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
        {
            return None;
        }
        if name.eq_ignore_ascii_case("content-length") {
            if body_len.is_some() {
                return None;
            }
            body_len = Some(decimal(h.value)?);
        } else if name.eq_ignore_ascii_case("connection") {
            let v = std::str::from_utf8(h.value).ok()?.trim();
            if v.eq_ignore_ascii_case("close") {
                close = true;
            } else if !v.eq_ignore_ascii_case("keep-alive") {
                return None;
            }
        }
    }
    let path = req.path?.as_bytes();
    Some(Plain {
        head_len,
        body_len: body_len.unwrap_or(0),
        close,
        guarded: path.len() >= 4 && path[..4].eq_ignore_ascii_case(b"/v1/"),
        head: req.method == Some("HEAD"),
    })
}

/// A `Content-Length` value: ASCII digits only (at most 18 of them), else None.
fn decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// How an answer's body is framed.
#[derive(Debug, PartialEq)]
enum Framing {
    Interim,     // 1xx (not 101): another head follows
    Length(u64), // exactly this many bytes
    Tunnel,      // chunked, 101, or a length we do not judge
    UntilClose,  // no length: the body ends when the server closes
}

/// `buf`'s answer head: (its length, framing, `Connection: close`), or None while incomplete; Err: does not parse.
fn answer_head(buf: &[u8], to_head: bool) -> Result<Option<(usize, Framing, bool)>, ()> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(()),
    };
    let code = resp.code.unwrap_or(0);
    let mut length = None;
    let mut chunked = false;
    let mut close = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            if length.is_some() {
                return Ok(Some((n, Framing::Tunnel, close)));
            }
            length = decimal(h.value);
            if length.is_none() {
                return Ok(Some((n, Framing::Tunnel, close)));
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = true;
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = std::str::from_utf8(h.value)
                .map(|v| v.trim().eq_ignore_ascii_case("close"))
                .unwrap_or(false);
        }
    }
    let framing = if code == 101 || chunked {
        Framing::Tunnel
    } else if (100..200).contains(&code) {
        Framing::Interim
    } else if to_head || code == 204 || code == 304 {
        Framing::Length(0)
    } else {
        match length {
            Some(len) => Framing::Length(len),
            None => Framing::UntilClose,
        }
    };
    Ok(Some((n, framing, close)))
}

struct Conn {
    st: Arc<State>,
    stop: watch::Receiver<bool>, // the gate is closing: idle connections end
    cr: OwnedReadHalf,
    cw: OwnedWriteHalf,
    up: Option<(UpRead, UpWrite)>,
    buf: Vec<u8>,  // bytes read from the client, not yet handled
    rbuf: Vec<u8>, // bytes read from the Python server, not yet handled
}

/// Read from `r` into `buf` (appending); the byte count (0: the peer closed). Cancel-safe: dropped while waiting it
/// leaves `buf` as it was (the client is also read while an answer is awaited, and that read is dropped when the
/// answer comes first).
async fn fill<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    buf.reserve(READ);
    r.read_buf(buf).await
}

/// Copy the `left` body bytes from the client to the Python server (those in `buf` first), counting them down; what the
/// client sent past them stays in `buf`.
async fn forward_body(
    cr: &mut OwnedReadHalf,
    uw: &mut UpWrite,
    buf: &mut Vec<u8>,
    left: &mut u64,
) -> std::io::Result<()> {
    loop {
        let take = ((*left).min(buf.len() as u64)) as usize;
        if take > 0 {
            uw.write_all(&buf[..take]).await?;
            buf.drain(..take);
            *left -= take as u64;
        }
        if *left == 0 {
            return Ok(());
        }
        if fill(cr, buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// After the body: read what the client sends next into `buf` (a pipelined request, at most `MAX_PIPELINED`
/// bytes) until it closes (an error: the request is abandoned, as the Python server would see it); never Ok.
async fn watch_client(cr: &mut OwnedReadHalf, buf: &mut Vec<u8>) -> std::io::Result<()> {
    while buf.len() < MAX_PIPELINED {
        if fill(cr, buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    std::future::pending().await
}

/// What became of an answer relayed to the client.
enum Answered {
    Done { close: bool },
    Tunnel,
}

/// Relay the Python server's answer (interim answers first) to the client.
async fn forward_answer(
    ur: &mut UpRead,
    cw: &mut OwnedWriteHalf,
    rbuf: &mut Vec<u8>,
    to_head: bool,
) -> std::io::Result<Answered> {
    loop {
        let (n, framing, close) = loop {
            match answer_head(rbuf, to_head) {
                Ok(Some(h)) => break h,
                Ok(None) if rbuf.len() < MAX_ANSWER_HEAD => {
                    if fill(ur, rbuf).await? == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                }
                _ => return Ok(Answered::Tunnel),
            }
        };
        match framing {
            Framing::Tunnel => return Ok(Answered::Tunnel),
            Framing::Interim => {
                cw.write_all(&rbuf[..n]).await?;
                rbuf.drain(..n);
            }
            Framing::UntilClose => {
                cw.write_all(rbuf).await?;
                rbuf.clear();
                tokio::io::copy(ur, cw).await?;
                return Ok(Answered::Done { close: true });
            }
            Framing::Length(len) => {
                let mut left = len;
                let first = (n as u64 + left).min(rbuf.len() as u64) as usize;
                cw.write_all(&rbuf[..first]).await?;
                left -= (first - n) as u64;
                rbuf.drain(..first);
                while left > 0 {
                    if fill(ur, rbuf).await? == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    let take = (left.min(rbuf.len() as u64)) as usize;
                    cw.write_all(&rbuf[..take]).await?;
                    rbuf.drain(..take);
                    left -= take as u64;
                }
                return Ok(Answered::Done { close });
            }
        }
    }
}

impl Conn {
    async fn upstream(&mut self) -> std::io::Result<()> {
        if self.up.is_none() {
            let s = UnixStream::connect(&self.st.upstream).await?;
            self.up = Some(s.into_split());
        }
        Ok(())
    }

    /// Serve the connection until either side closes it.
    async fn run(mut self) {
        loop {
            if self.buf.is_empty() && !self.wait_for_request().await {
                return;
            }
            let Some(req) = plain_request(&self.buf) else {
                return self.tunnel().await;
            };
            if req.guarded {
                if let Some((why, text)) = self.st.admit() {
                    if !self.refuse(why, &text, &req).await {
                        return;
                    }
                    continue;
                }
            }
            match self.relay(&req).await {
                Ok(Answered::Done { close: false }) if !req.close => {}
                Ok(Answered::Tunnel) => return self.tunnel().await,
                _ => {
                    let _ = self.cw.shutdown().await;
                    return;
                }
            }
        }
    }

    /// Wait for the client's next bytes (true) or an end: the client closed, the Python server closed the upstream
    /// connection (its keep-alive), or no upstream and `keep_alive` passed.
    async fn wait_for_request(&mut self) -> bool {
        let keep_alive = self.st.keep_alive;
        let got = if *self.stop.borrow() {
            false
        } else {
            let mut stop = self.stop.clone();
            match self.up.as_mut() {
                Some((ur, _)) => {
                    let mut probe = [0u8; 1];
                    tokio::select! {
                        n = fill(&mut self.cr, &mut self.buf) => n.map(|n| n > 0).unwrap_or(false),
                        _ = ur.read(&mut probe) => false, // the server closed it (or spoke unasked)
                        _ = stop.changed() => false,
                    }
                }
                None => tokio::select! {
                    r = tokio::time::timeout(keep_alive, fill(&mut self.cr, &mut self.buf)) => {
                        matches!(r, Ok(Ok(n)) if n > 0)
                    }
                    _ = stop.changed() => false,
                },
            }
        };
        if !got {
            let _ = self.cw.shutdown().await;
        }
        got
    }

    /// Answer the refusal and skip the request's body; false when the connection ends.
    async fn refuse(&mut self, why: usize, text: &str, req: &Plain) -> bool {
        self.st.refused[why].fetch_add(1, Ordering::Relaxed);
        let answer = self.st.refusal(text, !req.close);
        if self.cw.write_all(&answer).await.is_err() || req.close {
            let _ = self.cw.shutdown().await;
            return false;
        }
        let mut skip = req.body_len;
        let have = (self.buf.len() - req.head_len) as u64;
        let now = skip.min(have) as usize;
        self.buf.drain(..req.head_len + now);
        skip -= now as u64;
        while skip > 0 {
            self.buf.clear();
            match fill(&mut self.cr, &mut self.buf).await {
                Ok(n) if n > 0 => {
                    let take = skip.min(n as u64) as usize;
                    self.buf.drain(..take);
                    skip -= take as u64;
                }
                _ => return false,
            }
        }
        true
    }

    /// Relay one plain request and its answer.
    async fn relay(&mut self, req: &Plain) -> std::io::Result<Answered> {
        if let Err(e) = self.upstream().await {
            let text = format!("The gateway's HTTP server is not reachable ({e}); retry later");
            let answer = self.st.answer("503 Service Unavailable", &text, false);
            let _ = self.cw.write_all(&answer).await;
            return Err(e);
        }
        let (ur, uw) = self.up.as_mut().expect("connected above");
        let in_buf = (req.body_len.min((self.buf.len() - req.head_len) as u64)) as usize;
        let mut way = req.guarded.then(|| OnTheWay::new(self.st.clone()));
        uw.write_all(&self.buf[..req.head_len + in_buf]).await?;
        self.buf.drain(..req.head_len + in_buf);
        let mut left = req.body_len - in_buf as u64;
        let mut slot = None;
        let st = &self.st;
        let (cr, buf) = (&mut self.cr, &mut self.buf);
        // The body goes up while the answer is awaited (the server may answer before it has read it all); once it is
        // up the request takes a relay slot (a slow sender holds none, as in the Python server) and the client is
        // watched: if it goes away the upstream connection is dropped, so the server sees the request abandoned.
        let sending = async {
            forward_body(cr, uw, buf, &mut left).await?;
            if let Some(w) = way.as_mut() {
                w.up();
            }
            st.relayed.fetch_add(1, Ordering::AcqRel);
            slot = Some(Slot(st.clone()));
            watch_client(cr, buf).await
        };
        let answered = tokio::select! {
            a = forward_answer(ur, &mut self.cw, &mut self.rbuf, req.head) => a,
            gone = sending => Err(gone.err().unwrap_or_else(|| std::io::ErrorKind::UnexpectedEof.into())),
        };
        drop(slot);
        match answered {
            // answered before the whole body came: the rest of it goes to the server through the tunnel
            Ok(Answered::Done { close: false }) if left > 0 => Ok(Answered::Tunnel),
            Err(e) => {
                self.up = None; // the server sees the connection end: the request is abandoned
                Err(e)
            }
            other => other,
        }
    }

    /// Bytes both ways between the client and the Python server until either side ends.
    async fn tunnel(mut self) {
        if self.upstream().await.is_err() {
            let _ = self.cw.shutdown().await;
            return;
        }
        let (mut ur, mut uw) = self.up.take().expect("connected above");
        let (cr, cw, buf, rbuf) = (&mut self.cr, &mut self.cw, &self.buf, &self.rbuf);
        let up = async {
            if uw.write_all(buf).await.is_ok() {
                let _ = tokio::io::copy(cr, &mut uw).await;
            }
            let _ = uw.shutdown().await;
        };
        let down = async {
            if cw.write_all(rbuf).await.is_ok() {
                let _ = tokio::io::copy(&mut ur, cw).await;
            }
            let _ = cw.shutdown().await;
        };
        tokio::join!(up, down);
    }
}

/// Accept until the gate closes, then wait for the connections to end (those in an exchange finish it; idle ones
/// close at once).
async fn serve(listeners: Vec<TcpListener>, st: Arc<State>, stop: watch::Receiver<bool>) {
    let mut tasks = Vec::new();
    for listener in listeners {
        let (st, mut stop) = (st.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut conns: Vec<tokio::task::JoinHandle<()>> = Vec::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        if let Ok((sock, _)) = accepted {
                            conns.push(tokio::spawn(connection(sock, st.clone(), stop.clone())));
                            conns.retain(|t| !t.is_finished());
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

async fn connection(sock: TcpStream, st: Arc<State>, stop: watch::Receiver<bool>) {
    let _ = sock.set_nodelay(true);
    let (cr, cw) = sock.into_split();
    Conn {
        st,
        stop,
        cr,
        cw,
        up: None,
        buf: Vec::new(),
        rbuf: Vec::new(),
    }
    .run()
    .await
}

/// The gate. Built by the gateway's server (`gateway.servers`) through `gateway.native.rest_gate`.
#[pyclass(module = "embedgate_native")]
pub struct RestGate {
    st: Arc<State>,
    port: u16,
    stop: watch::Sender<bool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[pymethods]
impl RestGate {
    /// Listen on `host:port` (0: any free port) and relay to the HTTP/1.1 server on the Unix socket `upstream`.
    /// `max_in_flight`, `max_lag_text`, `status` (429 or 503) and `retry_after` word refusals as the gateway's
    /// protocol does; `capacity` is the first relay bound (see `set_state`); `keep_alive_s` bounds how long a client
    /// connection with nothing relayed yet may stay idle. `reuse_port`: share the port (SO_REUSEPORT).
    #[new]
    #[pyo3(signature = (
        host, port, upstream, capacity, max_in_flight, max_lag_text, status, retry_after, keep_alive_s=75.0,
        reuse_port=false
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
        retry_after: u32,
        keep_alive_s: f64,
        reuse_port: bool,
    ) -> PyResult<Self> {
        let status_line = match status {
            429 => "429 Too Many Requests",
            503 => "503 Service Unavailable",
            _ => {
                return Err(PyValueError::new_err(format!(
                    "refusal status must be 429 or 503, not {status}"
                )))
            }
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| PyOSError::new_err(format!("REST gate runtime: {e}")))?;
        let listeners = runtime
            .block_on(bind_host(host, port, reuse_port))
            .map_err(|e| {
                PyOSError::new_err(format!("cannot listen for HTTP on {host}:{port}: {e}"))
            })?;
        let bound = listeners[0].local_addr().map(|a| a.port()).unwrap_or(0);
        let st = Arc::new(State {
            adm: AdmissionState::new(capacity, max_in_flight, max_lag_text),
            relayed: AtomicI64::new(0),
            unseen: AtomicI64::new(0),
            outstanding: AtomicI64::new(0),
            uploading: AtomicI64::new(0),
            refused: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            status_line,
            retry_after,
            upstream: PathBuf::from(upstream),
            keep_alive: Duration::from_secs_f64(keep_alive_s.clamp(0.001, 86_400.0)),
        });
        let (stop, stop_rx) = watch::channel(false);
        let s = st.clone();
        let thread = std::thread::Builder::new()
            .name("embedgate-rest-gate".into())
            .spawn(move || {
                runtime.block_on(serve(listeners, s, stop_rx));
            })
            .map_err(|e| PyOSError::new_err(format!("REST gate thread: {e}")))?;
        Ok(RestGate {
            st,
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

    /// The gateway's admission now (as `GrpcGate.set_state`): `reason` 0 (admits), 1 (queue full) or 2 (loop
    /// lagging), its numbers for the refusal's text, and `capacity`, the relayed requests allowed at once.
    /// `room`: the requests admission holds at most, its limit plus its queue room (none given: no bound);
    /// `pending`: the requests the Python server let through at their head that admission has not counted yet.
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
        self.st.adm.set(
            reason,
            in_flight,
            limit,
            waiting,
            lag_ms,
            capacity,
            (room, pending),
        );
    }

    /// The Python server reported a `/v1/` request (`gateway.admission.Shedder`: refused at its head, its body in,
    /// or ended before that): one fewer not yet reported.
    fn seen(&self) {
        let _ = self
            .st
            .unseen
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n - 1)
            });
    }

    /// `/v1/` requests relayed that the Python server has not yet reported, at most those unanswered (`admit` counts
    /// those of them whose body is up as on their way).
    #[getter]
    fn unseen(&self) -> i64 {
        self.st
            .unseen
            .load(Ordering::Acquire)
            .min(self.st.outstanding.load(Ordering::Acquire))
            .max(0)
    }

    /// Refusals since the last call, by reason: (queue_full, loop_lag, rest_gate).
    fn take_refused(&self) -> (u64, u64, u64) {
        let r = &self.st.refused;
        (
            r[0].swap(0, Ordering::Relaxed),
            r[1].swap(0, Ordering::Relaxed),
            r[2].swap(0, Ordering::Relaxed),
        )
    }

    /// Requests relayed and not yet answered.
    #[getter]
    fn relayed(&self) -> i64 {
        self.st.relayed.load(Ordering::Acquire)
    }

    /// Stop listening; then wait up to `grace_s` for the connections to end: an exchange in progress is finished
    /// (the answer relayed), an idle connection is closed. Called again it waits again (0: only stops listening).
    fn close(&self, py: Python<'_>, grace_s: f64) {
        let _ = self.stop.send(true);
        let Ok(mut guard) = self.thread.lock() else {
            return;
        };
        let finished = match guard.as_ref() {
            None => return,
            Some(handle) => py.allow_threads(|| {
                let deadline =
                    std::time::Instant::now() + Duration::from_secs_f64(grace_s.max(0.0));
                while !handle.is_finished() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                handle.is_finished()
            }),
        };
        if finished {
            if let Some(handle) = guard.take() {
                let _ = handle.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_plain_requests_and_leaves_the_rest_to_the_tunnel() {
        let r = plain_request(
            b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n{\"a\": 1}",
        )
        .expect("plain");
        assert_eq!(
            r,
            Plain {
                head_len: 67,
                body_len: 12,
                close: false,
                guarded: true,
                head: false
            }
        );
        let r = plain_request(b"GET /V1/models/m HTTP/1.1\r\nConnection: close\r\n\r\n")
            .expect("plain");
        assert!(r.guarded && r.close && r.body_len == 0);
        assert!(
            !plain_request(b"GET /healthz HTTP/1.1\r\n\r\n")
                .expect("plain")
                .guarded
        );
        for other in [
            &b"POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST /v1/x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            b"POST /v1/x HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
            b"POST /v1/x HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            b"GET /v1/x HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n",
            b"GET /v1/x HTTP/1.0\r\n\r\n",
            b"GET /v1/x HTTP/1.1\r\nHost: x\r\n", // the head is not whole
            b"GET /v1/x HTTP/1.1\r\nBad Header: x\r\n\r\n",
        ] {
            assert!(
                plain_request(other).is_none(),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn frames_answers() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
        assert_eq!(
            answer_head(ok, false),
            Ok(Some((38, Framing::Length(5), false)))
        );
        assert_eq!(
            answer_head(ok, true),
            Ok(Some((38, Framing::Length(0), false)))
        );
        assert_eq!(answer_head(&ok[..20], false), Ok(None));
        let close = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        assert_eq!(answer_head(close, false).unwrap().unwrap().2, true);
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert_eq!(
            answer_head(chunked, false).unwrap().unwrap().1,
            Framing::Tunnel
        );
        let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
        assert_eq!(
            answer_head(interim, false).unwrap().unwrap().1,
            Framing::Interim
        );
        let open = b"HTTP/1.1 200 OK\r\n\r\n";
        assert_eq!(
            answer_head(open, false).unwrap().unwrap().1,
            Framing::UntilClose
        );
        assert_eq!(answer_head(b"nonsense\r\n\r\n", false), Err(()));
    }

    /// A gate's state with a relay bound of `capacity`, max_in_flight 8, answering 429.
    fn state(capacity: i64) -> State {
        State {
            adm: AdmissionState::new(capacity, 8, "0.25"),
            relayed: AtomicI64::new(0),
            unseen: AtomicI64::new(0),
            outstanding: AtomicI64::new(0),
            uploading: AtomicI64::new(0),
            refused: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            status_line: "429 Too Many Requests",
            retry_after: 1,
            upstream: PathBuf::new(),
            keep_alive: Duration::from_secs(1),
        }
    }

    #[test]
    fn refusals_are_the_gateway_protocol_bytes_and_relays_are_bounded() {
        let st = state(1);
        st.adm.set(crate::gate::QUEUE_FULL, 2, 2, 0, 0, 1, (4, 0));
        let (why, text) = st.admit().expect("queue full");
        assert_eq!(why, 0);
        let answer = String::from_utf8(st.refusal(&text, true)).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 429 Too Many Requests\r\ndate: "),
            "{head}"
        );
        assert!(
            head.ends_with(&format!(
                "GMT\r\nserver: uvicorn\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1",
                body.len()
            )),
            "{head}"
        );
        assert_eq!(
            body,
            "{\n    \"error\": \"Too many requests in flight: 2 at the concurrency limit of 2 (max_in_flight=8), 0 \
             waiting (admission.max_queue); retry later\"\n}"
        );
        assert!(String::from_utf8(st.refusal("x", false))
            .unwrap()
            .contains("\r\nconnection: close\r\n\r\n"));
        st.adm.set(crate::gate::OPEN, 0, 2, 0, 0, 1, (4, 0));
        assert!(st.admit().is_none()); // room for one relayed request
        st.relayed.fetch_add(1, Ordering::AcqRel); // its body is up: it holds the slot
        let (why, text) = st.admit().expect("relay bound");
        assert_eq!(why, 2);
        assert!(
            text.starts_with("Too many requests in flight at the REST front: 1 at its limit of 1"),
            "{text}"
        );
        drop(Slot(Arc::new(st)));
    }

    #[test]
    fn requests_on_their_way_count_against_admission_room() {
        let st = Arc::new(state(100));
        // admission holds 2 + 1 of its room of 5, and one request is judged but not yet counted
        st.adm.set(crate::gate::OPEN, 2, 2, 1, 0, 100, (5, 1));
        assert!(st.admit().is_none());
        let mut first = OnTheWay::new(st.clone());
        assert!(st.admit().is_none()); // its body still coming: not on its way yet
        first.up(); // one on its way fills the room
        let (why, text) = st.admit().expect("room full");
        assert_eq!(why, 2);
        assert_eq!(
            text,
            "Too many requests in flight: 2 at the concurrency limit of 2 (max_in_flight=8), 1 waiting \
             (admission.max_queue) and 2 on their way; retry later"
        );
        st.unseen.fetch_sub(1, Ordering::AcqRel); // the server judged it (`seen`)
        assert!(st.admit().is_none());
        // counted but never reported: it no longer counts once nothing relayed is unanswered
        let mut second = OnTheWay::new(st.clone());
        second.up();
        st.unseen.fetch_add(5, Ordering::AcqRel);
        assert!(st.admit().is_some());
        drop(first);
        assert!(st.admit().is_some()); // one still unanswered: at most one on its way
        drop(second);
        assert_eq!(st.unseen.load(Ordering::Acquire), 0);
        assert!(st.admit().is_none());
    }
}
