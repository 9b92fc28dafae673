//! Property tests of the DSM wire decoder (issue 24): random bytes, and
//! valid frames of every kind mutated, read as a hostile peer would send
//! them, as one frame and as a stream of frames, and through the
//! handshake. Nothing may panic; a frame read back unmutated is the frame
//! sent; no input makes the decoder allocate more than the limits allow
//! (a counting allocator). `MMULAB_FUZZ_CASES` cases each (default 10,000).

use mmulab_mirage::core::{Access, Msg, PageNo, SegmentId, SiteId};
use mmulab_mirage::wire::{
    DirMsg, Frame, Handshake, Hello, Limits, PROTOCOL_VERSION, encode, read_frame,
};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: mmulab_testkit::Counting = mmulab_testkit::Counting;

/// The decoder allocates a header and a page, each checked against the
/// limits first; nothing a peer sends may make it ask for more.
fn memory_bounded() {
    let l = Limits::default();
    let cap = (l.max_header as usize).max(l.max_page as usize) * 2;
    mmulab_testkit::assert_memory_bounded(cap, usize::MAX);
}

fn cases() -> u32 {
    mmulab_testkit::fuzz_cases()
}

fn seg() -> SegmentId {
    SegmentId {
        library: SiteId(0),
        serial: 3,
    }
}

/// One valid frame of each kind.
fn frames() -> Vec<Frame> {
    vec![
        Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            cluster_id: 0xc1,
            site: SiteId(1),
            name: "b".into(),
            incarnation: 7,
        }),
        Frame::Dir(DirMsg::Lookup { req: 1, key: 42 }),
        Frame::Core(Msg::Done {
            segment: seg(),
            page: PageNo(0),
            op: 1,
        }),
        Frame::Core(Msg::Request {
            segment: seg(),
            page: PageNo(5),
            access: Access::Read,
            process: mmulab_mirage::core::ProcessId(9),
        }),
        Frame::Core(Msg::Page {
            segment: seg(),
            page: PageNo(1),
            op: 7,
            epoch: 2,
            access: Access::Write,
            bytes: (0..64).collect(),
            window_ticks: 0,
            clock_of: None,
        }),
        Frame::Ping,
        Frame::Bye,
    ]
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Delete(usize, usize),
    Insert(usize, Vec<u8>),
    /// A length field set to a chosen value (header 8..12, page 12..16).
    Length(bool, u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), 0usize..16).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 0..16)
        )
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (
            any::<bool>(),
            prop_oneof![Just(u32::MAX), Just(0), any::<u32>(), 0u32..200]
        )
            .prop_map(|(h, v)| Mutation::Length(h, v)),
    ]
}

fn apply(mut v: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let n = v.len().max(1);
        match m {
            Mutation::Flip(i, b) => {
                if !v.is_empty() {
                    let i = i % n;
                    v[i] ^= b | 1;
                }
            }
            Mutation::Delete(i, k) => {
                let i = i % n;
                let end = (i + k).min(v.len());
                if i < end {
                    v.drain(i..end);
                }
            }
            Mutation::Insert(i, bytes) => {
                let i = i % (v.len() + 1);
                v.splice(i..i, bytes.iter().copied());
            }
            Mutation::Length(header, len) => {
                let at = if *header { 8 } else { 12 };
                if v.len() >= at + 4 {
                    v[at..at + 4].copy_from_slice(&len.to_le_bytes());
                }
            }
        }
    }
    v
}

/// Reads frames until the stream ends or one is refused.
fn read_all(bytes: &[u8]) -> Vec<Frame> {
    let mut r = bytes;
    let mut out = Vec::new();
    while let Ok(f) = read_frame(&mut r, &Limits::default()) {
        out.push(f);
        assert!(out.len() <= bytes.len(), "frames out of nothing");
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300), magic in any::<bool>()) {
        let mut bytes = bytes;
        if magic && bytes.len() >= 8 {
            // Past the magic and version, to reach the lengths and postcard.
            bytes[..4].copy_from_slice(b"MIRG");
            bytes[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
            bytes[6..8].copy_from_slice(&[0, 0]);
        }
        let _ = read_all(&bytes);
        let _ = Handshake::new(0xc1, 3).read_hello(&mut &bytes[..], &Limits::default());
        memory_bounded();
    }

    /// Valid frames, mutated, one at a time and as a stream: refused or
    /// read, never a panic; unmutated, read back as sent.
    #[test]
    fn mutated_frames(which in 0usize..7, muts in proptest::collection::vec(mutation(), 0..4)) {
        let all = frames();
        let frame = all[which].clone();
        let bytes = apply(encode(frame.clone()), &muts);
        let got = read_frame(&mut &bytes[..], &Limits::default());
        if muts.is_empty() {
            prop_assert_eq!(got.ok(), Some(frame));
        }
        let mut stream = Vec::new();
        for f in &all {
            stream.extend(encode(f.clone()));
        }
        let stream = apply(stream, &muts);
        let read = read_all(&stream);
        if muts.is_empty() {
            prop_assert_eq!(read, all);
        }
        memory_bounded();
    }
}
