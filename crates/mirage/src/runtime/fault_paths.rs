//! The fault paths: page faults in, failures out (issue #7; split out of
//! `node.rs` by issue #23).
//!
//! In: records from the SIGSEGV handler's pipe (mprotect path), events of
//! this process's userfaultfd, and events of programs' userfaultfds
//! (passed by the shim over the local socket), each handed to the core
//! under its lock. Out: a faulter is released with the retry, a SIGSEGV
//! (a write through `SHM_RDONLY`) or a failure, which is SIGBUS with one
//! stderr line naming segment, page and why: its page is lost (its only
//! current copy was at a dead site), a request timed out, or the site is
//! stopping. A program under the shim whose daemon is gone altogether
//! gets the same from the shim itself (finding 6: `crates/mirage-shim/src/daemon_gone.rs`).

use super::core_loop::CoreLoop;
use super::fault::{self, FaultRecord, RECORD_BYTES};
use super::local::{Client, proto};
use super::node::{Shared, seg_name, stamp};
use super::spin::Spin;
use crate::core::{Access, Event, Held, PageNo, ProcessId, SegmentId, SiteId};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::time::Instant;

/// A faulter asleep until its page is served.
pub(crate) enum Waiter {
    /// In this process: the futex word on its stack.
    Local(u64),
    /// In a program: its wait slot, released through its socket.
    Remote(Arc<Client>, u64),
    /// In this process, asleep in the kernel on a userfaultfd page.
    Uffd(Arc<super::uffd::Uffd>, usize),
    /// In a program, asleep in the kernel on a page of its attach
    /// `process`, registered with its userfaultfd (`uffd`, passed to the
    /// daemon): (client, uffd, page address in the program).
    RemoteUffd(Arc<Client>, Arc<super::uffd::Uffd>, usize),
    /// A checked access of the Rust API: it asks again when released.
    Api(Sender<()>),
}

impl Waiter {
    pub(crate) fn release(self, value: u32, reason: &str) {
        match self {
            Waiter::Local(w) => {
                if value == fault::WAKE_FAIL {
                    fault::set_reason(reason);
                }
                // SAFETY: each word's faulter sleeps until released.
                unsafe { fault::release(w, value) }
            }
            Waiter::Uffd(u, page_addr) => {
                let ps = super::page_size();
                if value != fault::WAKE_RETRY {
                    // The retried access takes a genuine SIGBUS there.
                    eprintln!("mmulab dsm: {reason}; SIGBUS");
                    super::uffd::poison(page_addr, ps);
                }
                u.wake(page_addr, ps);
            }
            Waiter::RemoteUffd(c, u, page_addr) => {
                // A failure: the program's service thread maps an empty
                // memfd over the page (in its own address space) and
                // wakes the faulter, whose retry takes a SIGBUS there.
                if value == fault::WAKE_RETRY || !c.lost(page_addr, reason) {
                    u.wake(page_addr, super::page_size());
                }
            }
            Waiter::Api(tx) => {
                let _ = tx.send(());
            }
            Waiter::Remote(c, slot) => {
                let v = match value {
                    fault::WAKE_RETRY => proto::wake::RETRY,
                    fault::WAKE_SEGV => proto::wake::SEGV,
                    _ => proto::wake::FAIL,
                };
                c.wake(slot, v, reason);
            }
        }
    }
}

/// The next fault of `uffd`: polled for first while faults come close
/// together ([`Spin`]), then waited for (200 ms at most, so that a stop
/// is noticed).
fn next_fault(uffd: &super::uffd::Uffd, spin: &mut Spin) -> std::io::Result<Option<(usize, bool)>> {
    let start = Instant::now();
    let got = match spin.poll(|| uffd.try_fault())? {
        Some(f) => Some(f),
        None => uffd.next_fault(200)?,
    };
    spin.waited(start.elapsed());
    Ok(got)
}

/// The userfaultfd path's fault thread: events to the core, as records.
pub(crate) fn uffd_reader(shared: Arc<Shared>, uffd: Arc<super::uffd::Uffd>) {
    let ps = super::page_size();
    let mut spin = Spin::new(shared.options.spin);
    while !shared.stopping.load(Ordering::SeqCst) {
        let (addr, write) = match next_fault(&uffd, &mut spin) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(_) => break,
        };
        shared.counters.faults.fetch_add(1, Ordering::Relaxed);
        let page_addr = addr & !(ps - 1);
        let mut served = false;
        shared.with_core(|c| {
            served = true;
            c.fault_uffd(page_addr, write, uffd.clone());
        });
        if !served {
            super::uffd::poison(page_addr, ps);
            uffd.wake(page_addr, ps);
        }
    }
}

/// The fault thread of one program's userfaultfd (the shim's, passed over
/// the local socket): the kernel queues the program's faults on it, this
/// thread hands them to the core. It never touches the program's memory.
pub(crate) fn remote_uffd_reader(
    shared: Arc<Shared>,
    client: Arc<Client>,
    uffd: Arc<super::uffd::Uffd>,
) {
    let ps = super::page_size();
    let mut spin = Spin::new(shared.options.spin);
    while !shared.stopping.load(Ordering::SeqCst) && !client.gone() {
        let (addr, write) = match next_fault(&uffd, &mut spin) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(_) => break,
        };
        shared.counters.faults.fetch_add(1, Ordering::Relaxed);
        shared
            .counters
            .program_uffd_faults
            .fetch_add(1, Ordering::Relaxed);
        let page_addr = addr & !(ps - 1);
        let mut served = false;
        shared.with_core(|c| {
            served = true;
            c.fault_remote_uffd(&client, &uffd, page_addr, write);
        });
        if !served {
            // The daemon is stopping: the program's lost-page line and
            // SIGBUS, as for a fault that cannot be served.
            let _ = client.lost(page_addr, "the site daemon is stopping");
            uffd.wake(page_addr, ps);
        }
    }
}

pub(crate) fn fault_reader(shared: Arc<Shared>, pipe: OwnedFd) {
    let mut file = std::fs::File::from(pipe);
    let mut buf = [0u8; RECORD_BYTES];
    while file.read_exact(&mut buf).is_ok() {
        let rec = FaultRecord::from_bytes(&buf);
        if rec.id == u32::MAX {
            return;
        }
        shared.counters.faults.fetch_add(1, Ordering::Relaxed);
        shared.with_core(|c| c.fault(rec));
    }
}

impl CoreLoop {
    /// "; dead: b, c" or "".
    pub(crate) fn dead_list(&self) -> String {
        let peers = self.shared.peers.lock().expect("peers");
        let dead: Vec<&str> = peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.dead.is_some())
            .map(|(i, _)| self.shared.config.name(SiteId(i as u16)))
            .collect();
        if dead.is_empty() {
            String::new()
        } else {
            format!("; dead: {}", dead.join(", "))
        }
    }

    /// Marks a page lost here and fails everyone waiting for it.
    pub(crate) fn lose(&mut self, segment: SegmentId, page: PageNo, why: String) {
        eprintln!(
            "mmulab dsm site {}: lost: {why}",
            self.shared.config.name(self.shared.me)
        );
        let keys: Vec<(u32, u32)> = self
            .waiters
            .keys()
            .filter(|(p, pg)| {
                *pg == page.0 && self.attaches.get(p).is_some_and(|a| a.segment == segment)
            })
            .copied()
            .collect();
        for k in keys {
            for (_, w) in self.waiters.remove(&k).unwrap_or_default() {
                w.release(fault::WAKE_FAIL, &why);
            }
        }
        self.lost.insert((segment, page), why);
    }

    /// Why a page is lost with the dead site `site`, as logs print it.
    pub(crate) fn lost_reason(&self, segment: SegmentId, page: PageNo, site: SiteId) -> String {
        let why = self.shared.peers.lock().expect("peers")[site.0 as usize]
            .dead
            .clone()
            .unwrap_or_else(|| "declared dead".into());
        format!(
            "segment {} page {}: lost: its only current copy was at site {}, which is dead ({why})",
            seg_name(segment),
            page.0,
            self.shared.config.name(site)
        )
    }

    /// A peer vanished: logged by name; the segments it was the library
    /// of are dead, and their pages not held here are lost.
    pub(crate) fn peer_dead(&mut self, site: SiteId, reason: &str) {
        if site == self.shared.me || self.shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        {
            let mut peers = self.shared.peers.lock().expect("peers");
            let p = &mut peers[site.0 as usize];
            if p.dead.is_some() {
                return;
            }
            p.dead = Some(reason.to_string());
        }
        let name = self.shared.config.name(site).to_string();
        self.shared
            .log_drop(format!("site {name}: vanished: {reason}"));
        if let Some(o) = self.out[site.0 as usize].take() {
            o.close();
        }
        let known: Vec<SegmentId> = self
            .created
            .iter()
            .chain(self.segs.keys())
            .chain(self.attaches.values().map(|a| &a.segment))
            .copied()
            .collect();
        for segment in known {
            self.fenced.insert((site, segment));
        }
        let orphaned: Vec<SegmentId> = self
            .segs
            .keys()
            .chain(self.attaches.values().map(|a| &a.segment))
            .filter(|s| s.library == site)
            .copied()
            .collect();
        for segment in orphaned {
            self.dead_segments.insert(segment);
        }
        // The core decides what is lost: pages whose only current copy
        // was there (as library), faults that need the dead library (as
        // holder); read copies elsewhere stay readable.
        self.feed(Event::SiteDead { site });
    }

    pub(crate) fn fault(&mut self, rec: FaultRecord) {
        let st = &self.shared.counters.stamps;
        st.fault_delivered.store(stamp(), Ordering::Relaxed);
        self.fault_inner(rec);
        let st = &self.shared.counters.stamps;
        st.request_sent.store(stamp(), Ordering::Relaxed);
    }

    /// A userfaultfd event on one of this process's mappings.
    pub(crate) fn fault_uffd(
        &mut self,
        page_addr: usize,
        write: bool,
        uffd: Arc<super::uffd::Uffd>,
    ) {
        let found = self.attaches.iter().find_map(|(&id, a)| {
            let (base, _) = a.local?;
            let mem = self.segs.get(&a.segment)?;
            let (b, page) = mem.local_page_of(page_addr)?;
            (b == base).then_some((id, page))
        });
        let waiter = Waiter::Uffd(uffd.clone(), page_addr);
        let Some((id, page)) = found else {
            // Not (or no longer) ours: let it retry.
            uffd.wake(page_addr, super::page_size());
            return;
        };
        self.fault_stamped(id, page.0, write, waiter);
    }

    /// A typed userfaultfd fault handed to the core, with the bench's
    /// delivery and request stamps around it.
    pub(crate) fn fault_stamped(&mut self, id: u32, page: u32, write: bool, waiter: Waiter) {
        let access = if write {
            fault::ACCESS_WRITE
        } else {
            fault::ACCESS_READ
        };
        let st = &self.shared.counters.stamps;
        st.fault_delivered.store(stamp(), Ordering::Relaxed);
        self.fault_from(id, page, access, waiter);
        let st = &self.shared.counters.stamps;
        st.request_sent.store(stamp(), Ordering::Relaxed);
    }

    /// A userfaultfd event in a program (its attach mapping registered
    /// with the fd it passed).
    pub(crate) fn fault_remote_uffd(
        &mut self,
        client: &Arc<Client>,
        uffd: &Arc<super::uffd::Uffd>,
        page_addr: usize,
        write: bool,
    ) {
        let ps = super::page_size();
        let found = self.attaches.iter().find_map(|(&id, a)| {
            let c = a.client.as_ref()?;
            if !Arc::ptr_eq(c, client) {
                return None;
            }
            let mem = self.segs.get(&a.segment)?;
            Some((id, a.segment, mem.remote_uffd_page(id, page_addr)?))
        });
        let Some((id, segment, page)) = found else {
            // Not (or no longer) a DSM mapping: let it retry.
            uffd.wake(page_addr, ps);
            return;
        };
        if let Some(mem) = self.segs.get(&segment)
            && mem.allows(page, write)
        {
            // The fault raced a grant: make sure this mapping has it too.
            mem.refresh_remote(id, page);
            uffd.wake(page_addr, ps);
            return;
        }
        let waiter = Waiter::RemoteUffd(client.clone(), uffd.clone(), page_addr);
        self.fault_stamped(id, page.0, write, waiter);
    }

    /// A program's `REGISTER` of its pending userfaultfd mapping
    /// (`uffd` = None: it fell back to mprotect).
    pub(crate) fn register_remote(
        &mut self,
        client: &Arc<Client>,
        process: u32,
        uffd: Option<(Arc<super::uffd::Uffd>, usize)>,
    ) -> bool {
        let Some(a) = self.attaches.get(&process) else {
            return false;
        };
        if !a.client.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            return false;
        }
        self.segs
            .get_mut(&a.segment)
            .is_some_and(|mem| mem.register_remote(process, uffd))
    }

    pub(crate) fn fault_inner(&mut self, rec: FaultRecord) {
        self.fault_from(rec.id, rec.page, rec.access, Waiter::Local(rec.word));
    }

    /// A fault of attach `id` on `page`; `waiter` sleeps until served.
    pub(crate) fn fault_from(&mut self, id: u32, page: u32, access: u32, waiter: Waiter) {
        if self.shared.checking_in.load(Ordering::SeqCst) {
            let why = format!(
                "page {page}: site {} is stopping",
                self.shared.config.name(self.shared.me)
            );
            waiter.release(fault::WAKE_FAIL, &why);
            return;
        }
        let Some(a) = self.attaches.get(&id) else {
            // The mapping was detached meanwhile: the retry finds no slot
            // and crashes as on any unmapped address.
            waiter.release(fault::WAKE_RETRY, "");
            return;
        };
        let segment = a.segment;
        let readonly = a.readonly;
        let rec_page = page;
        let page = PageNo(page);
        let held = self
            .site
            .page_view(segment, page)
            .map_or(Held::Nothing, |v| v.held);
        let access = match access {
            fault::ACCESS_READ => Access::Read,
            fault::ACCESS_WRITE => Access::Write,
            // Read-then-upgrade: a fault on a readable page is a write.
            _ if held.allows(Access::Read) => Access::Write,
            _ => Access::Read,
        };
        if access == Access::Write && readonly {
            waiter.release(fault::WAKE_SEGV, "");
            return;
        }
        if (held == Held::Nothing || access == Access::Write)
            && let Some(why) = self.lost.get(&(segment, page)).cloned()
        {
            // Coherence before availability: fail, never guess.
            waiter.release(fault::WAKE_FAIL, &why);
            return;
        }
        self.waiters
            .entry((id, rec_page))
            .or_default()
            .push((Instant::now(), waiter));
        self.feed(Event::Fault {
            segment,
            page,
            process: ProcessId(id),
            access,
        });
    }
}
