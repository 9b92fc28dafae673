//! Table 1's networks: an ordered broadcast tree for snooping and a 2D mesh
//! for the full-map directory. This module only prices transactions
//! (latency and message counts); who gets invalidated is decided by the
//! memory system (`lib.rs`), and is where the two protocols differ:
//! snooping reaches every core's caches and PCAMs, the directory only its
//! sharers (§5.3.1).
//!
//! Latency model (assumptions; the paper gives no network timings):
//! - Snooping: a request climbs to the root and is broadcast down, `2·d`
//!   tree hops with `d = ⌈log2 cores⌉` (min 1); that ordering point is when
//!   invalidations take effect (acks are implicit on an ordered tree). Data
//!   from the L2 (at the root) takes `d` more hops, from an owner L1 `2·d`.
//! - Directory: request `hops(c, home)` plus the lookup; then the longest of
//!   the data path (L2 bank at home → requester, or home → owner → requester)
//!   and every invalidation path (home → sharer → requester ack, the sharer
//!   probing its caches and PCAMs in one L1 cycle, §5.3.1); an upgrade with
//!   nothing to invalidate gets a grant from home.
//! - Writebacks leave through a write buffer: no latency, one message.

use crate::mesh::Mesh;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataSource {
    /// Upgrade: the requester already has the data.
    None,
    /// The L2 at home supplies it, after `mem_cycles` of memory if it missed.
    L2 { mem_cycles: u64 },
    /// The owner's L1D supplies it (cache-to-cache).
    Owner(usize),
}

/// One coherence transaction as the network sees it.
#[derive(Clone, Copy, Debug)]
pub struct Txn {
    pub requester: usize,
    pub block: u64,
    pub data: DataSource,
    /// Cores (bit mask) sent an invalidation, requester excluded.
    pub invalidated: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    Snooping { depth: u64, hop: u64 },
    Directory { mesh: Mesh, hop: u64, dir: u64 },
}

impl Network {
    pub fn snooping(cores: usize, hop: u64) -> Network {
        let depth = (cores.max(2) as u64).next_power_of_two().trailing_zeros() as u64;
        Network::Snooping { depth, hop }
    }

    #[inline]
    pub fn is_directory(&self) -> bool {
        matches!(self, Network::Directory { .. })
    }

    /// Cycles from the requester's L1 miss to completion (the requester's
    /// own L1 lookup excluded).
    #[inline]
    pub fn latency(&self, t: &Txn, l1: u64, l2: u64) -> u64 {
        match *self {
            Network::Snooping { depth, hop } => {
                let order = 2 * depth * hop;
                order
                    + match t.data {
                        DataSource::None => 0,
                        DataSource::L2 { mem_cycles } => l2 + mem_cycles + depth * hop,
                        DataSource::Owner(_) => l1 + 2 * depth * hop,
                    }
            }
            Network::Directory { mesh, hop, dir } => {
                let c = t.requester as u64;
                let h = mesh.home(t.block);
                // XY hops are symmetric: home → requester is the same path
                let to_home = mesh.hops(c, h) * hop;
                let req = to_home + dir;
                let data = match t.data {
                    DataSource::None => 0,
                    DataSource::L2 { mem_cycles } => l2 + mem_cycles + to_home,
                    DataSource::Owner(o) => {
                        let o = o as u64;
                        mesh.hops(h, o) * hop + l1 + mesh.hops(o, c) * hop
                    }
                };
                let mut inv = 0;
                let mut m = t.invalidated;
                while m != 0 {
                    let s = m.trailing_zeros() as u64;
                    m &= m - 1;
                    inv = inv.max(mesh.hops(h, s) * hop + l1 + mesh.hops(s, c) * hop);
                }
                let grant = if t.data == DataSource::None && t.invalidated == 0 {
                    to_home
                } else {
                    0
                };
                req + data.max(inv).max(grant)
            }
        }
    }

    /// Messages the transaction puts on the network.
    #[inline]
    pub fn messages(&self, t: &Txn) -> u64 {
        let data = match t.data {
            DataSource::None => 0,
            DataSource::L2 { .. } => 1,
            DataSource::Owner(_) => 2,
        };
        match self {
            // one broadcast, the data reply
            Network::Snooping { .. } => 1 + data.min(1),
            Network::Directory { .. } => {
                let invs = 2 * crate::ones(t.invalidated);
                let grant = u64::from(t.data == DataSource::None && t.invalidated == 0);
                1 + data + invs + grant
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snooping_prices() {
        let n = Network::snooping(16, 2);
        assert_eq!(n, Network::Snooping { depth: 4, hop: 2 });
        let t = Txn {
            requester: 0,
            block: 0,
            data: DataSource::L2 { mem_cycles: 0 },
            invalidated: 0,
        };
        assert_eq!(n.latency(&t, 1, 6), 16 + 6 + 8);
        let up = Txn {
            data: DataSource::None,
            ..t
        };
        assert_eq!(n.latency(&up, 1, 6), 16);
        assert_eq!(
            Network::snooping(2, 2),
            Network::Snooping { depth: 1, hop: 2 }
        );
    }

    #[test]
    fn directory_takes_max_over_sharers() {
        let n = Network::Directory {
            mesh: Mesh::new(4, 4),
            hop: 2,
            dir: 6,
        };
        // requester 0, home tile 5 (block 5), sharers 15 and 1
        let t = Txn {
            requester: 0,
            block: 5,
            data: DataSource::None,
            invalidated: (1 << 15) | (1 << 1),
        };
        let req = 2 * 2 + 6;
        let far = (4 + 6) * 2 + 1; // 5→15 is 4 hops, 15→0 is 6
        assert_eq!(n.latency(&t, 1, 6), req + far);
        assert_eq!(n.messages(&t), 1 + 4);
        let grant = Txn {
            invalidated: 0,
            ..t
        };
        assert_eq!(n.latency(&grant, 1, 6), req + 4);
    }
}
