//! What the protocol tests share: the small simulated machine most of them
//! run on. A test overrides the fields it varies with `..small_config()`.

use mmulab_kernel::{Costs, KernelParams, SimConfig};
use mmulab_machine::{PtFormat, TlbConfig};

/// An i386 machine of `cpus` CPUs: the default TLB, costs and kernel,
/// 50-cycle quanta, 4,096 frames, no disabled windows, no cache hierarchy.
pub fn small_config(cpus: usize, seed: u64) -> SimConfig {
    SimConfig {
        cpus,
        tlb: TlbConfig::default(),
        pt_format: PtFormat::I386,
        costs: Costs::default(),
        quantum_cycles: 50,
        memory_frames: 4096,
        seed,
        spin_bound: 1_000_000,
        max_cycles: 1_000_000_000,
        disabled_windows: None,
        trap_disabled_mean_cycles: 0,
        kernel: KernelParams::default(),
        memory: None,
    }
}
