//! Every cost the model charges, in cycles. Costs are inputs: a preset
//! (experiment crate) fills them in and says where each comes from. Results
//! such as a shootdown's latency emerge from them.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Costs {
    /// Clock rate of the simulated processor (Hz), to print µs.
    pub clock_hz: f64,
    /// A user-mode memory reference that hits in the TLB (incl. the
    /// instruction issuing it).
    pub ref_cycles: u64,
    /// Flat memory latency of one page-table entry read by the walker.
    pub mem_cycles: u64,
    /// Walker overhead per level on top of the memory read.
    pub walk_level_cycles: u64,
    /// Invalidate one TLB entry.
    pub tlb_flush_entry_cycles: u64,
    /// Flush the whole TLB.
    pub tlb_flush_all_cycles: u64,
    /// Write one PTE (including the interlocked R/M update).
    pub pte_write_cycles: u64,
    /// A pmap module's bookkeeping per page it changes, beyond the PTE
    /// write: the physical page's mapping list (find and unlink its entry),
    /// harvesting the modify and reference bits. Charged in black89's
    /// Phase 3 ("make changes to physical map"), while the responders spin.
    pub pmap_change_page_cycles: u64,
    /// Enter and leave the kernel (trap or system call).
    pub trap_cycles: u64,
    /// Page-fault handling beyond the trap (lookup, bookkeeping).
    pub fault_cycles: u64,
    /// Zero-fill a page.
    pub zero_fill_cycles: u64,
    /// Copy a page (copy-on-write break).
    pub copy_page_cycles: u64,
    /// VM-layer work of one mmap/munmap/mprotect call beyond the trap.
    pub syscall_cycles: u64,
    /// Switch threads (save/restore, scheduler), excluding TLB effects.
    pub context_switch_cycles: u64,
    /// Sender's cost to post one interprocessor interrupt.
    pub ipi_send_cycles: u64,
    /// Delivery latency of an interprocessor interrupt.
    pub ipi_latency_cycles: u64,
    /// Target's cost to take an interrupt (save state, dispatch).
    pub ipi_dispatch_cycles: u64,
    /// Target's cost to return from an interrupt.
    pub ipi_return_cycles: u64,
    /// Acquire an uncontended spin lock.
    pub lock_cycles: u64,
    /// Release a spin lock.
    pub unlock_cycles: u64,
    /// One iteration of a spin loop (a read of shared state).
    pub spin_iteration_cycles: u64,
    /// Raise or lower the interrupt priority level.
    pub spl_cycles: u64,
    /// Queue one consistency action for another CPU (lock its action
    /// structure, queue, set flag, unlock).
    pub action_queue_cycles: u64,
    /// Process one queued consistency action (excluding the flush).
    pub action_process_cycles: u64,
    /// Check whether any page of a range is mapped (lazy evaluation).
    pub lazy_check_cycles: u64,
    /// Idle loop poll period.
    pub idle_poll_cycles: u64,
    /// Extra cost per bus transaction per other active bus user beyond a
    /// threshold (shared-bus contention model; 0 disables it).
    pub bus_contention_cycles: u64,
    /// Number of concurrent bus users the bus absorbs without slowdown.
    pub bus_free_users: u64,
    /// Extra delivery latency of one interprocessor interrupt, drawn
    /// uniformly from 0 to this value per target (interrupt fan-out
    /// variance; balan92 §Shutdown Measurements gives it as the reason
    /// Fig. 1 is not linear). 0 draws nothing.
    pub ipi_jitter_cycles: u64,
    /// Read, compare or store one per-CPU TLB cookie or the global
    /// least-recently-flushed cookie (balan92 §Lazy Shutdown Algorithm).
    pub hat_cookie_cycles: u64,
    /// A software-refilled TLB (`machine.tlb.refill = "software"`): the
    /// miss handler's trap and instructions, beyond its page-table loads
    /// (charged like the walker's). Default 16: uhlig94 Table III's Ultrix
    /// L1U handler.
    pub tlb_refill_trap_cycles: u64,
}

impl Default for Costs {
    /// Generic modern-ish defaults (1 GHz); presets override them.
    fn default() -> Self {
        Costs {
            clock_hz: 1e9,
            ref_cycles: 1,
            mem_cycles: 100,
            walk_level_cycles: 2,
            tlb_flush_entry_cycles: 10,
            tlb_flush_all_cycles: 40,
            pte_write_cycles: 5,
            pmap_change_page_cycles: 0,
            trap_cycles: 200,
            fault_cycles: 500,
            zero_fill_cycles: 1000,
            copy_page_cycles: 1500,
            syscall_cycles: 300,
            context_switch_cycles: 1000,
            ipi_send_cycles: 100,
            ipi_latency_cycles: 500,
            ipi_dispatch_cycles: 300,
            ipi_return_cycles: 100,
            lock_cycles: 20,
            unlock_cycles: 10,
            spin_iteration_cycles: 10,
            spl_cycles: 5,
            action_queue_cycles: 50,
            action_process_cycles: 30,
            lazy_check_cycles: 2,
            idle_poll_cycles: 1000,
            bus_contention_cycles: 0,
            bus_free_users: 12,
            ipi_jitter_cycles: 0,
            hat_cookie_cycles: 5,
            tlb_refill_trap_cycles: 16,
        }
    }
}
