//! The TCP listener: who gets a thread, for how long (issue #23,
//! findings 4 and 5).
//!
//! Finding 4: every inbound connection left a clone of its socket in a
//! list kept until stop (rejected peers sat in CLOSE-WAIT, ~20,700
//! connect/close cycles grew the daemon to 187 MB), one thread per
//! connection without a bound, a handshake bound per `read()`, no timeout
//! for authenticated peers. Now:
//! - [`Connections`] holds a connection only while its thread runs: the
//!   thread's [`Admitted`] guard shuts the socket down and forgets it when
//!   the thread ends, whatever ended it, so a refused or failed peer is
//!   closed at once;
//! - at most `max_peers_pending` connections (cluster.toml, default 64)
//!   are in their handshake at a time; one past that is closed on accept;
//! - the handshake has one total deadline ([`super::handshake`]);
//! - an authenticated connection replaces the previous one from the same
//!   site (so at most one reader per peer site), and one silent past the
//!   peer timeout is closed by its reader ([`super::peer`]).
//!
//! Finding 5: an accept error (EMFILE when the process is out of file
//! descriptors) made the listener spin at 100 % CPU. Errors now back off,
//! 10 ms doubling to 1 s, and are retried: the listener ends only when the
//! site stops.

use super::node::Shared;
use crate::core::SiteId;
use nix::libc;
use std::collections::BTreeMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The first and the longest pause after a failed accept.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The open inbound connections of a site.
#[derive(Default)]
pub(crate) struct Connections {
    state: Mutex<ConnState>,
    /// Signalled when a connection's thread ends (for the stop).
    ended: Condvar,
}

#[derive(Default)]
struct ConnState {
    next_id: u64,
    /// id → (the authenticated site, a handle to shut the socket down).
    open: BTreeMap<u64, (Option<SiteId>, TcpStream)>,
    /// Of `open`, those still in their handshake.
    pending: usize,
}

/// A connection's place in [`Connections`]; dropping it (the thread's
/// end) shuts the socket down and forgets it.
pub(crate) struct Admitted {
    shared: Arc<Shared>,
    id: u64,
}

/// How many inbound connections a site holds, for tests and status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionCount {
    pub open: usize,
    pub pending: usize,
}

impl Connections {
    /// Registers a new connection unless `max_pending` are in their
    /// handshake already (`Err(None)`), or no descriptor is left for the
    /// registry's handle (`Err(Some(e))`).
    fn admit(
        &self,
        shared: &Arc<Shared>,
        stream: &TcpStream,
        max_pending: usize,
    ) -> Result<Admitted, Option<std::io::Error>> {
        let mut st = self.state.lock().expect("conns");
        if st.pending >= max_pending {
            return Err(None);
        }
        let handle = stream.try_clone().map_err(Some)?;
        st.next_id += 1;
        let id = st.next_id;
        st.open.insert(id, (None, handle));
        st.pending += 1;
        Ok(Admitted {
            shared: shared.clone(),
            id,
        })
    }

    pub fn count(&self) -> ConnectionCount {
        let st = self.state.lock().expect("conns");
        ConnectionCount {
            open: st.open.len(),
            pending: st.pending,
        }
    }

    /// Shuts every connection down (their threads then end) and waits,
    /// bounded, for their threads.
    pub fn close_all(&self) {
        let mut st = self.state.lock().expect("conns");
        for (_, s) in st.open.values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !st.open.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self.ended.wait_timeout(st, left).expect("conns").0;
        }
    }
}

impl Admitted {
    /// The handshake succeeded: the connection speaks for `site` from now
    /// on, and the previous connection of that site, if any, is closed
    /// (a redial replaces it; a site has one inbound reader at a time).
    pub(crate) fn authenticated(&self, site: SiteId) {
        let conns = &self.shared.conns;
        let mut st = conns.state.lock().expect("conns");
        for (id, (s, stream)) in st.open.iter() {
            if *id != self.id && *s == Some(site) {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        if let Some(e) = st.open.get_mut(&self.id) {
            debug_assert!(e.0.is_none(), "authenticated twice");
            e.0 = Some(site);
        }
        st.pending -= 1;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let conns = &self.shared.conns;
        let mut st = conns.state.lock().expect("conns");
        if let Some((site, s)) = st.open.remove(&self.id) {
            let _ = s.shutdown(Shutdown::Both);
            if site.is_none() {
                st.pending -= 1;
            }
        }
        conns.ended.notify_all();
    }
}

/// Sleeps `d`, in short steps so that a stop is not held up.
fn pause(shared: &Shared, d: Duration) {
    let until = Instant::now() + d;
    while !shared.stopping.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// Accept errors that concern one connection only (it was reset before
/// accept returned, or a signal came): the next accept goes at once.
fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::ECONNABORTED | libc::EPROTO | libc::EPERM)
    ) || e.kind() == std::io::ErrorKind::Interrupted
}

/// The listener thread: until the site stops, never longer, never
/// shorter.
pub(crate) fn listen(shared: Arc<Shared>, listener: TcpListener) {
    let max_pending = shared.config.max_peers_pending as usize;
    let mut backoff = ACCEPT_BACKOFF_MIN;
    // (first error, errors since) of the current run of failed accepts.
    let mut failing: Option<(String, u64)> = None;
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let (stream, addr) = match listener.accept() {
            Ok(c) => c,
            Err(_) if shared.stopping.load(Ordering::SeqCst) => break,
            Err(e) if transient(&e) => continue,
            Err(e) => {
                // EMFILE, ENFILE, ENOBUFS, ENOMEM or anything else: the
                // pending connection stays in the backlog, so retrying at
                // once would spin. Back off and retry; say so once a run.
                match &mut failing {
                    None => {
                        shared.log_drop(format!(
                            "accept: {e}: retrying, backing off up to {:.0} s (the listener keeps running)",
                            ACCEPT_BACKOFF_MAX.as_secs_f64()
                        ));
                        failing = Some((e.to_string(), 1));
                    }
                    Some((_, n)) => *n += 1,
                }
                pause(&shared, backoff);
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        if let Some((first, n)) = failing.take() {
            shared.log_drop(format!(
                "accept works again after {n} failed attempts ({first})"
            ));
        }
        backoff = ACCEPT_BACKOFF_MIN;
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        // On refusal `stream` is closed here, at once.
        let admitted = match shared.conns.admit(&shared, &stream, max_pending) {
            Ok(a) => a,
            Err(None) => {
                shared.log_drop(format!(
                    "peer {addr}: dropped: too-many-pending: {max_pending} connections already in their handshake (max_peers_pending)"
                ));
                continue;
            }
            Err(Some(e)) => {
                shared.log_drop(format!("peer {addr}: dropped: no descriptor for it: {e}"));
                drop(stream);
                pause(&shared, backoff);
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("dsm-peer-{}", shared.me.0))
            .spawn(move || serve(s, stream, addr, admitted));
        if let Err(e) = spawned {
            // The closure (and with it the socket and its registration)
            // is dropped: closed at once.
            shared.log_drop(format!("peer {addr}: dropped: no thread for it: {e}"));
            pause(&shared, backoff);
            backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
        }
    }
}

/// One inbound connection: the handshake, then its frames to the core.
/// Whatever ends it, `admitted` closes the socket when this returns.
fn serve(shared: Arc<Shared>, stream: TcpStream, addr: SocketAddr, admitted: Admitted) {
    let _ = stream.set_nodelay(true);
    let est = super::handshake::accept(&stream, &shared.credentials());
    let est = match est {
        Ok(e) => e,
        Err(_) if shared.stopping.load(Ordering::SeqCst) => return,
        Err(e) => {
            shared.log_drop(format!("peer {addr}: dropped: {}: {e}", e.reason()));
            return;
        }
    };
    admitted.authenticated(est.hello.site);
    super::peer::serve_inbound(&shared, &stream, addr, est);
    drop(admitted);
}
