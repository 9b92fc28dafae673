//! segmap, the kernel segment driver for transient file mappings used by
//! the file system's read and write calls (balan92 §Lazy Shutdowns):
//!
//! > "segmap manages its virtual space in fixed-size chunks (configured as
//! > 8K as the default value) and each chunk has an associated cookie.
//! > Unlike segkmem, however, when a segmap chunk is freed (last reference
//! > is released), the cookie for the chunk is set through the
//! > hat_getshootcookie() interface but the translations are not unloaded.
//! > Instead, this chunk is linked on to a list; the segmap aging daemon
//! > periodically looks at this list and unloads the translations at this
//! > time but does not perform a shutdown of the unloaded addresses. When
//! > the chunk is then reused by segmap, it calls hat_shutdown with the
//! > associated cookie. [...] This technique allows us to eliminate the
//! > shutdown entirely, if the chunk is reused with the same identity
//! > (same physical pages) before it is aged."
//!
//! The model. A *file* is a set of resident page-cache frames (allocated
//! zero-filled on first use, never evicted). `getmap(file, page)` maps the
//! chunk holding that page and returns the page's kernel address; the
//! calling thread then references it (the copy of `read`/`write`, done on
//! the hot path like any reference) and calls `release`. A chunk is
//!
//! * *in use* (references > 0, translations loaded),
//! * *cached* (on the free list, translations loaded, identity kept,
//!   cookie set): a `getmap` of the same identity reclaims it with no
//!   shootdown at all,
//! * *aged* (on the free list, translations unloaded by the daemon without
//!   a shootdown, identity dropped, cookie kept), or
//! * *fresh* (never used).
//!
//! A `getmap` miss takes the least recently released chunk: a cached one is
//! unloaded first (again without a shootdown), then `hat_shutdown(cookie)`
//! runs before the new translations are loaded; when it returns the
//! unloads are complete (the oracle's completion point, as for segkmem).
//! The cookie is taken at the last release, after the last access through
//! the chunk: no context touches a released chunk, so a TLB flushed in a
//! later tick holds none of its translations. The new holder of a reused
//! chunk is whom a missing shutdown would hurt: its references may hit a
//! stale entry of the old identity.
//!
//! Switches: `kernel.segmap_eager = true` is the ablation without reuse
//! (every last release unloads and calls `hat_shutdown` at once); for
//! protocols without cookies every unload completes when the pmap call
//! returns (their kernel unloads shoot at once).
//!
//! Locking: one segmap spin lock guards the hash, the free list and the
//! chunk states; it is dropped across the HAT calls of a `getmap` (the
//! chunk is marked loading; a concurrent `getmap` of the same identity
//! waits for it) and held across the aging pass (order: segmap → HAT →
//! shootdown).

use std::collections::{BTreeMap, VecDeque};

use mmulab_engine::Cycles;
use mmulab_machine::{CpuId, OpId, Pfn, Vpn};

use crate::pmap::{Change, Cookie, KERNEL_PMAP, Update};
use crate::sim::{KERNEL_BASE, PAGE_SHIFT, Sim};

/// A segmap request from a thread (the file system's use of segmap on its
/// behalf).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmapCall {
    /// `segmap_getmap`: map the chunk holding page `page` of file `file`;
    /// returns that page's kernel address.
    Getmap { file: u32, page: u64 },
    /// `segmap_release` of the chunk holding `va`.
    Release { va: u64 },
    /// One pass of the segmap aging daemon; returns the chunks aged.
    Age,
}

#[derive(Clone, Debug, Default)]
struct Chunk {
    /// (file, chunk index in the file).
    ident: Option<(u32, u64)>,
    refs: u32,
    /// Translations present in the kernel page table.
    loaded: bool,
    /// A getmap is loading the translations.
    loading: bool,
    /// Cookie of the last release whose unload still needs a shutdown
    /// before the chunk is reused with another identity.
    cookie: Option<u64>,
    /// Deferred unloads completed by that shutdown.
    ops: Vec<OpId>,
    /// On the free list.
    free: bool,
}

/// segmap's state (kernel virtual chunks, the identity hash, the free
/// list, the page cache).
#[derive(Clone, Debug)]
pub struct Segmap {
    /// First virtual page of segmap's space.
    pub base: u64,
    chunk_pages: u64,
    chunks: Vec<Chunk>,
    hash: BTreeMap<(u32, u64), usize>,
    /// Released chunks, least recently released first (fresh ones first).
    free_list: VecDeque<usize>,
    /// The page cache: (file, page) → frame.
    cache: BTreeMap<(u32, u64), Pfn>,
    lock: Option<usize>,
    /// The ablation: unload and shoot at every last release.
    pub eager: bool,
    /// Negative control only (set by the `svr42-segmap-no-shutdown`
    /// protocol): reuse skips `hat_shutdown`, as if every reuse were a
    /// reuse with the same identity.
    pub control_skip_shutdown: bool,
}

/// The first virtual page of segmap: the top of the kernel's 1 GB, below
/// a guard of 16 pages, away from segkmem (at the bottom).
pub fn segmap_base(pages: u64) -> u64 {
    let top = (KERNEL_BASE >> PAGE_SHIFT) + (1 << (30 - PAGE_SHIFT));
    top - 16 - pages
}

impl Segmap {
    /// `pages` of kernel virtual space in chunks of `chunk_pages`.
    pub fn new(pages: u64, chunk_pages: u64, eager: bool) -> Segmap {
        let chunk_pages = chunk_pages.max(1);
        let n = (pages / chunk_pages) as usize;
        Segmap {
            base: segmap_base(pages),
            chunk_pages,
            chunks: vec![Chunk::default(); n],
            hash: BTreeMap::new(),
            free_list: (0..n).collect(),
            cache: BTreeMap::new(),
            lock: None,
            eager,
            control_skip_shutdown: false,
        }
    }

    pub fn chunk_pages(&self) -> u64 {
        self.chunk_pages
    }

    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }

    fn va_of(&self, c: usize) -> u64 {
        self.base + c as u64 * self.chunk_pages
    }

    fn chunk_of(&self, vpn: u64) -> usize {
        assert!(
            vpn >= self.base && vpn < self.base + self.chunks.len() as u64 * self.chunk_pages,
            "segmap_release of {:#x}, not a segmap address",
            vpn << PAGE_SHIFT
        );
        ((vpn - self.base) / self.chunk_pages) as usize
    }

    /// Chunks on the free list with translations still loaded.
    pub fn cached(&self) -> usize {
        self.chunks.iter().filter(|c| c.free && c.loaded).count()
    }
}

/// What a getmap decided under the lock.
enum Plan {
    /// The identity is mapped (in use, or cached: reclaimed).
    Hit { chunk: usize, wait: bool },
    /// A chunk to load: unload its old translations first (cached), then
    /// shoot (its cookie), then load.
    Load {
        chunk: usize,
        unload: bool,
        cookie: Option<u64>,
        ops: Vec<OpId>,
    },
}

impl Sim {
    /// A segmap system call (see [`SegmapCall`]).
    pub(crate) async fn segmap_call(&self, cpu: CpuId, call: SegmapCall) -> u64 {
        if self.w().segmap.lock.is_none() {
            let l = self.new_lock();
            self.set_lock_class(l, crate::lockorder::LockClass::Driver);
            self.w().segmap.lock = Some(l);
        }
        match call {
            SegmapCall::Getmap { file, page } => self.segmap_getmap(cpu, file, page).await,
            SegmapCall::Release { va } => {
                self.segmap_release(cpu, va >> PAGE_SHIFT).await;
                0
            }
            SegmapCall::Age => self.segmap_age(cpu).await,
        }
    }

    fn segmap_lock(&self) -> usize {
        self.w().segmap.lock.expect("allocated")
    }

    /// Unloads `pages` kernel pages from `start` as one VM operation named
    /// `what`. Returns the operation when a lazy protocol deferred its
    /// completion (the `hat_shutdown` at reuse completes it).
    pub(crate) async fn kernel_unload(
        &self,
        cpu: CpuId,
        what: &str,
        start: u64,
        pages: u64,
    ) -> Option<OpId> {
        let op = self.begin_op(cpu, what);
        let p = self.protocol();
        p.update(
            self,
            cpu,
            Update {
                pmap: KERNEL_PMAP,
                start: Vpn(start),
                pages,
                change: Change::Remove,
            },
        )
        .await;
        let deferred = self.w().oracle.op(op).lazy;
        self.end_op(cpu);
        deferred.then_some(op)
    }

    /// Unloads a chunk's translations from the kernel pmap as one VM
    /// operation. Returns the operation when its completion was deferred
    /// (a lazy protocol: the shutdown at reuse completes it).
    async fn segmap_unload(&self, cpu: CpuId, chunk: usize) -> Option<OpId> {
        let (start, pages) = {
            let w = self.w();
            (w.segmap.va_of(chunk), w.segmap.chunk_pages)
        };
        let op = self.kernel_unload(cpu, "segmap unload", start, pages).await;
        self.count("segmap.unloads", 1);
        op
    }

    async fn segmap_getmap(&self, cpu: CpuId, file: u32, page: u64) -> u64 {
        let lock = self.segmap_lock();
        self.lock(cpu, lock).await;
        self.count("segmap.getmaps", 1);
        let plan = {
            let mut w = self.w();
            let s = &mut w.segmap;
            let key = (file, page / s.chunk_pages);
            if let Some(&c) = s.hash.get(&key) {
                let ch = &mut s.chunks[c];
                let reclaimed = ch.refs == 0;
                ch.refs += 1;
                if ch.free {
                    ch.free = false;
                    s.free_list.retain(|&x| x != c);
                }
                let wait = s.chunks[c].loading;
                drop(w);
                if reclaimed {
                    // Reuse with the same identity before aging: the
                    // translations are still loaded, no shutdown.
                    self.count("segmap.reclaims", 1);
                }
                Plan::Hit { chunk: c, wait }
            } else {
                let Some(c) = s.free_list.pop_front() else {
                    panic!(
                        "segmap: every chunk is in use ({} chunks): raise kernel.segmap_pages",
                        s.chunks.len()
                    );
                };
                let ch = &mut s.chunks[c];
                let old = ch.ident.take();
                ch.free = false;
                ch.refs = 1;
                ch.loading = true;
                ch.ident = Some(key);
                let unload = ch.loaded;
                ch.loaded = false;
                let cookie = ch.cookie.take();
                let ops = std::mem::take(&mut ch.ops);
                if let Some(o) = old {
                    s.hash.remove(&o);
                }
                s.hash.insert(key, c);
                Plan::Load {
                    chunk: c,
                    unload,
                    cookie,
                    ops,
                }
            }
        };
        self.unlock(cpu, lock).await;
        let chunk = match plan {
            Plan::Hit { chunk, wait } => {
                if wait {
                    self.spin_until(cpu, "segmap: a chunk being loaded", |w| {
                        !w.segmap.chunks[chunk].loading
                    })
                    .await;
                }
                chunk
            }
            Plan::Load {
                chunk,
                unload,
                cookie,
                mut ops,
            } => {
                self.count("segmap.misses", 1);
                if unload {
                    // A cached chunk taken for another identity: unload
                    // its translations (no shootdown yet).
                    ops.extend(self.segmap_unload(cpu, chunk).await);
                }
                if let Some(c) = cookie {
                    // The reuse: shoot whatever TLB is older than the
                    // release, then the unloads are complete.
                    let skip = self.w().segmap.control_skip_shutdown;
                    if !skip {
                        self.count("segmap.hat_shutdown_calls", 1);
                        let p = self.protocol();
                        p.hat_shutdown(self, cpu, Cookie::Age(c)).await;
                    }
                    for op in ops {
                        self.complete_op(op);
                    }
                }
                self.segmap_load(cpu, chunk, file).await;
                chunk
            }
        };
        let w = self.w();
        let off = page % w.segmap.chunk_pages;
        (w.segmap.va_of(chunk) + off) << PAGE_SHIFT
    }

    /// Loads a chunk's translations to its identity's page-cache frames
    /// (`hat_memload`: rights increase only, no shootdown).
    async fn segmap_load(&self, cpu: CpuId, chunk: usize, file: u32) {
        let (start, first_page, pages) = {
            let w = self.w();
            let s = &w.segmap;
            let (_, ci) = s.chunks[chunk].ident.expect("identity set");
            (s.va_of(chunk), ci * s.chunk_pages, s.chunk_pages)
        };
        for i in 0..pages {
            let key = (file, first_page + i);
            // The file page found by identity (file, offset), or created
            // and inserted, in one hold of the page-hash lock (SVR4.2).
            let hash = self.page_hash_enter(cpu).await;
            let cached = self.w().segmap.cache.get(&key).copied();
            let pfn = match cached {
                Some(f) => {
                    self.page_hash_exit(cpu, hash).await;
                    f
                }
                None => {
                    let f = self.alloc_data_or_stop(cpu).await;
                    self.w().segmap.cache.insert(key, f);
                    self.page_hash_exit(cpu, hash).await;
                    self.count("segmap.page_cache_fills", 1);
                    let c = self.costs().zero_fill_cycles;
                    self.delay(cpu, Cycles(c)).await;
                    f
                }
            };
            self.hat_memload(cpu, KERNEL_PMAP, Vpn(start + i), pfn, true)
                .await;
        }
        let mut w = self.w();
        let ch = &mut w.segmap.chunks[chunk];
        ch.loading = false;
        ch.loaded = true;
    }

    /// `segmap_release`: the last release takes a cookie and queues the
    /// chunk with its translations (eager ablation: unload and shoot).
    async fn segmap_release(&self, cpu: CpuId, vpn: u64) {
        let lock = self.segmap_lock();
        self.lock(cpu, lock).await;
        let (chunk, last, eager) = {
            let mut w = self.w();
            let s = &mut w.segmap;
            let c = s.chunk_of(vpn);
            let ch = &mut s.chunks[c];
            assert!(ch.refs > 0, "segmap_release of a chunk not in use");
            ch.refs -= 1;
            (c, ch.refs == 0, s.eager)
        };
        self.count("segmap.releases", 1);
        if !last {
            self.unlock(cpu, lock).await;
            return;
        }
        let p = self.protocol();
        if eager {
            // No reuse: unload now and shoot now; the chunk goes back
            // fresh (no identity, nothing pending).
            let op = self.segmap_unload(cpu, chunk).await;
            if let Some(c) = p.hat_getshootcookie(self) {
                self.count("segmap.hat_shutdown_calls", 1);
                p.hat_shutdown(self, cpu, Cookie::Age(c)).await;
            }
            if let Some(op) = op {
                self.complete_op(op);
            }
            let mut w = self.w();
            let s = &mut w.segmap;
            let ch = &mut s.chunks[chunk];
            ch.loaded = false;
            if let Some(id) = ch.ident.take() {
                s.hash.remove(&id);
            }
            ch.free = true;
            s.free_list.push_back(chunk);
        } else {
            let cookie = p.hat_getshootcookie(self);
            let mut w = self.w();
            let s = &mut w.segmap;
            let ch = &mut s.chunks[chunk];
            // A newer cookie covers an older one (a TLB flushed after the
            // newer release was flushed after the older).
            ch.cookie = cookie.or(ch.cookie);
            ch.free = true;
            s.free_list.push_back(chunk);
        }
        self.unlock(cpu, lock).await;
    }

    /// The aging daemon's pass: unload the translations of every cached
    /// chunk on the free list without a shootdown (the reuse will shoot
    /// with the release's cookie), dropping their identities.
    async fn segmap_age(&self, cpu: CpuId) -> u64 {
        let lock = self.segmap_lock();
        self.lock(cpu, lock).await;
        let list: Vec<usize> = {
            let w = self.w();
            let s = &w.segmap;
            s.free_list
                .iter()
                .copied()
                .filter(|&c| s.chunks[c].loaded)
                .collect()
        };
        for &c in &list {
            let op = self.segmap_unload(cpu, c).await;
            let mut w = self.w();
            let s = &mut w.segmap;
            let ch = &mut s.chunks[c];
            ch.loaded = false;
            ch.ops.extend(op);
            if let Some(id) = ch.ident.take() {
                s.hash.remove(&id);
            }
            if ch.cookie.is_none() {
                // A protocol without cookies: the unload already shot.
                debug_assert!(ch.ops.is_empty());
            }
        }
        self.count("segmap.aged", list.len() as u64);
        self.unlock(cpu, lock).await;
        list.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_sit_below_the_top_of_kernel_space() {
        let s = Segmap::new(512, 2, false);
        assert_eq!(s.chunks(), 256);
        assert_eq!(s.base + 512 + 16, 0x10_0000);
        assert_eq!(s.chunk_of(s.base + 3), 1);
        assert_eq!(s.va_of(1), s.base + 2);
        assert_eq!(s.free_list.len(), 256);
    }
}
