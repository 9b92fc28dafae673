//! The handshake: who may talk to a site (issue #23, findings 1-3).
//!
//! Findings 1-3 were one hole: a site believed any `Hello` that reached
//! its port. One frame claiming site b with incarnation `u64::MAX` locked
//! the real b out (1); a stranger calling itself b had a's program's page
//! taken from it (2); a process on an absent site's address looked a key
//! up, read page 0 and wrote 0xdead back (3). Here every connection between
//! sites starts with a Noise handshake keyed by the cluster key, and no
//! frame of the DSM protocol, the hello included, travels before both ends
//! proved that key:
//!
//! - **Noise `NNpsk0`** (the `snow` crate, `25519_AESGCM_SHA256`): the
//!   dialer sends an ephemeral key under the pre-shared cluster key, the
//!   acceptor answers with its own; both then hold fresh session keys that
//!   only holders of the cluster key can compute. A peer without the key
//!   fails the first message's tag (acceptor) or the answer's (dialer); it
//!   is logged with its address and closed, and nothing else happens.
//! - **No replay**: the acceptor acts on nothing before the dialer's first
//!   transport record (its hello), sealed under keys that mix in the
//!   acceptor's fresh ephemeral key; a recorded session replayed cannot
//!   produce it. Within a session every record has the next nonce, so a
//!   record replayed, reordered, dropped or altered fails its tag
//!   ([`WireError::Forged`]) and the connection is closed.
//! - **Incarnations cannot be forged** from outside: they travel only in
//!   the hellos, inside the channel.
//! - **A total deadline** (`NodeOptions::handshake_timeout`, default 5 s)
//!   bounds the whole exchange, however slowly a peer trickles bytes (a
//!   per-read bound let a slow-loris writer keep its thread, finding 4).
//!
//! Under `insecure = true` the hellos travel bare, as before issue #23.
//!
//! The byte stream after the handshake is the plain frame stream of
//! [`crate::wire`], cut into Noise records: `len u16 LE | ciphertext`
//! (at most 65,535 bytes, 16 of them the tag). The first bytes of a
//! keyed dialer are `MIRN | version u16 LE | len u16 LE | message 1`, so
//! an insecure site and a keyed one name the mismatch instead of guessing.

use super::key::ClusterKey;
use crate::wire::{self, AuthFailure, Frame, Handshake, Hello, Limits, WireError};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Instant;

/// The Noise protocol name. AES-GCM, through `ring` (snow's
/// `ring-accelerated` resolver): sealing and opening a 4 KiB page takes
/// 1.05 µs of CPU here, ChaCha20-Poly1305 3.5 µs, the pure-Rust AES-GCM
/// 6.5 µs (`cipher_cost_of_a_page`).
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";
/// The first bytes of a keyed dialer.
pub const NOISE_MAGIC: [u8; 4] = *b"MIRN";
/// Noise's largest message, and its tag.
const MAX_RECORD: usize = 65_535;
const TAG: usize = 16;
/// Largest plaintext in one record.
const MAX_PLAIN: usize = MAX_RECORD - TAG;
/// A handshake message here is 48 bytes (an ephemeral key and a tag).
const MAX_HANDSHAKE_MESSAGE: usize = 256;

fn prologue() -> Vec<u8> {
    let mut p = b"mmulab-dsm".to_vec();
    p.extend_from_slice(&wire::PROTOCOL_VERSION.to_le_bytes());
    p
}

fn initiator(key: &ClusterKey) -> snow::HandshakeState {
    // The parameters are constants: a failure here is a bug, not input.
    let params: snow::params::NoiseParams = NOISE_PARAMS.parse().expect("valid Noise parameters");
    let p = prologue();
    snow::Builder::new(params)
        .psk(0, key.bytes())
        .and_then(|b| b.prologue(&p))
        .and_then(|b| b.build_initiator())
        .expect("an NNpsk0 initiator")
}

fn responder(key: &ClusterKey) -> snow::HandshakeState {
    let params: snow::params::NoiseParams = NOISE_PARAMS.parse().expect("valid Noise parameters");
    let p = prologue();
    snow::Builder::new(params)
        .psk(0, key.bytes())
        .and_then(|b| b.prologue(&p))
        .and_then(|b| b.build_responder())
        .expect("an NNpsk0 responder")
}

/// A socket under a total deadline: each read and write gets what is left
/// of it (a per-read bound would let a peer sending one byte at a time
/// hold the handshake forever).
pub(crate) struct Deadlined<'a> {
    pub stream: &'a TcpStream,
    pub deadline: Instant,
}

impl Deadlined<'_> {
    fn left(&self) -> io::Result<std::time::Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake deadline",
            ))
        } else {
            Ok(left)
        }
    }
}

fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "handshake deadline")
    } else {
        e
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        (&mut &*self.stream).read(buf).map_err(timed_out)
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        (&mut &*self.stream).write(buf).map_err(timed_out)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The sending half of a connection: frames in, bytes for the socket out.
pub(crate) struct Sealer(Option<Box<snow::TransportState>>);

impl Sealer {
    /// Appends `plain` to `out`, sealed when the connection is keyed.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        let Some(t) = self.0.as_mut() else {
            out.extend_from_slice(plain);
            return;
        };
        for chunk in plain.chunks(MAX_PLAIN) {
            let at = out.len();
            out.resize(at + 2 + chunk.len() + TAG, 0);
            let n = t
                .write_message(chunk, &mut out[at + 2..])
                .expect("a record within Noise's bounds, nonces far from exhausted");
            debug_assert_eq!(n, chunk.len() + TAG);
            out[at..at + 2].copy_from_slice(&(n as u16).to_le_bytes());
        }
    }

    pub fn is_keyed(&self) -> bool {
        self.0.is_some()
    }
}

/// The receiving half: a reader of the plain frame stream, each record's
/// tag checked before a byte of it is handed on.
pub(crate) struct Opener<R> {
    inner: R,
    cipher: Option<Box<snow::TransportState>>,
    record: Vec<u8>,
    plain: Vec<u8>,
    at: usize,
}

impl<R: Read> Opener<R> {
    pub fn new(inner: R, cipher: Option<Box<snow::TransportState>>) -> Opener<R> {
        Opener {
            inner,
            cipher,
            record: Vec::new(),
            plain: Vec::new(),
            at: 0,
        }
    }

    /// Reads exactly `buf.len()` bytes; false on EOF before the first.
    fn fill(&mut self, len: usize) -> io::Result<bool> {
        self.record.resize(len, 0);
        let mut done = 0;
        while done < len {
            match self.inner.read(&mut self.record[done..len]) {
                Ok(0) if done == 0 => return Ok(false),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

impl<R: Read> Read for Opener<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cipher.is_none() {
            return self.inner.read(buf);
        }
        if self.at == self.plain.len() {
            if !self.fill(2)? {
                return Ok(0);
            }
            let len = u16::from_le_bytes([self.record[0], self.record[1]]) as usize;
            if len < TAG {
                return Err(io::Error::new(io::ErrorKind::InvalidData, AuthFailure));
            }
            if !self.fill(len)? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.plain.resize(len, 0);
            let t = self.cipher.as_mut().expect("keyed");
            let n = t
                .read_message(&self.record[..len], &mut self.plain)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, AuthFailure))?;
            self.plain.truncate(n);
            self.at = 0;
        }
        let n = buf.len().min(self.plain.len() - self.at);
        buf[..n].copy_from_slice(&self.plain[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// An authenticated connection's state once the hellos are exchanged.
pub(crate) struct Established {
    pub hello: Hello,
    pub sealer: Sealer,
    /// The receiving cipher (None: insecure).
    pub opener: Option<Box<snow::TransportState>>,
}

fn handshake_error(e: io::Error, deadline: std::time::Duration) -> WireError {
    if e.kind() == io::ErrorKind::TimedOut {
        WireError::HandshakeTimeout(deadline.as_secs_f64())
    } else if e.kind() == io::ErrorKind::UnexpectedEof {
        WireError::Truncated { stage: "handshake" }
    } else {
        e.into()
    }
}

fn read_exact_or(
    r: &mut impl Read,
    buf: &mut [u8],
    bound: std::time::Duration,
) -> Result<(), WireError> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) if done == 0 => return Err(WireError::Closed),
            Ok(0) => return Err(WireError::Truncated { stage: "handshake" }),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(handshake_error(e, bound)),
        }
    }
    Ok(())
}

/// What both ends need for a handshake.
pub(crate) struct Credentials<'a> {
    /// None: `insecure = true`.
    pub key: Option<&'a ClusterKey>,
    pub ours: Hello,
    pub seen: &'a Mutex<Handshake>,
    pub limits: Limits,
    pub timeout: std::time::Duration,
}

/// The accepting side. Returns the peer's checked hello (the answer is
/// sent) or why the peer was refused; nothing of the peer reaches the
/// core before this returns Ok.
pub(crate) fn accept(stream: &TcpStream, cred: &Credentials) -> Result<Established, WireError> {
    let deadline = Instant::now() + cred.timeout;
    let mut io = Deadlined { stream, deadline };
    let mut magic = [0u8; 4];
    read_exact_or(&mut io, &mut magic, cred.timeout)?;
    let Some(key) = cred.key else {
        if magic == NOISE_MAGIC {
            return Err(WireError::InsecureMismatch);
        }
        // The bare protocol: the 4 bytes read are the frame's magic.
        let mut r = (&magic[..]).chain(&mut io);
        let hello = match wire::read_frame(&mut r, &cred.limits)
            .map_err(|e| deadline_of(e, cred.timeout))?
        {
            Frame::Hello(h) => h,
            other => return Err(WireError::NotHello(frame_kind(&other))),
        };
        cred.seen.lock().expect("hs").accept(&hello)?;
        wire::write_frame(&mut io, Frame::Hello(cred.ours.clone()))
            .map_err(|e| handshake_error(e, cred.timeout))?;
        return Ok(Established {
            hello,
            sealer: Sealer(None),
            opener: None,
        });
    };
    if magic == wire::MAGIC {
        return Err(WireError::Unauthenticated(
            "it speaks without authentication: a site with insecure = true, or an old version"
                .into(),
        ));
    }
    if magic != NOISE_MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let mut head = [0u8; 4];
    read_exact_or(&mut io, &mut head, cred.timeout)?;
    let version = u16::from_le_bytes([head[0], head[1]]);
    if version != wire::PROTOCOL_VERSION {
        return Err(WireError::WrongVersion {
            got: version,
            want: wire::PROTOCOL_VERSION,
        });
    }
    let len = u16::from_le_bytes([head[2], head[3]]) as usize;
    if len > MAX_HANDSHAKE_MESSAGE {
        return Err(WireError::TooLong {
            what: "handshake message",
            len: len as u32,
            max: MAX_HANDSHAKE_MESSAGE as u32,
        });
    }
    let mut msg = vec![0u8; len];
    read_exact_or(&mut io, &mut msg, cred.timeout)?;
    let mut hs = responder(key);
    let mut scratch = [0u8; MAX_HANDSHAKE_MESSAGE];
    hs.read_message(&msg, &mut scratch).map_err(|_| {
        WireError::Unauthenticated("its first handshake message fails the cluster key".into())
    })?;
    let mut out = [0u8; MAX_HANDSHAKE_MESSAGE];
    let n = hs
        .write_message(&[], &mut out[2..])
        .expect("message 2 fits");
    out[..2].copy_from_slice(&(n as u16).to_le_bytes());
    io.write_all(&out[..2 + n])
        .map_err(|e| handshake_error(e, cred.timeout))?;
    let transport = hs
        .into_transport_mode()
        .expect("NNpsk0 is complete after two messages");
    // The dialer's hello: the first record under the fresh session keys,
    // so the first thing that proves the peer is live, not a replay.
    let mut opener = Opener::new(io, Some(Box::new(transport)));
    let hello = match wire::read_frame(&mut opener, &cred.limits)
        .map_err(|e| deadline_of(e, cred.timeout))?
    {
        Frame::Hello(h) => h,
        other => return Err(WireError::NotHello(frame_kind(&other))),
    };
    cred.seen.lock().expect("hs").accept(&hello)?;
    let Opener {
        inner: mut io,
        cipher,
        ..
    } = opener;
    // One transport state holds both directions' keys: the answer is
    // sealed with its sending half, and it then stays with the reader
    // (after the hellos a connection carries frames one way only).
    let mut sealer = Sealer(cipher);
    let mut bytes = Vec::new();
    sealer.seal(&wire::encode(Frame::Hello(cred.ours.clone())), &mut bytes);
    io.write_all(&bytes)
        .map_err(|e| handshake_error(e, cred.timeout))?;
    Ok(Established {
        hello,
        opener: sealer.0.take(),
        sealer,
    })
}

/// The dialing side, on a fresh connection to `expect`'s address: proves
/// the key, sends our hello, and returns the peer's checked answer.
pub(crate) fn dial(stream: &TcpStream, cred: &Credentials) -> Result<Established, WireError> {
    let deadline = Instant::now() + cred.timeout;
    let mut io = Deadlined { stream, deadline };
    let Some(key) = cred.key else {
        wire::write_frame(&mut io, Frame::Hello(cred.ours.clone()))
            .map_err(|e| handshake_error(e, cred.timeout))?;
        let answer = cred
            .seen
            .lock()
            .expect("hs")
            .read_hello(&mut io, &cred.limits)
            .map_err(|e| deadline_of(e, cred.timeout))?;
        return Ok(Established {
            hello: answer,
            sealer: Sealer(None),
            opener: None,
        });
    };
    let mut hs = initiator(key);
    let mut out = [0u8; 8 + MAX_HANDSHAKE_MESSAGE];
    out[..4].copy_from_slice(&NOISE_MAGIC);
    out[4..6].copy_from_slice(&wire::PROTOCOL_VERSION.to_le_bytes());
    let n = hs
        .write_message(&[], &mut out[8..])
        .expect("message 1 fits");
    out[6..8].copy_from_slice(&(n as u16).to_le_bytes());
    io.write_all(&out[..8 + n])
        .map_err(|e| handshake_error(e, cred.timeout))?;
    let mut len = [0u8; 2];
    match read_exact_or(&mut io, &mut len, cred.timeout) {
        Err(WireError::Closed) => {
            return Err(WireError::Unauthenticated(
                "it closed the connection in the handshake: does it hold this cluster key, or run insecure = true?".into(),
            ));
        }
        r => r?,
    }
    let len = u16::from_le_bytes(len) as usize;
    if len > MAX_HANDSHAKE_MESSAGE {
        return Err(WireError::TooLong {
            what: "handshake message",
            len: len as u32,
            max: MAX_HANDSHAKE_MESSAGE as u32,
        });
    }
    let mut msg = vec![0u8; len];
    read_exact_or(&mut io, &mut msg, cred.timeout)?;
    let mut scratch = [0u8; MAX_HANDSHAKE_MESSAGE];
    hs.read_message(&msg, &mut scratch).map_err(|_| {
        WireError::Unauthenticated("its handshake answer fails the cluster key".into())
    })?;
    let transport = hs
        .into_transport_mode()
        .expect("NNpsk0 is complete after two messages");
    let mut sealer = Sealer(Some(Box::new(transport)));
    let mut bytes = Vec::new();
    sealer.seal(&wire::encode(Frame::Hello(cred.ours.clone())), &mut bytes);
    io.write_all(&bytes)
        .map_err(|e| handshake_error(e, cred.timeout))?;
    // The answer comes sealed with the same transport state (the
    // acceptor's sealing half); borrow it for the one read.
    let mut opener = Opener::new(io, sealer.0.take());
    let answer = match wire::read_frame(&mut opener, &cred.limits)
        .map_err(|e| deadline_of(e, cred.timeout))?
    {
        Frame::Hello(h) => h,
        other => return Err(WireError::NotHello(frame_kind(&other))),
    };
    cred.seen.lock().expect("hs").accept(&answer)?;
    sealer.0 = opener.cipher.take();
    Ok(Established {
        hello: answer,
        sealer,
        opener: None,
    })
}

/// A connection to a site that speaks as a member: for tests and tools
/// that need to act as a peer (send a chosen hello, frames, half a
/// frame). It holds the key it is given; it cannot do more than a site.
pub struct MemberConn {
    stream: TcpStream,
    sealer: Sealer,
    pub answer: Hello,
}

impl MemberConn {
    /// Dials `addr` and handshakes with `key` (None: bare, as under
    /// `insecure = true`), saying `hello`.
    pub fn dial(
        addr: std::net::SocketAddr,
        key: Option<&ClusterKey>,
        hello: Hello,
        sites: u16,
    ) -> Result<MemberConn, WireError> {
        let stream = TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))?;
        let seen = Mutex::new(Handshake::new(hello.cluster_id, sites));
        let est = dial(
            &stream,
            &Credentials {
                key,
                ours: hello,
                seen: &seen,
                limits: Limits::default(),
                timeout: std::time::Duration::from_secs(5),
            },
        )?;
        let _ = stream.set_read_timeout(None);
        let _ = stream.set_write_timeout(None);
        Ok(MemberConn {
            stream,
            sealer: est.sealer,
            answer: est.hello,
        })
    }

    /// Sends one whole frame.
    pub fn send(&mut self, frame: Frame) -> io::Result<()> {
        self.send_plain(&wire::encode(frame))
    }

    /// Sends these bytes of the plain frame stream (a part of a frame, to
    /// play a peer that vanishes mid-frame), sealed as one record.
    pub fn send_plain(&mut self, plain: &[u8]) -> io::Result<()> {
        let mut out = Vec::new();
        self.sealer.seal(plain, &mut out);
        (&self.stream).write_all(&out)
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }
}

/// A frame read that ran into the deadline is a handshake timeout.
fn deadline_of(e: WireError, bound: std::time::Duration) -> WireError {
    match e {
        WireError::Io(io) if io.kind() == io::ErrorKind::TimedOut => {
            WireError::HandshakeTimeout(bound.as_secs_f64())
        }
        other => other,
    }
}

fn frame_kind(f: &Frame) -> &'static str {
    match f {
        Frame::Hello(_) => "hello",
        Frame::Core(m) => m.kind(),
        Frame::Dir(_) => "directory",
        Frame::Ping => "ping",
        Frame::Bye => "bye",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::SiteId;
    use std::net::TcpListener;
    use std::time::Duration;

    fn hello(site: u16, incarnation: u64) -> Hello {
        Hello {
            version: wire::PROTOCOL_VERSION,
            cluster_id: 9,
            site: SiteId(site),
            name: ((b'a' + site as u8) as char).to_string(),
            incarnation,
        }
    }

    /// Runs a dial against an accept over loopback, each with its key.
    fn pair(
        dial_key: Option<ClusterKey>,
        accept_key: Option<ClusterKey>,
    ) -> (
        Result<Established, WireError>,
        Result<Established, WireError>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let acceptor = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let seen = Mutex::new(Handshake::new(9, 2));
            let r = accept(
                &s,
                &Credentials {
                    key: accept_key.as_ref(),
                    ours: hello(0, 1),
                    seen: &seen,
                    limits: Limits::default(),
                    timeout: Duration::from_secs(2),
                },
            );
            drop(s);
            r
        });
        let s = TcpStream::connect(addr).unwrap();
        let seen = Mutex::new(Handshake::new(9, 2));
        let d = dial(
            &s,
            &Credentials {
                key: dial_key.as_ref(),
                ours: hello(1, 7),
                seen: &seen,
                limits: Limits::default(),
                timeout: Duration::from_secs(2),
            },
        );
        drop(s);
        (d, acceptor.join().unwrap())
    }

    #[test]
    fn the_same_key_agrees_and_frames_round_trip_sealed() {
        let k = ClusterKey::random().unwrap();
        let (d, a) = pair(Some(k.clone()), Some(k));
        let (mut d, a) = (d.unwrap(), a.unwrap());
        assert_eq!(d.hello.site, SiteId(0));
        assert_eq!(a.hello.incarnation, 7);
        assert!(d.sealer.is_keyed() && a.opener.is_some());
        // A frame sealed by the dialer opens at the acceptor, and the page
        // travels encrypted (its bytes do not appear on the wire).
        let frame = wire::encode(Frame::Dir(wire::DirMsg::Remove { key: 0x5eed }));
        let mut bytes = Vec::new();
        d.sealer.seal(&frame, &mut bytes);
        d.sealer.seal(&frame, &mut bytes);
        assert!(!bytes.windows(4).any(|w| w == wire::MAGIC));
        let mut o = Opener::new(&bytes[..], a.opener);
        for _ in 0..2 {
            assert!(matches!(
                wire::read_frame(&mut o, &Limits::default()).unwrap(),
                Frame::Dir(wire::DirMsg::Remove { key: 0x5eed })
            ));
        }
    }

    #[test]
    fn a_peer_without_the_key_is_refused_on_both_sides() {
        let (d, a) = pair(
            Some(ClusterKey::random().unwrap()),
            Some(ClusterKey::random().unwrap()),
        );
        assert_eq!(a.err().unwrap().reason(), "unauthenticated");
        assert_eq!(d.err().unwrap().reason(), "unauthenticated");
        // A bare (insecure) dialer at a keyed site, and the reverse.
        let (_, a) = pair(None, Some(ClusterKey::random().unwrap()));
        assert_eq!(a.err().unwrap().reason(), "unauthenticated");
        let (_, a) = pair(Some(ClusterKey::random().unwrap()), None);
        assert_eq!(a.err().unwrap().reason(), "insecure-mismatch");
        // Two insecure ends still work.
        let (d, a) = pair(None, None);
        assert!(d.is_ok() && a.is_ok());
    }

    /// A record replayed, reordered, altered or dropped fails its tag.
    #[test]
    fn replayed_altered_or_reordered_records_are_refused() {
        let k = ClusterKey::random().unwrap();
        let (d, a) = pair(Some(k.clone()), Some(k.clone()));
        let mut d = d.unwrap();
        let opener = a.unwrap().opener;
        let f1 = wire::encode(Frame::Ping);
        let (mut r1, mut r2) = (Vec::new(), Vec::new());
        d.sealer.seal(&f1, &mut r1);
        d.sealer.seal(&f1, &mut r2);
        let read = |bytes: Vec<u8>, opener| {
            let mut o = Opener::new(&bytes[..], opener);
            let mut out = Vec::new();
            loop {
                match wire::read_frame(&mut o, &Limits::default()) {
                    Ok(f) => out.push(f),
                    Err(e) => return (out, e.reason()),
                }
            }
        };
        // In order: both, then a clean end.
        let (ok, end) = read([r1.clone(), r2.clone()].concat(), opener);
        assert_eq!((ok.len(), end), (2, "closed"));
        // Each of these needs a fresh session (the opener's nonce moved).
        let fresh = || {
            let (d, a) = pair(Some(k.clone()), Some(k.clone()));
            let mut d = d.unwrap();
            let (mut x, mut y) = (Vec::new(), Vec::new());
            d.sealer.seal(&f1, &mut x);
            d.sealer.seal(&f1, &mut y);
            (x, y, a.unwrap().opener)
        };
        let (x, _, o) = fresh();
        assert_eq!(
            read([x.clone(), x].concat(), o),
            (vec![Frame::Ping], "forged"),
            "replay"
        );
        let (x, y, o) = fresh();
        assert_eq!(read([y, x].concat(), o).1, "forged", "reorder");
        let (_, y, o) = fresh();
        assert_eq!(read(y, o).1, "forged", "a dropped record");
        let (mut x, _, o) = fresh();
        let last = x.len() - 1;
        x[last] ^= 1;
        assert_eq!(read(x, o).1, "forged", "one bit flipped");
        // A record of a session replayed into another session.
        let (_, _, o) = fresh();
        assert_eq!(read(r1, o).1, "forged", "another session's record");
    }

    /// One byte every 100 ms never completes a handshake: the deadline is
    /// total, not per read.
    #[test]
    fn a_slow_loris_runs_into_the_total_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let writer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let mut first = [0u8; 64];
            first[..4].copy_from_slice(&NOISE_MAGIC);
            first[4..6].copy_from_slice(&wire::PROTOCOL_VERSION.to_le_bytes());
            first[6..8].copy_from_slice(&48u16.to_le_bytes());
            for b in first {
                if s.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (s, _) = l.accept().unwrap();
        let seen = Mutex::new(Handshake::new(9, 2));
        let key = ClusterKey::random().unwrap();
        let t = Instant::now();
        let r = accept(
            &s,
            &Credentials {
                key: Some(&key),
                ours: hello(0, 1),
                seen: &seen,
                limits: Limits::default(),
                timeout: Duration::from_millis(700),
            },
        );
        assert_eq!(r.err().unwrap().reason(), "handshake-timeout");
        assert!(
            t.elapsed() < Duration::from_millis(1500),
            "{:?}",
            t.elapsed()
        );
        drop(s);
        writer.join().unwrap();
    }

    /// The cost of sealing and opening one 4 KiB page, per cipher (run by
    /// hand: `cargo test --release -p mmulab-mirage cipher_cost -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn cipher_cost_of_a_page() {
        for params in [
            "Noise_NNpsk0_25519_AESGCM_SHA256",
            "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s",
        ] {
            let key = ClusterKey::random().unwrap();
            let p = || -> snow::params::NoiseParams { params.parse().unwrap() };
            let mut i = snow::Builder::new(p())
                .psk(0, key.bytes())
                .unwrap()
                .build_initiator()
                .unwrap();
            let mut r = snow::Builder::new(p())
                .psk(0, key.bytes())
                .unwrap()
                .build_responder()
                .unwrap();
            let (mut m, mut x) = ([0u8; 256], [0u8; 256]);
            let n = i.write_message(&[], &mut m).unwrap();
            r.read_message(&m[..n], &mut x).unwrap();
            let n = r.write_message(&[], &mut m).unwrap();
            i.read_message(&m[..n], &mut x).unwrap();
            let (mut i, mut r) = (
                i.into_transport_mode().unwrap(),
                r.into_transport_mode().unwrap(),
            );
            let page = vec![7u8; 4096 + 40];
            let (mut sealed, mut opened) = (vec![0u8; 8192], vec![0u8; 8192]);
            // Thread CPU time: the wall clock of a shared machine is noise.
            let cpu = || {
                let mut t = nix::libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: clock_gettime fills the struct.
                unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
                t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
            };
            let n = 20_000;
            let (t, c) = (Instant::now(), cpu());
            for _ in 0..n {
                let k = i.write_message(&page, &mut sealed).unwrap();
                r.read_message(&sealed[..k], &mut opened).unwrap();
            }
            println!(
                "{params}: seal + open of a 4 KiB page: {} ns of CPU ({} ns wall)",
                (cpu() - c) / n as u128,
                t.elapsed().as_nanos() / n as u128
            );
        }
    }
}
