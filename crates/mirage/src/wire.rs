//! The wire format of the real runtime (issue #7, "Sites and wire").
//!
//! A frame is a fixed 16-byte prefix, a postcard header, then the page
//! bytes raw:
//!
//! ```text
//! magic "MIRG" | version u16 LE | reserved u16 (0) | header_len u32 LE | page_len u32 LE
//! header: postcard(Header)          (header_len bytes, at most Limits::max_header)
//! page:   raw bytes                 (page_len bytes, at most Limits::max_page)
//! ```
//!
//! Both lengths are checked against the limits *before* anything is
//! allocated. A page travels outside the postcard header (the `bytes` of
//! `Msg::Page` / `Msg::CheckedIn` are moved out on encode and back on
//! decode), so a 4 KiB page is one copy into the frame, not a varint-coded
//! sequence. [`read_frame`] returns a whole, validated message or a named
//! [`WireError`]; it never hands back a partial one, so the runtime never
//! writes memory from a truncated or unexpected frame.
//!
//! The handshake ([`Hello`]) is the first frame on every connection: the
//! protocol version, the cluster id and the sending site's incarnation (a
//! number that grows each time a site restarts under the same name).
//! With a cluster key (issue #23) these frames travel only inside the
//! Noise channel of `runtime::handshake`, after both ends proved the key:
//! a hello, and so an incarnation, cannot come from outside the cluster.
//! Under `insecure = true` they travel bare, and anyone who reaches the
//! port and knows the cluster id is trusted.

use crate::core::{Msg, SegmentId, SiteId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};

pub const MAGIC: [u8; 4] = *b"MIRG";
/// Bumped on any change of the frame layout or of `Header`'s encoding.
/// 2: `Ping` (heartbeats) added.
/// 3: `Bye` (a clean close) added.
/// 4: the key directory carries each segment's origin (creator, owner,
///    mode, size), and `Remove` (System V's IPC_RMID) travels; frames
///    between sites ride the cluster key's Noise channel.
pub const PROTOCOL_VERSION: u16 = 4;
pub const PREFIX_BYTES: usize = 16;

/// Upper bounds checked before allocating. Every default is written here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest postcard header (a `Recall` naming many readers is the biggest
    /// page-less message; 64 KiB is far above it).
    pub max_header: u32,
    /// Largest page payload.
    pub max_page: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header: 64 * 1024,
            max_page: 1024 * 1024,
        }
    }
}

/// The first frame on a connection, in both directions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u16,
    pub cluster_id: u64,
    pub site: SiteId,
    pub name: String,
    /// Grows with each start of the site (the runtime uses the wall-clock
    /// start time in ns); an older value than one already seen is stale.
    pub incarnation: u64,
}

/// The key directory of the runtime (System V keys → segments). It is not
/// part of the coherence protocol: it only tells a site which segment a
/// key names. The directory lives on the first site of the configuration;
/// `Register` is a compare-and-set, so two sites that `IPC_CREAT` one key
/// at once both end up with the first registered segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirMsg {
    Lookup {
        req: u64,
        key: i32,
    },
    Found {
        req: u64,
        key: i32,
        segment: Option<SegmentId>,
        /// How the segment was created (owner, mode, size), for a site
        /// that did not create it.
        origin: Option<SegmentOrigin>,
    },
    Register {
        req: u64,
        key: i32,
        segment: SegmentId,
        origin: SegmentOrigin,
    },
    /// The segment the key names now (the caller's, or an earlier one).
    Registered {
        req: u64,
        key: i32,
        segment: SegmentId,
    },
    /// `IPC_RMID`: the key disappears at once.
    Remove {
        key: i32,
    },
}

/// What a key's segment was created with: the creator's effective uid and
/// gid, the mode bits and the size in bytes. The key directory hands it
/// to the other sites, whose shmid tables start from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentOrigin {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub size: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Header {
    Hello(Hello),
    /// A message of the core; page bytes, if any, follow the header raw.
    Core(Msg),
    Dir(DirMsg),
    /// A heartbeat: the sender is alive (a silent peer is declared dead
    /// after the runtime's `peer_timeout`).
    Ping,
    /// The sender closes this connection on purpose (a clean stop): the
    /// close that follows is not worth a log line.
    Bye,
}

/// A decoded, complete frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Hello(Hello),
    Core(Msg),
    Dir(DirMsg),
    Ping,
    Bye,
}

/// Why a frame or a peer was rejected. [`WireError::reason`] is the short
/// name the runtime logs beside the peer's name.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("connection closed between frames")]
    Closed,
    #[error("truncated frame: peer vanished in the {stage}")]
    Truncated { stage: &'static str },
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("wrong protocol version {got} (this site speaks {want})")]
    WrongVersion { got: u16, want: u16 },
    #[error("reserved field is {0:#x}, not 0")]
    Reserved(u16),
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLong {
        what: &'static str,
        len: u32,
        max: u32,
    },
    #[error("undecodable header: {0}")]
    Garbage(String),
    #[error("header has {0} trailing bytes")]
    TrailingBytes(usize),
    #[error("a {0} message carries page bytes")]
    UnexpectedPage(&'static str),
    #[error("a {0} message arrived without its page bytes")]
    MissingPage(&'static str),
    #[error("expected a hello, got {0}")]
    NotHello(&'static str),
    #[error("hello after the handshake")]
    HelloAgain,
    #[error("wrong cluster id {got:#x} (this cluster is {want:#x})")]
    WrongCluster { got: u64, want: u64 },
    #[error("unknown site {0:?}")]
    UnknownSite(SiteId),
    #[error("stale incarnation {got} of site {site:?} (already saw {seen})")]
    StaleIncarnation { site: SiteId, got: u64, seen: u64 },
    #[error("the peer did not prove the cluster key ({0})")]
    Unauthenticated(String),
    #[error("a frame failed authentication (forged, replayed, reordered or corrupted on the way)")]
    Forged,
    #[error("no handshake within {0:.1} s")]
    HandshakeTimeout(f64),
    #[error(
        "the peer authenticates with a cluster key, this site runs insecure = true: both ends need the same setting"
    )]
    InsecureMismatch,
    #[error("i/o: {0}")]
    Io(io::Error),
}

/// The error a decrypting reader returns (as `io::ErrorKind::InvalidData`)
/// for a record whose tag does not verify; [`read_frame`] names it
/// [`WireError::Forged`].
#[derive(Debug)]
pub struct AuthFailure;

impl std::fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("authentication tag mismatch")
    }
}

impl std::error::Error for AuthFailure {}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> WireError {
        if e.kind() == io::ErrorKind::InvalidData
            && e.get_ref().is_some_and(|x| x.is::<AuthFailure>())
        {
            WireError::Forged
        } else {
            WireError::Io(e)
        }
    }
}

impl WireError {
    /// A stable, short name for logs and tests.
    pub fn reason(&self) -> &'static str {
        match self {
            WireError::Closed => "closed",
            WireError::Truncated { .. } => "truncated",
            WireError::BadMagic(_) => "bad-magic",
            WireError::WrongVersion { .. } => "wrong-version",
            WireError::Reserved(_) => "reserved",
            WireError::TooLong { .. } => "too-long",
            WireError::Garbage(_) => "garbage",
            WireError::TrailingBytes(_) => "trailing-bytes",
            WireError::UnexpectedPage(_) => "unexpected-page",
            WireError::MissingPage(_) => "missing-page",
            WireError::NotHello(_) => "not-hello",
            WireError::HelloAgain => "hello-again",
            WireError::WrongCluster { .. } => "wrong-cluster",
            WireError::UnknownSite(_) => "unknown-site",
            WireError::StaleIncarnation { .. } => "stale-incarnation",
            WireError::Unauthenticated(_) => "unauthenticated",
            WireError::Forged => "forged",
            WireError::HandshakeTimeout(_) => "handshake-timeout",
            WireError::InsecureMismatch => "insecure-mismatch",
            WireError::Io(_) => "io",
        }
    }
}

fn kind(frame: &Header) -> &'static str {
    match frame {
        Header::Hello(_) => "hello",
        Header::Core(m) => m.kind(),
        Header::Dir(_) => "directory",
        Header::Ping => "ping",
        Header::Bye => "bye",
    }
}

/// Encodes one frame. The page bytes of `Page`/`CheckedIn` are moved out of
/// the message into the raw payload.
pub fn encode(frame: Frame) -> Vec<u8> {
    let (header, page) = match frame {
        Frame::Hello(h) => (Header::Hello(h), Vec::new()),
        Frame::Dir(d) => (Header::Dir(d), Vec::new()),
        Frame::Ping => (Header::Ping, Vec::new()),
        Frame::Bye => (Header::Bye, Vec::new()),
        Frame::Core(mut msg) => {
            let page = match &mut msg {
                Msg::Page { bytes, .. } | Msg::CheckedIn { bytes, .. } => std::mem::take(bytes),
                _ => Vec::new(),
            };
            (Header::Core(msg), page)
        }
    };
    let head = postcard::to_stdvec(&header).expect("postcard encodes every header");
    let mut out = Vec::with_capacity(PREFIX_BYTES + head.len() + page.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&(page.len() as u32).to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(&page);
    out
}

/// Writes one frame with a single `write_all` (one syscall on a socket
/// with `TCP_NODELAY`, so a frame is never split by Nagle).
pub fn write_frame(w: &mut impl Write, frame: Frame) -> io::Result<()> {
    w.write_all(&encode(frame))
}

/// Reads exactly `buf.len()` bytes; an EOF before the end is `Truncated`,
/// an EOF before the first byte of a frame is `Closed`.
fn fill(
    r: &mut impl Read,
    buf: &mut [u8],
    stage: &'static str,
    first: bool,
) -> Result<(), WireError> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) if done == 0 && first => return Err(WireError::Closed),
            Ok(0) => return Err(WireError::Truncated { stage }),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(WireError::Truncated { stage });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads and validates one whole frame.
pub fn read_frame(r: &mut impl Read, limits: &Limits) -> Result<Frame, WireError> {
    let mut prefix = [0u8; PREFIX_BYTES];
    fill(r, &mut prefix, "prefix", true)?;
    let magic: [u8; 4] = prefix[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([prefix[4], prefix[5]]);
    if version != PROTOCOL_VERSION {
        return Err(WireError::WrongVersion {
            got: version,
            want: PROTOCOL_VERSION,
        });
    }
    let reserved = u16::from_le_bytes([prefix[6], prefix[7]]);
    if reserved != 0 {
        return Err(WireError::Reserved(reserved));
    }
    let header_len = u32::from_le_bytes(prefix[8..12].try_into().expect("4 bytes"));
    let page_len = u32::from_le_bytes(prefix[12..16].try_into().expect("4 bytes"));
    // Bounds before allocation.
    if header_len > limits.max_header {
        return Err(WireError::TooLong {
            what: "header",
            len: header_len,
            max: limits.max_header,
        });
    }
    if page_len > limits.max_page {
        return Err(WireError::TooLong {
            what: "page",
            len: page_len,
            max: limits.max_page,
        });
    }
    let mut head = vec![0u8; header_len as usize];
    fill(r, &mut head, "header", false)?;
    let mut page = vec![0u8; page_len as usize];
    fill(r, &mut page, "page", false)?;
    let (header, rest) = postcard::take_from_bytes::<Header>(&head)
        .map_err(|e| WireError::Garbage(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::TrailingBytes(rest.len()));
    }
    let what = kind(&header);
    match header {
        Header::Hello(h) if page.is_empty() => Ok(Frame::Hello(h)),
        Header::Dir(d) if page.is_empty() => Ok(Frame::Dir(d)),
        Header::Ping if page.is_empty() => Ok(Frame::Ping),
        Header::Bye if page.is_empty() => Ok(Frame::Bye),
        Header::Core(mut msg) => {
            match &mut msg {
                Msg::Page { bytes, .. } | Msg::CheckedIn { bytes, .. } => {
                    if !bytes.is_empty() {
                        // The header itself must not smuggle page bytes.
                        return Err(WireError::UnexpectedPage(what));
                    }
                    if page.is_empty() {
                        return Err(WireError::MissingPage(what));
                    }
                    *bytes = page;
                }
                _ if !page.is_empty() => return Err(WireError::UnexpectedPage(what)),
                _ => {}
            }
            Ok(Frame::Core(msg))
        }
        _ => Err(WireError::UnexpectedPage(what)),
    }
}

/// The receiving side of the handshake: the last incarnation seen per site.
#[derive(Clone, Debug)]
pub struct Handshake {
    pub cluster_id: u64,
    pub sites: u16,
    seen: BTreeMap<SiteId, u64>,
}

impl Handshake {
    pub fn new(cluster_id: u64, sites: u16) -> Handshake {
        Handshake {
            cluster_id,
            sites,
            seen: BTreeMap::new(),
        }
    }

    /// Checks a peer's hello; on success records its incarnation. The same
    /// incarnation may reconnect; an older one is stale.
    pub fn accept(&mut self, hello: &Hello) -> Result<(), WireError> {
        if hello.version != PROTOCOL_VERSION {
            return Err(WireError::WrongVersion {
                got: hello.version,
                want: PROTOCOL_VERSION,
            });
        }
        if hello.cluster_id != self.cluster_id {
            return Err(WireError::WrongCluster {
                got: hello.cluster_id,
                want: self.cluster_id,
            });
        }
        if hello.site.0 >= self.sites {
            return Err(WireError::UnknownSite(hello.site));
        }
        if let Some(&seen) = self.seen.get(&hello.site)
            && hello.incarnation < seen
        {
            return Err(WireError::StaleIncarnation {
                site: hello.site,
                got: hello.incarnation,
                seen,
            });
        }
        self.seen.insert(hello.site, hello.incarnation);
        Ok(())
    }

    /// Reads the first frame of a connection and checks it.
    pub fn read_hello(&mut self, r: &mut impl Read, limits: &Limits) -> Result<Hello, WireError> {
        match read_frame(r, limits)? {
            Frame::Hello(h) => {
                self.accept(&h)?;
                Ok(h)
            }
            Frame::Core(m) => Err(WireError::NotHello(m.kind())),
            Frame::Dir(_) => Err(WireError::NotHello("directory")),
            Frame::Ping => Err(WireError::NotHello("ping")),
            Frame::Bye => Err(WireError::NotHello("bye")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Access, PageNo};

    fn seg() -> SegmentId {
        SegmentId {
            library: SiteId(0),
            serial: 3,
        }
    }

    fn page_msg(bytes: Vec<u8>) -> Msg {
        Msg::Page {
            segment: seg(),
            page: PageNo(1),
            op: 7,
            epoch: 2,
            access: Access::Write,
            bytes,
            window_ticks: 0,
            clock_of: None,
        }
    }

    fn hello(incarnation: u64) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            cluster_id: 0xc1,
            site: SiteId(1),
            name: "b".into(),
            incarnation,
        }
    }

    fn read(bytes: &[u8]) -> Result<Frame, WireError> {
        read_frame(&mut &bytes[..], &Limits::default())
    }

    fn reason(bytes: &[u8]) -> &'static str {
        read(bytes).expect_err("must be rejected").reason()
    }

    /// `Bye` (a clean close) travels as a frame of its own and is no
    /// hello: a connection cannot open with it.
    #[test]
    fn bye_round_trips_and_is_not_a_hello() {
        assert_eq!(read(&encode(Frame::Bye)).unwrap(), Frame::Bye);
        let mut hs = Handshake::new(0xc1, 2);
        let e = hs
            .read_hello(&mut &encode(Frame::Bye)[..], &Limits::default())
            .expect_err("bye is not a hello");
        assert!(matches!(e, WireError::NotHello("bye")), "{e}");
    }

    #[test]
    fn round_trips_every_kind_with_raw_page_bytes() {
        let page: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        let frames = vec![
            Frame::Hello(hello(5)),
            Frame::Dir(DirMsg::Lookup { req: 1, key: 42 }),
            Frame::Core(Msg::Done {
                segment: seg(),
                page: PageNo(0),
                op: 1,
            }),
            Frame::Core(page_msg(page.clone())),
            Frame::Core(Msg::CheckedIn {
                segment: seg(),
                page: PageNo(0),
                op: 9,
                bytes: page.clone(),
            }),
        ];
        let mut stream = Vec::new();
        for f in &frames {
            write_frame(&mut stream, f.clone()).unwrap();
        }
        let mut r = &stream[..];
        for f in frames {
            assert_eq!(read_frame(&mut r, &Limits::default()).unwrap(), f);
        }
        assert_eq!(
            read_frame(&mut r, &Limits::default()).unwrap_err().reason(),
            "closed"
        );
        // The page travels raw: the frame is barely larger than the page.
        let one = encode(Frame::Core(page_msg(page)));
        assert!(one.len() < 4096 + 64, "{}", one.len());
    }

    #[test]
    fn rejects_garbage_magic() {
        let mut f = encode(Frame::Hello(hello(1)));
        f[0] = b'X';
        assert_eq!(reason(&f), "bad-magic");
        assert_eq!(reason(b"GET / HTTP/1.1\r\n\r\n"), "bad-magic");
    }

    #[test]
    fn rejects_wrong_version() {
        let mut f = encode(Frame::Hello(hello(1)));
        f[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
        assert_eq!(reason(&f), "wrong-version");
    }

    #[test]
    fn rejects_nonzero_reserved() {
        let mut f = encode(Frame::Hello(hello(1)));
        f[6] = 1;
        assert_eq!(reason(&f), "reserved");
    }

    #[test]
    fn bounds_lengths_before_allocating() {
        // A prefix that claims 4 GiB: rejected from the 16 bytes alone.
        let mut f = encode(Frame::Hello(hello(1)))[..PREFIX_BYTES].to_vec();
        f[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(reason(&f), "too-long");
        let mut f = encode(Frame::Hello(hello(1)))[..PREFIX_BYTES].to_vec();
        f[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(reason(&f), "too-long");
    }

    #[test]
    fn rejects_truncation_at_every_byte() {
        let f = encode(Frame::Core(page_msg(vec![7; 4096])));
        assert_eq!(reason(&f[..0]), "closed");
        for cut in 1..f.len() {
            let e = read(&f[..cut]).expect_err("a cut frame is never returned");
            assert_eq!(e.reason(), "truncated", "cut at {cut}");
        }
    }

    #[test]
    fn rejects_undecodable_header() {
        let mut f = encode(Frame::Dir(DirMsg::Remove { key: 1 }));
        // An enum tag no variant has.
        f[PREFIX_BYTES] = 0x7f;
        assert_eq!(reason(&f), "garbage");
    }

    #[test]
    fn rejects_trailing_header_bytes() {
        let head = postcard::to_stdvec(&Header::Dir(DirMsg::Remove { key: 1 })).unwrap();
        let mut f = Vec::new();
        f.extend_from_slice(&MAGIC);
        f.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        f.extend_from_slice(&0u16.to_le_bytes());
        f.extend_from_slice(&(head.len() as u32 + 2).to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&head);
        f.extend_from_slice(&[0, 0]);
        assert_eq!(reason(&f), "trailing-bytes");
    }

    fn raw(header: &Header, page: &[u8]) -> Vec<u8> {
        let head = postcard::to_stdvec(header).unwrap();
        let mut f = Vec::new();
        f.extend_from_slice(&MAGIC);
        f.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        f.extend_from_slice(&0u16.to_le_bytes());
        f.extend_from_slice(&(head.len() as u32).to_le_bytes());
        f.extend_from_slice(&(page.len() as u32).to_le_bytes());
        f.extend_from_slice(&head);
        f.extend_from_slice(page);
        f
    }

    #[test]
    fn rejects_page_bytes_where_none_belong() {
        let done = Header::Core(Msg::Done {
            segment: seg(),
            page: PageNo(0),
            op: 1,
        });
        assert_eq!(reason(&raw(&done, &[1, 2, 3])), "unexpected-page");
        assert_eq!(
            reason(&raw(&Header::Hello(hello(1)), &[1])),
            "unexpected-page"
        );
        // Page bytes smuggled inside the header are refused too.
        assert_eq!(
            reason(&raw(&Header::Core(page_msg(vec![1; 8])), &[])),
            "unexpected-page"
        );
    }

    #[test]
    fn rejects_a_page_message_without_its_page() {
        assert_eq!(
            reason(&raw(&Header::Core(page_msg(Vec::new())), &[])),
            "missing-page"
        );
    }

    #[test]
    fn handshake_rejects_wrong_cluster_unknown_site_and_stale_incarnation() {
        let mut hs = Handshake::new(0xc1, 2);
        hs.accept(&hello(10)).unwrap();
        // Same incarnation may reconnect; a newer one replaces it.
        hs.accept(&hello(10)).unwrap();
        hs.accept(&hello(11)).unwrap();
        assert_eq!(
            hs.accept(&hello(10)).unwrap_err().reason(),
            "stale-incarnation"
        );
        let mut other = hello(12);
        other.cluster_id = 0xc2;
        assert_eq!(hs.accept(&other).unwrap_err().reason(), "wrong-cluster");
        let mut unknown = hello(12);
        unknown.site = SiteId(2);
        assert_eq!(hs.accept(&unknown).unwrap_err().reason(), "unknown-site");
        let mut old = hello(12);
        old.version = 0;
        assert_eq!(hs.accept(&old).unwrap_err().reason(), "wrong-version");
    }

    #[test]
    fn handshake_requires_hello_first() {
        let f = encode(Frame::Dir(DirMsg::Remove { key: 1 }));
        let mut hs = Handshake::new(0xc1, 2);
        let e = hs.read_hello(&mut &f[..], &Limits::default()).unwrap_err();
        assert_eq!(e.reason(), "not-hello");
        let f = encode(Frame::Hello(hello(3)));
        assert_eq!(
            hs.read_hello(&mut &f[..], &Limits::default())
                .unwrap()
                .incarnation,
            3
        );
    }
}
