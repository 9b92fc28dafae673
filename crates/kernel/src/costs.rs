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

/// The slowest and fastest clocks a spec may give (`costs.clock_hz`): from
/// 1 kHz, below any processor these papers model, to 100 GHz, above any
/// built. Outside them a cycle count no longer prints as a sensible time
/// (1e-300 Hz printed "simulated inf µs").
pub const CLOCK_HZ_RANGE: std::ops::RangeInclusive<f64> = 1e3..=1e11;

impl Costs {
    /// Checks what the types cannot; the error names its key
    /// (`{prefix}.ref_cycles`). A cost longer than the run's time limit
    /// (`max_cycles`) could never be paid, and costs the simulator loops
    /// on (a spin iteration, an idle poll; a reference on flat memory)
    /// must take time, or a loop over them never reaches the next event.
    /// `flat`: no cache hierarchy, whose latencies would time references.
    pub fn validate(&self, prefix: &str, max_cycles: u64, flat: bool) -> Result<(), String> {
        if !CLOCK_HZ_RANGE.contains(&self.clock_hz) {
            return Err(format!(
                "{prefix}.clock_hz: must be from {:e} to {:e} Hz, got {:e}",
                CLOCK_HZ_RANGE.start(),
                CLOCK_HZ_RANGE.end(),
                self.clock_hz
            ));
        }
        for (key, v) in [
            ("ref_cycles", if flat { self.ref_cycles } else { 1 }),
            ("spin_iteration_cycles", self.spin_iteration_cycles),
            ("idle_poll_cycles", self.idle_poll_cycles),
        ] {
            if v == 0 {
                return Err(format!(
                    "{prefix}.{key}: must be at least 1 (a loop over a zero-cycle step never advances time)"
                ));
            }
        }
        for (key, v) in self.cycle_costs() {
            if v > max_cycles {
                return Err(format!(
                    "{prefix}.{key}: {v} cycles is longer than the run's time limit (engine.max_cycles = {max_cycles})"
                ));
            }
        }
        Ok(())
    }

    /// Every integer field, by key (the test below holds it to the struct).
    pub fn cycle_costs(&self) -> [(&'static str, u64); 30] {
        [
            ("ref_cycles", self.ref_cycles),
            ("mem_cycles", self.mem_cycles),
            ("walk_level_cycles", self.walk_level_cycles),
            ("tlb_flush_entry_cycles", self.tlb_flush_entry_cycles),
            ("tlb_flush_all_cycles", self.tlb_flush_all_cycles),
            ("pte_write_cycles", self.pte_write_cycles),
            ("trap_cycles", self.trap_cycles),
            ("fault_cycles", self.fault_cycles),
            ("zero_fill_cycles", self.zero_fill_cycles),
            ("copy_page_cycles", self.copy_page_cycles),
            ("syscall_cycles", self.syscall_cycles),
            ("context_switch_cycles", self.context_switch_cycles),
            ("ipi_send_cycles", self.ipi_send_cycles),
            ("ipi_latency_cycles", self.ipi_latency_cycles),
            ("ipi_dispatch_cycles", self.ipi_dispatch_cycles),
            ("ipi_return_cycles", self.ipi_return_cycles),
            ("lock_cycles", self.lock_cycles),
            ("unlock_cycles", self.unlock_cycles),
            ("spin_iteration_cycles", self.spin_iteration_cycles),
            ("spl_cycles", self.spl_cycles),
            ("action_queue_cycles", self.action_queue_cycles),
            ("action_process_cycles", self.action_process_cycles),
            ("lazy_check_cycles", self.lazy_check_cycles),
            ("idle_poll_cycles", self.idle_poll_cycles),
            ("bus_contention_cycles", self.bus_contention_cycles),
            // Not cycles, but a count of bus users: bounded the same way
            // so that no product with it overflows.
            ("bus_free_users", self.bus_free_users),
            ("ipi_jitter_cycles", self.ipi_jitter_cycles),
            ("hat_cookie_cycles", self.hat_cookie_cycles),
            ("tlb_refill_trap_cycles", self.tlb_refill_trap_cycles),
            ("pmap_change_page_cycles", self.pmap_change_page_cycles),
        ]
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `cycle_costs` lists every integer field, so `validate` bounds a
    /// cost added later too.
    #[test]
    fn cycle_costs_lists_every_integer_field() {
        let json = serde_json::to_value(Costs::default()).unwrap();
        let mut fields: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .filter(|k| *k != "clock_hz")
            .collect();
        let mut listed: Vec<&str> = Costs::default()
            .cycle_costs()
            .iter()
            .map(|(k, _)| *k)
            .collect();
        fields.sort();
        listed.sort();
        assert_eq!(fields, listed);
    }

    #[test]
    fn nonsense_costs_are_refused_by_key() {
        let max = 20_000_000_000;
        let ok = Costs::default();
        assert_eq!(ok.validate("costs", max, true), Ok(()));
        let e = Costs {
            ipi_latency_cycles: i64::MAX as u64,
            ..ok.clone()
        }
        .validate("costs", max, true)
        .unwrap_err();
        assert!(e.starts_with("costs.ipi_latency_cycles:"), "{e}");
        let e = Costs {
            clock_hz: 1e-300,
            ..ok.clone()
        }
        .validate("costs", max, true)
        .unwrap_err();
        assert!(e.starts_with("costs.clock_hz:"), "{e}");
        let e = Costs {
            ref_cycles: 0,
            ..ok
        }
        .validate("costs", max, true)
        .unwrap_err();
        assert!(e.starts_with("costs.ref_cycles:"), "{e}");
    }
}
