//! Per-peer I/O: the reader of each authenticated inbound connection and
//! the sender of each outgoing one (issue #23: the idle timeout of
//! finding 4, and every frame sealed or opened by the session's cipher).
//!
//! Connections are one-way: a site sends on the connection it dialled and
//! receives on the ones it accepted, so messages between a pair of sites
//! are FIFO (the core's assumption, Locus's virtual circuits, §7.1).

use super::core_loop::CoreLoop;
use super::handshake::{Established, Opener, Sealer};
use super::node::{Shared, msg_segment};
use crate::core::SiteId;
use crate::wire::{self, Frame, WireError};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An authenticated inbound connection: whole frames, each opened and
/// checked, to the core. A peer silent past `peer_timeout` (not even a
/// heartbeat: they come every `heartbeat`) is closed here; the liveness
/// check declares it dead.
pub(crate) fn serve_inbound(
    shared: &Arc<Shared>,
    stream: &TcpStream,
    addr: SocketAddr,
    est: Established,
) {
    let limits = shared.options.limits;
    let idle = shared.options.peer_timeout;
    let _ = stream.set_read_timeout(Some(idle));
    let hello = est.hello;
    let name = format!("site {} ({addr})", hello.name);
    let site = hello.site;
    shared.heard(site, Some(hello.incarnation));
    let spinning = super::spin::SpinRead::new(stream, shared.options.spin);
    let buffered = std::io::BufReader::with_capacity(64 * 1024, spinning);
    let mut reader = Opener::new(buffered, est.opener);
    let why = loop {
        match wire::read_frame(&mut reader, &limits) {
            Ok(Frame::Hello(_)) => {
                let e = WireError::HelloAgain;
                shared.log_drop(format!("{name}: dropped: {}: {e}", e.reason()));
                break e.reason().to_string();
            }
            Ok(Frame::Ping) => shared.heard(site, None),
            // A clean stop of the peer: its close is expected, no line.
            Ok(Frame::Bye) => return,
            Ok(frame) => {
                shared.heard(site, None);
                shared
                    .counters
                    .frames_received
                    .fetch_add(1, Ordering::Relaxed);
                let mut keep = true;
                shared.with_core(|c| keep = c.net(site, frame));
                if !keep {
                    // Logged by the core loop, with the core's reason.
                    break "a message the protocol refused".to_string();
                }
            }
            Err(WireError::Closed) => break "connection closed".to_string(),
            Err(_) if shared.stopping.load(Ordering::SeqCst) => return,
            Err(WireError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let why = format!(
                    "idle: nothing, not even a heartbeat, for {:.1} s",
                    idle.as_secs_f64()
                );
                shared.log_drop(format!("{name}: dropped: {why}"));
                break why;
            }
            Err(e) => {
                shared.log_drop(format!("{name}: dropped: {}: {e}", e.reason()));
                break format!("{}: {e}", e.reason());
            }
        }
    };
    // A closed or broken connection is not yet a dead peer (it may be
    // cut and redialled): silence past `peer_timeout` is.
    if !shared.stopping.load(Ordering::SeqCst) {
        eprintln!(
            "mmulab dsm site {}: {name}: connection ended: {why}",
            shared.config.name(shared.me)
        );
    }
}

impl CoreLoop {
    /// Sends a frame to a peer, dialling it first when there is no
    /// working connection; a frame that cannot go is logged and lost (what
    /// it would have answered times out at the requester).
    pub(crate) fn send_frame(&mut self, to: SiteId, frame: Frame) {
        let i = to.0 as usize;
        if self.shared.peers.lock().expect("peers")[i].dead.is_some() {
            // A dead peer gets one quick dial a second at most (it may
            // have restarted under its name); otherwise the message is
            // dropped and what it would have answered times out at the
            // requester. No long dialling under the core's lock.
            let due = self.redialled[i].is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
            if !due {
                return;
            }
            self.redialled[i] = Some(Instant::now());
            match self.dial(to, false) {
                Some((s, sealer)) => {
                    if let Some(o) = self.out[i].take() {
                        o.close();
                    }
                    self.out[i] = Some(Outbound::new(s, sealer, self.shared.clone(), to));
                }
                None => return,
            }
        }
        if let Frame::Core(m) = &frame
            && msg_segment(m)
                .is_some_and(|s| self.dead_segments.contains(&s) || self.fenced.contains(&(to, s)))
        {
            // A restarted site never hears of its former life's segments.
            return;
        }
        if self.out[i].as_ref().is_none_or(|o| o.is_broken()) {
            // Patient only for the first connection (a peer not up yet).
            let patient = !self.dialled_once[i];
            if let Some(o) = self.out[i].take() {
                o.close();
            }
            self.out[i] = self
                .dial(to, patient)
                .map(|(s, sealer)| Outbound::new(s, sealer, self.shared.clone(), to));
        }
        let Some(out) = self.out[i].as_ref() else {
            self.shared.log_drop(format!(
                "site {}: unreachable: message lost",
                self.shared.config.name(to)
            ));
            return;
        };
        let core = matches!(frame, Frame::Core(_));
        out.send(wire::encode(frame));
        let counters = &self.shared.counters;
        counters.frames_sent.fetch_add(1, Ordering::Relaxed);
        if core {
            counters.core_frames_sent.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Dials a peer and runs the handshake ([`super::handshake::dial`]):
    /// with retries of the TCP connect for `dial_for` when `patient` (a
    /// peer not up yet), else once. A peer that fails the handshake is
    /// logged by name and reason, and not dialled again for a second
    /// (this runs under the core's lock: a stranger on a site's address
    /// must not stall the core at every message).
    fn dial(&mut self, to: SiteId, patient: bool) -> Option<(TcpStream, Sealer)> {
        let i = to.0 as usize;
        if self.dial_failed[i].is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return None;
        }
        let addr = self.shared.config.sites[i].addr;
        let deadline = Instant::now()
            + if patient {
                self.shared.options.dial_for
            } else {
                Duration::ZERO
            };
        loop {
            if self.shared.stopping.load(Ordering::SeqCst) {
                return None;
            }
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    // Under the core's lock: a peer that accepts but never
                    // answers (a stopped process) stalls the core for a
                    // second at most, not the acceptor's whole deadline.
                    let mut cred = self.shared.credentials();
                    cred.timeout = cred.timeout.min(Duration::from_secs(1));
                    let answer = super::handshake::dial(&s, &cred);
                    let failed = match answer {
                        Ok(est) if est.hello.site == to => {
                            let _ = s.set_read_timeout(None);
                            let _ = s.set_write_timeout(None);
                            self.dialled_once[i] = true;
                            self.dial_failed[i] = None;
                            self.shared.heard(to, Some(est.hello.incarnation));
                            return Some((s, est.sealer));
                        }
                        Ok(est) => format!("wrong-site: answered as {}", est.hello.name),
                        Err(e) => format!("{}: {e}", e.reason()),
                    };
                    let _ = s.shutdown(Shutdown::Both);
                    self.dial_failed[i] = Some(Instant::now());
                    self.shared.log_drop(format!(
                        "site {} ({addr}): dropped: {failed}",
                        self.shared.config.name(to)
                    ));
                    return None;
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => return None,
            }
        }
    }
}

/// One outgoing connection. Sends never block the caller (readers handle
/// frames on their own thread, and a reader blocked on a write while its
/// peer's reader is blocked on one back would deadlock): the socket is
/// non-blocking, and what does not fit at once goes to a backlog that a
/// writer thread drains, in order.
pub(crate) struct Outbound {
    stream: TcpStream,
    queue: Arc<OutQueue>,
}

struct OutQueue {
    state: Mutex<OutState>,
    cv: std::sync::Condvar,
}

struct OutState {
    /// Seals each frame, in the order frames are sent (the record nonces
    /// follow that order; the backlog keeps it on the wire).
    sealer: Sealer,
    backlog: Vec<u8>,
    /// The writer thread holds bytes taken from the backlog.
    busy: bool,
    closed: bool,
    broken: bool,
}

impl Outbound {
    fn new(stream: TcpStream, sealer: Sealer, shared: Arc<Shared>, to: SiteId) -> Outbound {
        let _ = stream.set_nonblocking(true);
        let queue = Arc::new(OutQueue {
            state: Mutex::new(OutState {
                sealer,
                backlog: Vec::new(),
                busy: false,
                closed: false,
                broken: false,
            }),
            cv: std::sync::Condvar::new(),
        });
        let (q, s) = (queue.clone(), stream.try_clone().ok());
        if let Some(s) = s {
            let spawned = std::thread::Builder::new()
                .name(format!("dsm-drain-{}", to.0))
                .spawn(move || drain(q, s, shared, to));
            if spawned.is_err() {
                // No writer: whatever does not fit at once breaks it.
                queue.state.lock().expect("out").broken = true;
            }
        }
        Outbound { stream, queue }
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.queue.state.lock().expect("out").broken
    }

    /// Queues one encoded frame (sealed here when the connection is keyed).
    pub(crate) fn send(&self, plain: Vec<u8>) {
        let mut st = self.queue.state.lock().expect("out");
        if st.broken || st.closed {
            return;
        }
        let bytes = if st.sealer.is_keyed() {
            let mut sealed = Vec::with_capacity(plain.len() + 64);
            st.sealer.seal(&plain, &mut sealed);
            sealed
        } else {
            plain
        };
        if st.busy || !st.backlog.is_empty() {
            st.backlog.extend_from_slice(&bytes);
            self.queue.cv.notify_one();
            return;
        }
        let mut done = 0;
        while done < bytes.len() {
            match (&self.stream).write(&bytes[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    st.broken = true;
                    return;
                }
            }
        }
        if done < bytes.len() {
            st.backlog.extend_from_slice(&bytes[done..]);
            self.queue.cv.notify_one();
        }
    }

    /// Sends `Bye`, lets the writer flush what is queued (bounded), then
    /// closes.
    pub(crate) fn goodbye(&self) {
        self.send(wire::encode(Frame::Bye));
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            {
                let st = self.queue.state.lock().expect("out");
                if st.broken || (st.backlog.is_empty() && !st.busy) {
                    break;
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.close();
    }

    pub(crate) fn close(&self) {
        self.queue.state.lock().expect("out").closed = true;
        self.queue.cv.notify_one();
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

fn drain(q: Arc<OutQueue>, stream: TcpStream, shared: Arc<Shared>, to: SiteId) {
    loop {
        let chunk = {
            let mut st = q.state.lock().expect("out");
            st.busy = false;
            while st.backlog.is_empty() && !st.closed {
                st = q.cv.wait(st).expect("out");
            }
            if st.closed {
                return;
            }
            st.busy = true;
            std::mem::take(&mut st.backlog)
        };
        let mut done = 0;
        while done < chunk.len() {
            match (&stream).write(&chunk[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let mut fds = [rustix::event::PollFd::new(
                        &stream,
                        rustix::event::PollFlags::OUT,
                    )];
                    let t = rustix::event::Timespec {
                        tv_sec: 0,
                        tv_nsec: 100_000_000,
                    };
                    let _ = rustix::event::poll(&mut fds, Some(&t));
                    if q.state.lock().expect("out").closed {
                        return;
                    }
                }
                Err(e) => {
                    shared.log_drop(format!("site {}: dropped: io: {e}", shared.config.name(to)));
                    let mut st = q.state.lock().expect("out");
                    st.broken = true;
                    st.busy = false;
                    return;
                }
            }
        }
    }
}
