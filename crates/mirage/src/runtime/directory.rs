//! The key directory (System V keys → segments) on the first site of
//! `cluster.toml` (issue #7's "key directory"). It is not part of the
//! coherence protocol: it only tells a site which segment a key names;
//! `Register` is a compare-and-set, so two sites that `IPC_CREAT` one key
//! at once both end up with the first registered segment. Since issue
//! #23 only authenticated peers reach it: a stranger can no longer look a
//! key up (finding 3's first step).

use super::core_loop::CoreLoop;
use super::node::Api;
use crate::core::{SegmentId, SiteId};
use crate::wire::{DirMsg, Frame, SegmentOrigin};
use std::sync::mpsc::Sender;

pub(crate) enum DirWait {
    Lookup(Sender<Option<(SegmentId, Option<SegmentOrigin>)>>),
    Register(Sender<SegmentId>),
}

impl CoreLoop {
    /// The directory's part of the API: `shmget`'s key lookups and
    /// registrations, `IPC_RMID`'s removal; answered here on the
    /// directory's site, else asked of it.
    pub(crate) fn dir_api(&mut self, api: Api) {
        let me = self.shared.me;
        match api {
            Api::Lookup { key, reply } => {
                if me == self.dir_site() {
                    let _ = reply.send(self.dir.get(&key).map(|&(s, o)| (s, Some(o))));
                } else {
                    let req = self.next_req;
                    self.next_req += 1;
                    self.dir_waits.insert(req, DirWait::Lookup(reply));
                    self.send_frame(self.dir_site(), Frame::Dir(DirMsg::Lookup { req, key }));
                }
            }
            Api::Register {
                key,
                segment,
                origin,
                reply,
            } => {
                if me == self.dir_site() {
                    let _ = reply.send(self.dir.entry(key).or_insert((segment, origin)).0);
                } else {
                    let req = self.next_req;
                    self.next_req += 1;
                    self.dir_waits.insert(req, DirWait::Register(reply));
                    let msg = DirMsg::Register {
                        req,
                        key,
                        segment,
                        origin,
                    };
                    self.send_frame(self.dir_site(), Frame::Dir(msg));
                }
            }
            Api::RemoveKey { key } => {
                if me == self.dir_site() {
                    self.dir.remove(&key);
                } else {
                    self.send_frame(self.dir_site(), Frame::Dir(DirMsg::Remove { key }));
                }
            }
            _ => unreachable!("dir_api is given directory calls only"),
        }
    }

    pub(crate) fn directory(&mut self, from: SiteId, msg: DirMsg) {
        match msg {
            DirMsg::Lookup { req, key } => {
                let found = self.dir.get(&key).copied();
                let (segment, origin) = (found.map(|f| f.0), found.map(|f| f.1));
                let reply = DirMsg::Found {
                    req,
                    key,
                    segment,
                    origin,
                };
                self.send_frame(from, Frame::Dir(reply));
            }
            DirMsg::Register {
                req,
                key,
                segment,
                origin,
            } => {
                let winner = self.dir.entry(key).or_insert((segment, origin)).0;
                let reply = DirMsg::Registered {
                    req,
                    key,
                    segment: winner,
                };
                self.send_frame(from, Frame::Dir(reply));
            }
            DirMsg::Remove { key } => {
                self.dir.remove(&key);
            }
            DirMsg::Found {
                req,
                segment,
                origin,
                ..
            } => {
                if let Some(DirWait::Lookup(r)) = self.dir_waits.remove(&req) {
                    let _ = r.send(segment.map(|s| (s, origin)));
                }
            }
            DirMsg::Registered { req, segment, .. } => {
                if let Some(DirWait::Register(r)) = self.dir_waits.remove(&req) {
                    let _ = r.send(segment);
                }
            }
        }
    }

    pub(crate) fn dir_site(&self) -> SiteId {
        SiteId(0)
    }
}
