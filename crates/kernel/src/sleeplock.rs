//! Reader/writer sleep locks and the per-page locks of the page layer
//! (balan92 §Locking Design: "A read/write sleep lock which is acquired in
//! reader mode to ensure that the page state, identity and data are valid
//! and remain so and acquired in writer mode if modifying any of the
//! above"; "A per page spin lock for mutexing the fields of the page
//! structure"). General: any protocol or driver may allocate sleep locks.
//!
//! A sleep lock is a wait queue guarded by a spin lock (the guard is the
//! primitive's own: taking and releasing it costs `lock_cycles +
//! unlock_cycles` per operation, the SVR4.2 `sleep_t` layout, and it is
//! what the paper's "per segment spin lock which guards the sleep lock"
//! is). A waiter does not spin: it queues itself and its CPU stops
//! executing until the releaser hands it the lock (FIFO; consecutive
//! readers at the head are granted together) and it is switched back in
//! (`context_switch_cycles` after the release). While blocked it takes
//! every interrupt its level lets through, so a shootdown aimed at it is
//! answered.
//!
//! Model limit: the simulated kernel has one kernel context per CPU, so a
//! blocked thread's CPU does not run another thread meanwhile (it waits
//! interruptibly, as an idle CPU does); what the model keeps of "sleeping"
//! is no spinning, no bus traffic, FIFO hand-off and the switch-in cost.
//!
//! Sleeping while holding a spin lock is a locking error (the holder of
//! the spin lock would be descheduled): counted as a lock-order violation.
//! A wait longer than the spin bound (in cycles) is a liveness failure.

use std::collections::VecDeque;

use mmulab_engine::Cycles;
use mmulab_machine::CpuId;

use crate::lockorder::{LockClass, LockRef};
use crate::sim::{Event, Liveness, Sim};

/// One reader/writer sleep lock.
#[derive(Clone, Debug, Default)]
pub struct SleepLock {
    pub class: Option<LockClass>,
    pub writer: Option<CpuId>,
    pub readers: Vec<CpuId>,
    /// Blocked acquirers, FIFO: (CPU, writer mode).
    pub waiters: VecDeque<(CpuId, bool)>,
}

impl SleepLock {
    fn holds(&self, cpu: CpuId) -> bool {
        self.writer == Some(cpu) || self.readers.contains(&cpu)
    }
    fn free_for(&self, write: bool) -> bool {
        if write {
            self.writer.is_none() && self.readers.is_empty() && self.waiters.is_empty()
        } else {
            // Readers do not pass a queued writer (no writer starvation).
            self.writer.is_none() && self.waiters.is_empty()
        }
    }
}

/// The page layer's per-page locks, allocated on first use.
#[derive(Clone, Debug, Default)]
pub struct PageLocks {
    /// pfn → (spin lock in `World::locks`, sleep lock in
    /// `World::sleep_locks`).
    pub by_pfn: std::collections::BTreeMap<u64, (usize, usize)>,
}

impl Sim {
    /// True when the VM layer runs with reader/writer address-map locks
    /// and the page layer's locks that concurrent faults then need: the
    /// SVR4.2 VM locks (`Protocol::rw_vm_locks`) or Mach's read/write map
    /// lock (`Protocol::rw_map_lock`).
    pub fn page_layer_locks(&self) -> bool {
        let p = self.protocol();
        p.rw_vm_locks() || p.rw_map_lock()
    }

    /// Allocates a sleep lock of `class` (None: not checked).
    pub fn new_sleep_lock(&self, class: Option<LockClass>) -> usize {
        let mut w = self.w();
        w.sleep_locks.push(SleepLock {
            class,
            ..Default::default()
        });
        w.sleep_locks.len() - 1
    }

    /// The page's (spin lock, sleep lock).
    pub fn page_locks(&self, pfn: u64) -> (usize, usize) {
        if let Some(&l) = self.w().page_locks.by_pfn.get(&pfn) {
            return l;
        }
        let spin = self.new_lock();
        self.set_lock_class(spin, LockClass::PageSpin);
        let sleep = self.new_sleep_lock(Some(LockClass::PageSleep));
        self.w().page_locks.by_pfn.insert(pfn, (spin, sleep));
        (spin, sleep)
    }

    /// With the reader/writer VM locks ([`Sim::page_layer_locks`]), takes
    /// the page layer's global page-hash spin lock (balan92 §Locking Design:
    /// "A global spin lock in the page layer for protecting the page hash
    /// chains"; a leaf, see `lockorder`) and returns it; else None and
    /// nothing is taken. Held around finding a page by identity and
    /// inserting or removing one; release with [`Sim::page_hash_exit`].
    pub async fn page_hash_enter(&self, cpu: CpuId) -> Option<usize> {
        if !self.page_layer_locks() {
            return None;
        }
        let existing = self.w().page_hash_lock;
        let l = existing.unwrap_or_else(|| {
            let l = self.new_lock();
            self.set_lock_class(l, LockClass::PageHash);
            self.w().page_hash_lock = Some(l);
            l
        });
        self.lock(cpu, l).await;
        Some(l)
    }

    /// Releases what [`Sim::page_hash_enter`] took.
    pub async fn page_hash_exit(&self, cpu: CpuId, held: Option<usize>) {
        if let Some(l) = held {
            self.unlock(cpu, l).await;
        }
    }

    /// True when `cpu` holds sleep lock `id` (either mode).
    pub fn holds_sleep_lock(&self, cpu: CpuId, id: usize) -> bool {
        self.w().sleep_locks[id].holds(cpu)
    }

    /// Acquires sleep lock `id` in writer (`write`) or reader mode,
    /// blocking (not spinning) while it is unavailable.
    pub async fn sleep_lock(&self, cpu: CpuId, id: usize, write: bool) {
        self.check_no_spin_lock(
            cpu,
            "a sleep-lock acquisition (sleeping holding a spin lock)",
        );
        let order = self.lock_enter(cpu, LockRef::Sleep(id));
        let costs = self.costs();
        // The guard spin lock, held while the state is examined.
        self.delay(cpu, Cycles(costs.lock_cycles + costs.unlock_cycles))
            .await;
        let granted = {
            let mut w = self.w();
            let l = &mut w.sleep_locks[id];
            assert!(!l.holds(cpu), "{cpu} relocks sleep lock {id}");
            if l.free_for(write) {
                if write {
                    l.writer = Some(cpu);
                } else {
                    if !l.readers.is_empty() {
                        // Granted beside other readers (counted).
                        w.counters.add("sleeplock.shared_grants", 1);
                    }
                    w.sleep_locks[id].readers.push(cpu);
                }
                true
            } else {
                l.waiters.push_back((cpu, write));
                false
            }
        };
        if !granted {
            self.count("sleeplock.blocked", 1);
            let (since, bound) = {
                let w = self.w();
                let step = w.cfg.costs.spin_iteration_cycles.max(1);
                (w.now(), Cycles(w.cfg.spin_bound.saturating_mul(step)))
            };
            let deadline = since + bound;
            {
                let mut w = self.w();
                let c = &mut w.cpus[cpu.index()];
                assert!(
                    c.lazy_left.is_none(),
                    "{cpu} sleeps with an address space still left from its last sleep"
                );
                c.lock_sleeping = true;
            }
            loop {
                if self.w().sleep_locks[id].holds(cpu) {
                    break;
                }
                if self.now() >= deadline {
                    {
                        let mut w = self.w();
                        let at = w.now();
                        w.liveness.get_or_insert(Liveness {
                            cpu,
                            waiting_for: format!("sleep lock {id}"),
                            since,
                            at,
                        });
                        w.stop = true;
                    }
                    std::future::pending::<()>().await;
                    return;
                }
                // Blocked: woken by the releaser's hand-off, an interrupt
                // or the liveness deadline.
                self.block_until(cpu, deadline).await;
                if self.w().cpus[cpu.index()].takeable().is_some() {
                    self.take_interrupts(cpu).await;
                }
            }
            self.w().cpus[cpu.index()].lock_sleeping = false;
            self.record("sleeplock.wait_cycles", (self.now() - since).0 as f64);
            // Switched back in: an address space left in lazy TLB mode is
            // loaded again (Linux's `switch_mm` reloads CR3 when the CPU
            // had left the mm's `cpu_vm_mask`).
            let left = self.w().cpus[cpu.index()].lazy_left.take();
            if let Some(pmap) = left {
                self.count("sched.lazy_tlb_rejoins", 1);
                let p = self.protocol();
                p.activate(self, cpu, pmap).await;
            }
        }
        // Contended means waited: a reader granted beside other readers
        // found the lock held but did not wait for it.
        let order = order.map(|(class, _, since)| (class, !granted, since));
        self.lock_acquired(cpu, LockRef::Sleep(id), order);
    }

    /// Takes the sleep lock of a page just created (not yet findable
    /// before this instant) as writer, at once: it cannot be held or
    /// waited on, so the acquisition never waits and, like a try-lock, is
    /// exempt from the order (`lockorder`). The caller pays the guard's
    /// cost after ([`Sim::sleep_lock_guard_cost`]). Returns the lock.
    pub fn sleep_lock_new_page(&self, cpu: CpuId, pfn: mmulab_machine::Pfn) -> usize {
        let (_, id) = self.page_locks(pfn.0);
        let order = self.try_lock_enter(cpu, LockRef::Sleep(id));
        {
            let mut w = self.w();
            let l = &mut w.sleep_locks[id];
            assert!(
                l.writer.is_none() && l.readers.is_empty() && l.waiters.is_empty(),
                "the sleep lock of new frame {} is in use",
                pfn.0
            );
            l.writer = Some(cpu);
        }
        self.lock_acquired(cpu, LockRef::Sleep(id), order);
        id
    }

    /// One pass through a sleep lock's guard spin lock.
    pub async fn sleep_lock_guard_cost(&self, cpu: CpuId) {
        let costs = self.costs();
        self.delay(cpu, Cycles(costs.lock_cycles + costs.unlock_cycles))
            .await;
    }

    /// Releases sleep lock `id` and hands it to the head of its queue.
    pub async fn sleep_unlock(&self, cpu: CpuId, id: usize) {
        let costs = self.costs();
        {
            let mut w = self.w();
            let l = &mut w.sleep_locks[id];
            if l.writer == Some(cpu) {
                l.writer = None;
            } else {
                let i =
                    l.readers.iter().position(|&c| c == cpu).unwrap_or_else(|| {
                        panic!("{cpu} releases sleep lock {id} it does not hold")
                    });
                l.readers.swap_remove(i);
            }
            let mut woken = Vec::new();
            if l.writer.is_none() {
                while let Some(&(c, write)) = l.waiters.front() {
                    if write {
                        if l.readers.is_empty() {
                            l.writer = Some(c);
                            l.waiters.pop_front();
                            woken.push(c);
                        }
                        break;
                    }
                    l.readers.push(c);
                    l.waiters.pop_front();
                    woken.push(c);
                }
            }
            let at = w.now() + Cycles(costs.context_switch_cycles);
            for c in woken {
                // A blocked waiter is switched back in; one busy in an
                // interrupt handler sees the grant when it returns.
                let cpu_state = &mut w.cpus[c.index()];
                if cpu_state.idle_waiting {
                    cpu_state.idle_waiting = false;
                    cpu_state.resume_gen += 1;
                    let generation = cpu_state.resume_gen;
                    w.queue.push(at, Event::Resume { cpu: c, generation });
                }
            }
        }
        self.lock_released(cpu, LockRef::Sleep(id));
        self.delay(cpu, Cycles(costs.lock_cycles + costs.unlock_cycles))
            .await;
    }
}
