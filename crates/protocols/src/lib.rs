//! The protocols layer of DESIGN.md: one module per mechanism, each an
//! implementation of [`mmulab_kernel::Protocol`]. Deliberately broken
//! variants (negative controls) are registered beside the real ones so that
//! `mmulab check` and the tests can show the oracle catching them.

pub mod global;
pub mod linux;
pub mod mach;
pub mod none;
pub mod svr42;
pub mod unitd;

use std::rc::Rc;

use mmulab_kernel::Protocol;

/// A registered protocol: its name, what it is, and whether it is a
/// negative control (expected to be caught by the oracle).
pub struct Entry {
    pub name: &'static str,
    pub about: &'static str,
    pub negative_control: bool,
    pub make: fn(&ProtocolOptions) -> Rc<dyn Protocol>,
}

/// Options protocols read from the spec's `[protocol_options]`.
#[derive(Clone, Debug)]
pub struct ProtocolOptions {
    /// black89 §4: no shootdown for pages not mapped in the pmap.
    pub lazy: bool,
    /// Pages above which a responder flushes its whole TLB instead of
    /// invalidating entries one by one (black89 §4 detail 1).
    pub flush_threshold: u64,
    /// Size of each CPU's action queue (black89 §4 detail 2).
    pub action_queue: usize,
    /// balan92 §Other Architectures: the MMU can flush single TLB entries;
    /// svr42's immediate shootdowns then invalidate the range (up to
    /// `flush_threshold` pages) instead of flushing whole TLBs.
    pub single_entry_flush: bool,
    /// svr42 on i386 tables: immediate shootdowns of at least this many
    /// pages use the L1 trick (balan92 §Immediate Shutdown Algorithm); 0
    /// turns it off.
    pub l1_trick_pages: u64,
    /// svr42: range operations look PTEs up through mapping chunks (one
    /// per 32 PTEs, present only while one of them is valid) and skip
    /// spans without one (balan92 §Background); false scans every PTE of
    /// the range's page tables.
    pub mapping_chunks: bool,
    /// svr42: an immediate shootdown takes the global shootdown lock even
    /// when no other CPU uses the address space (balan92's step 1, the
    /// default); false skips the lock (and the interrupts) then, under the
    /// as's HAT lock, which keeps any CPU from joining (an ablation).
    pub shoot_lock_when_alone: bool,
    /// svr42: fork write-protects the parent one mapping chunk (32 PTEs)
    /// at a time, dropping the HAT lock after each (balan92 §Analysis:
    /// "Reducing the lock hold time on the HAT resource lock by dropping
    /// the HAT lock after copying each mapping chunk ... is being
    /// considered"); false (the default): one hold per segment.
    pub fork_chunk_unlock: bool,
    /// svr42: one HAT spin lock per level-2 page table instead of one per
    /// address space (balan92 §Locking Design: "Making the HAT lock finer
    /// grained by moving it to the page table level was considered");
    /// the address space's own lock then guards only its CPU set and its
    /// level-1 directory. False (the default): the paper's one per as.
    pub hat_lock_per_pt: bool,
    /// mach: the level of the shootdown interrupt (black89 §4's fourth
    /// complication and §9's first hardware feature).
    pub shootdown_level: ShootdownLevel,
    /// mach: how the initiator sends its shootdown interrupts (Fig. 1's
    /// loop, or black89 §9's multicast or broadcast interrupt).
    pub interrupt_send: InterruptSend,
    /// mach: TLBs that other processors can invalidate (black89 §9): the
    /// initiator changes the pmap and shoots the entries directly out of
    /// the other TLBs, with no interrupt and no responder.
    pub remote_invalidate: bool,
}

/// How the mach initiator sends its shootdown interrupts (black89 §9,
/// "Hardware support for multicast interrupts would also help").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterruptSend {
    /// Fig. 1: one interrupt per responder, sent in a loop, each paying
    /// the send.
    Each,
    /// §9: "This list can easily be maintained as a bit vector which is
    /// then loaded into the hardware to cause the interrupts. This
    /// replaces a for loop in the initiator's code with a small number of
    /// instructions." One send reaches every responder; [A] it costs what
    /// one send of the loop costs (`costs.ipi_send_cycles`).
    Multicast,
    /// §9: "Even a simple interrupt that is broadcast to all other
    /// processors would be helpful; beyond some number of processors it is
    /// faster to use a broadcast interrupt (and interrupt too many
    /// processors) than it is to iterate down the list." One send (costed
    /// as `Multicast`'s) reaches every other online processor: idle ones
    /// and ones not using the pmap take the interrupt and find nothing to
    /// do (or, if idle with actions queued, process them).
    Broadcast,
}

impl InterruptSend {
    /// The spec's names, in the order `parse` accepts them.
    pub const NAMES: [&'static str; 3] = ["each", "multicast", "broadcast"];

    pub fn parse(s: &str) -> Option<InterruptSend> {
        match s {
            "each" => Some(InterruptSend::Each),
            "multicast" => Some(InterruptSend::Multicast),
            "broadcast" => Some(InterruptSend::Broadcast),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            InterruptSend::Each => "each",
            InterruptSend::Multicast => "multicast",
            InterruptSend::Broadcast => "broadcast",
        }
    }
}

/// Where the mach shootdown interrupt sits among the interrupt levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShootdownLevel {
    /// The measured kernel's (black89 §8-9): with the device interrupts, so
    /// every section that masks device interrupts (`Ipl::HIGH`, splhigh)
    /// holds it off: "the kernel disables shootdown (and other) interrupts
    /// in many places".
    Device,
    /// §9's recommendation: "A software interrupt with priority above that
    /// of device interrupts would allow us to disable device interrupts
    /// without blocking shootdowns". Only code that masks every interrupt
    /// (`Ipl::ALL`: the shootdown code itself and the pmap-lock holders,
    /// "places where critical locks are held") holds it off.
    AboveDevice,
}

impl ShootdownLevel {
    /// The spec's names, in the order `parse` accepts them.
    pub const NAMES: [&'static str; 2] = ["device", "above-device"];

    pub fn parse(s: &str) -> Option<ShootdownLevel> {
        match s {
            "device" => Some(ShootdownLevel::Device),
            "above-device" => Some(ShootdownLevel::AboveDevice),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ShootdownLevel::Device => "device",
            ShootdownLevel::AboveDevice => "above-device",
        }
    }

    /// The interrupt level: an interrupt of level L is taken where the
    /// CPU's level is below L, so `HIGH` is masked by splhigh and `ALL`
    /// only by code that masks everything.
    pub fn ipl(self) -> mmulab_kernel::Ipl {
        match self {
            ShootdownLevel::Device => mmulab_kernel::Ipl::HIGH,
            ShootdownLevel::AboveDevice => mmulab_kernel::Ipl::ALL,
        }
    }
}

impl Default for ProtocolOptions {
    fn default() -> Self {
        ProtocolOptions {
            lazy: true,
            flush_threshold: 8,
            action_queue: 4,
            single_entry_flush: false,
            l1_trick_pages: 64,
            mapping_chunks: true,
            shoot_lock_when_alone: true,
            fork_chunk_unlock: false,
            hat_lock_per_pt: false,
            // Above the devices, as mach ran here before the option
            // existed (unchanged runs); the encore-multimax-1989 preset
            // sets the measured kernel's `device`.
            shootdown_level: ShootdownLevel::AboveDevice,
            // Fig. 1's loop, as mach ran before the option existed.
            interrupt_send: InterruptSend::Each,
            remote_invalidate: false,
        }
    }
}

pub const REGISTRY: &[Entry] = &[
    Entry {
        name: "none",
        about: "never shoots down remote TLBs (negative control: the oracle must catch it)",
        negative_control: true,
        make: |_| Rc::new(none::NoShootdown),
    },
    Entry {
        name: "global",
        about: "simple and slow: stop every other CPU, change the table, flush every TLB",
        negative_control: false,
        make: |o| Rc::new(global::Global::new(o, global::Mutation::None)),
    },
    Entry {
        name: "global-initiator-only",
        about: "broken global: only the initiator flushes (negative control)",
        negative_control: true,
        make: |o| Rc::new(global::Global::new(o, global::Mutation::InitiatorOnly)),
    },
    Entry {
        name: "mach",
        about: "black89's Mach shootdown algorithm (Fig. 1, every refinement)",
        negative_control: false,
        make: |o| Rc::new(mach::Mach::new(o, mach::Mutation::None)),
    },
    Entry {
        name: "mach-no-wait",
        about: "broken mach: the initiator does not wait for responders (negative control)",
        negative_control: true,
        make: |o| Rc::new(mach::Mach::new(o, mach::Mutation::NoWait)),
    },
    Entry {
        name: "mach-flush-before-unlock",
        about: "broken mach: responders flush before the pmap is unlocked (negative control)",
        negative_control: true,
        make: |o| Rc::new(mach::Mach::new(o, mach::Mutation::FlushBeforeUnlock)),
    },
    Entry {
        name: "svr42",
        about: "balan92's SVR4.2 MP HAT: lazy cookie-based kernel shootdowns, immediate user shootdowns",
        negative_control: false,
        make: |o| Rc::new(svr42::Svr42::new(o, svr42::Mutation::None)),
    },
    Entry {
        name: "svr42-no-cookie-check",
        about: "broken svr42: hat_shutdown always returns early (negative control)",
        negative_control: true,
        make: |o| Rc::new(svr42::Svr42::new(o, svr42::Mutation::NoCookieCheck)),
    },
    Entry {
        name: "svr42-nonstrict-tick",
        about: "broken svr42: a flush in the free's tick counts as newer (negative control)",
        negative_control: true,
        make: |o| Rc::new(svr42::Svr42::new(o, svr42::Mutation::NonStrictTick)),
    },
    Entry {
        name: "svr42-no-spin",
        about: "broken svr42: immediate responders flush without waiting on the counter (negative control)",
        negative_control: true,
        make: |o| Rc::new(svr42::Svr42::new(o, svr42::Mutation::NoSpin)),
    },
    Entry {
        name: "svr42-segmap-no-shutdown",
        about: "broken svr42 segmap: a chunk reused for other pages skips hat_shutdown (negative control)",
        negative_control: true,
        make: |o| Rc::new(svr42::Svr42::new(o, svr42::Mutation::SegmapNoShutdown)),
    },
    Entry {
        name: "svr42-pageout-no-seize",
        about: "broken svr42 pageout: local aging clears R/M without seizing the process (negative control)",
        negative_control: true,
        make: |o| Rc::new(svr42::Svr42::new(o, svr42::Mutation::PageoutNoSeize)),
    },
    Entry {
        name: "svr42-pageunload-blocking",
        about: "broken svr42 hat_pageunload: blocks on each HAT lock while holding the page spin lock (lock-order inversion; negative control)",
        negative_control: true,
        make: |o| Rc::new(svr42::Svr42::new(o, svr42::Mutation::PageunloadBlocking)),
    },
    Entry {
        name: "linux",
        about: "romanescu10's baseline: Linux 2.6.15 i386 TLB shootdown (Fig. 1; full flushes except COW)",
        negative_control: false,
        make: |_| Rc::new(linux::Linux::new()),
    },
    Entry {
        name: "linux-lazy-skips-flush",
        about: "broken linux: a CPU in lazy TLB mode acknowledges a shootdown without leave_mm (negative control)",
        negative_control: true,
        make: |_| Rc::new(linux::Linux::lazy_skips_flush()),
    },
    Entry {
        name: "unitd",
        about: "romanescu10's UNITD: PCAMs join MOSI, PTE stores invalidate TLBs; no IPIs (needs [memory])",
        negative_control: false,
        make: |_| Rc::new(unitd::Unitd::new(unitd::Variant::Unitd)),
    },
    Entry {
        name: "ideal",
        about: "romanescu10 §6.3: free check of every TLB hit against its PTE; stale entries re-walked",
        negative_control: false,
        make: |_| Rc::new(unitd::Unitd::new(unitd::Variant::Ideal)),
    },
    Entry {
        name: "unitd-no-pcam",
        about: "broken unitd: PCAMs never match (negative control)",
        negative_control: true,
        make: |_| Rc::new(unitd::Unitd::new(unitd::Variant::NoPcam)),
    },
    Entry {
        name: "unitd-snoop-skips-pcam",
        about: "broken unitd: remote ownership requests skip the PCAMs (negative control)",
        negative_control: true,
        make: |_| Rc::new(unitd::Unitd::new(unitd::Variant::SnoopSkipsPcam)),
    },
    Entry {
        name: "unitd-no-self-snoop",
        about: "broken unitd: local stores do not probe the local PCAM (§5.2; negative control)",
        negative_control: true,
        make: |_| Rc::new(unitd::Unitd::new(unitd::Variant::NoSelfSnoop)),
    },
    Entry {
        name: "unitd-directory-forgets-tlb",
        about: "broken unitd: writebacks drop the keep-sharer bit (§5.3.1; negative control)",
        negative_control: true,
        make: |_| {
            Rc::new(unitd::Unitd::new(
                unitd::Variant::DirectoryForgetsTlbSharers,
            ))
        },
    },
    Entry {
        name: "unitd-jetty-misses-insert",
        about: "broken unitd: the Jetty filter misses PCAM inserts (§5.4; negative control)",
        negative_control: true,
        make: |_| Rc::new(unitd::Unitd::new(unitd::Variant::JettyMissesInsert)),
    },
    Entry {
        name: "unitd-ack-before-invalidate",
        about: "broken cache controller: acks an invalidation before invalidating (the MOSI checker's negative control)",
        negative_control: true,
        make: |_| Rc::new(unitd::Unitd::new(unitd::Variant::AckBeforeInvalidate)),
    },
    Entry {
        name: "unitd-upper-level-only",
        about: "broken unitd: unmapping a page-table page clears only its upper-level entry (§4.1; negative control)",
        negative_control: true,
        make: |_| Rc::new(unitd::Unitd::new(unitd::Variant::UpperLevelOnly)),
    },
    Entry {
        name: "unitd-no-replay",
        about: "broken unitd core: an access whose translation dies during its miss performs instead of replaying (§5.1; negative control)",
        negative_control: true,
        make: |_| Rc::new(unitd::Unitd::new(unitd::Variant::NoReplay)),
    },
    Entry {
        name: "unitd-swtlb-no-pte-address",
        about: "broken unitd software TLB miss handler: never supplies the PTE's address to the PCAM (§4.1; negative control)",
        negative_control: true,
        make: |_| Rc::new(unitd::Unitd::new(unitd::Variant::SwtlbNoPteAddress)),
    },
];

pub fn find(name: &str) -> Option<&'static Entry> {
    REGISTRY.iter().find(|e| e.name == name)
}

pub fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|e| e.name).collect()
}
