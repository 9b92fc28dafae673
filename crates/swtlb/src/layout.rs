//! The page-table layout of the simulated systems (uhlig94 §4.1, Fig. 3, fn. 7, §4.2.2,
//! §5): where each task's segments lie in the R2000's user segment (kuseg), where the
//! kernel keeps the structures it touches on every entry and its mapped data (kseg2), and
//! how many L2 and L3 PTEs those addresses need under the linear tables of Fig. 3.
//!
//! Nothing here counts PTEs by hand. A reference's L2 PTE is the page of its task's
//! linear L1 table that holds its L1U PTE (4-byte PTEs, 4 KB pages: one L1 page per 4 MB
//! of a task's space, [`crate::pagetable::l2_of_user`]); its L3 PTE is the page of the L2
//! table holding that L2 PTE ([`crate::pagetable::l3_of_l2`]); a mapped kernel data page's
//! L3 PTE is the L2-table page holding its L1K PTE ([`crate::pagetable::l3_of_l1k`]).
//! [`live_ptes`] applies those functions to every page a set of tasks may touch, so the
//! number of L2 PTEs a system keeps live — and with it where Fig. 5's L2 curve levels off —
//! follows from these addresses:
//!
//! * **User tasks** (the application and, under Mach 3.0, the Unix server, the AFS cache
//!   manager of Mach3+AFSout, and under every system the X server): the MIPS user layout
//!   (Kane and Heinrich 1992, the paper's reference for the R2000; the Ultrix and Mach
//!   linkers' defaults): text at 0x0040_0000, data at 0x1000_0000, the stack growing
//!   down from 0x7fff_ffff. These are three different 4 MB regions, so a task whose
//!   segments stay under 4 MB each needs three L2 PTEs — fn. 7's "one each for a task's
//!   text, data, and stack segments" and §4.2.2's "the Unix server's three L2 PTEs (text
//!   segment, data segment, stack segment)" follow; a segment larger than 4 MB needs more.
//!   Every server runs the same binary layout: the paper says the servers' text and data
//!   are mapped user pages (§4.2.2), not where; [A] they use the linker's default layout
//!   like any Unix program.
//! * **The kernel's per-entry structures**: [A] the kernel stack and the u-area, touched on
//!   every kernel entry, each in its own 4 MB region of the kernel task's mapped space,
//!   as §5 ("Unix kernel (2 PTEs for kernel data)") and fn. 7 ("two L2 PTEs for kernel
//!   data structures") describe them. The paper gives the count for Ultrix's traditional
//!   kernel and for OSF/1; [A] Mach 3.0's kernel is the same (its 8 = 2 + 3 + 3 of
//!   §5.2.1). They are kept as pages of task 0 looked up like user pages (L1U class,
//!   their own L1 pages, hence L2 PTEs); kernel text is unmapped (kseg0) and never reaches
//!   the TLB.
//! * **Mapped kernel data** (L1K, kseg2 from 0xc000_0000): the pool of
//!   `OsParams::kernel_data_pages`, [A] interleaved over two 4 MB regions (allocations from
//!   two kernel maps, e.g. zones and kmem), whose L1K PTEs lie on two pages of the L2 table:
//!   two L3 PTEs under OSF/1 and Mach (Ultrix has no L3).
//!
//! The addresses are unchanged from the constants this module replaced
//! (`workload::LAYOUT`, `os::KSTACK_VPNS`, `os::KERNEL_DATA_BASE`), so the reference
//! streams and every result are too; what changed is that the PTE counts the reproduction
//! reasons with are computed from them.

use std::collections::BTreeSet;

use crate::pagetable::{Key, TaskId, l2_of_user, l3_of_l1k, l3_of_l2};

/// The R2000's fixed page: 4 KB (§4.1).
pub const PAGE_SHIFT: u32 = 12;

/// The virtual page number of byte address `va`.
pub const fn vpn(va: u64) -> u64 {
    va >> PAGE_SHIFT
}

/// A user task's address-space layout in pages: text and data grow up from their bases,
/// the stack down from `stack_top`.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub text_base: u64,
    pub data_base: u64,
    pub stack_top: u64,
}

/// The MIPS user layout every simulated task uses: text at 0x0040_0000, data at
/// 0x1000_0000, the stack's top page just below 0x8000_0000 (the end of kuseg).
pub const LAYOUT: Layout = Layout {
    text_base: vpn(0x0040_0000),
    data_base: vpn(0x1000_0000),
    stack_top: vpn(0x7fff_ffff),
};

/// Start of kseg2, the R2000's mapped kernel segment, where mapped kernel data lies.
pub const KSEG2_VPN: u64 = vpn(0xc000_0000);

/// The kernel stack and the u-area in the kernel task's space (task 0), one per 4 MB
/// region (fn. 7's two kernel L2 PTEs; see the module comment for the [A]).
pub const KERNEL_ENTRY_VPNS: [u64; 2] = [vpn(0x0100_0000), vpn(0x0200_0000)];

/// The kseg2 page of the `idx`-th page of the mapped kernel data pool: even pages in the
/// first 4 MB region, odd ones in the next ([A] two kernel maps).
pub const fn kernel_data_vpn(idx: u64) -> u64 {
    KSEG2_VPN + (idx & 1) * 1024 + idx / 2
}

/// The pages one task may touch: `text` pages from the text base, `data` from the data
/// base, `stack` below the stack top.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskSpan {
    pub task: TaskId,
    pub text: u64,
    pub data: u64,
    pub stack: u64,
}

impl TaskSpan {
    /// Every virtual page of the span.
    pub fn vpns(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.text)
            .map(|i| LAYOUT.text_base + i)
            .chain((0..self.data).map(|i| LAYOUT.data_base + i))
            .chain((0..self.stack).map(|i| LAYOUT.stack_top - i))
    }
}

/// The L2 and L3 PTEs the pages of `tasks`, the kernel's per-entry structures and the
/// first `kernel_data_pages` pages of mapped kernel data need: distinct keys found by
/// the same functions the miss handler uses. L3 PTEs are counted only for a three-level
/// system (Ultrix's L2 table is unmapped).
pub fn live_ptes(tasks: &[TaskSpan], kernel_data_pages: u64, three_level: bool) -> (usize, usize) {
    let mut l2: BTreeSet<Key> = BTreeSet::new();
    for v in KERNEL_ENTRY_VPNS {
        l2.insert(l2_of_user(0, v));
    }
    for t in tasks {
        for v in t.vpns() {
            l2.insert(l2_of_user(t.task, v));
        }
    }
    if !three_level {
        return (l2.len(), 0);
    }
    let mut l3: BTreeSet<Key> = l2.iter().map(|k| l3_of_l2(*k)).collect();
    for i in 0..kernel_data_pages {
        l3.insert(l3_of_l1k(kernel_data_vpn(i)));
    }
    (l2.len(), l3.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(task: TaskId, text: u64, data: u64) -> TaskSpan {
        TaskSpan {
            task,
            text,
            data,
            stack: 2,
        }
    }

    #[test]
    fn a_task_needs_one_l2_pte_per_4mb_region_it_touches() {
        // The kernel's two, then three per task whose segments fit in 4 MB each.
        assert_eq!(live_ptes(&[], 0, false).0, 2);
        assert_eq!(live_ptes(&[span(1, 24, 200)], 0, false).0, 5);
        assert_eq!(
            live_ptes(&[span(1, 24, 200), span(2, 24, 48)], 0, false).0,
            8
        );
        // A data segment crossing a 4 MB boundary needs a fourth.
        assert_eq!(live_ptes(&[span(1, 24, 1025)], 0, false).0, 6);
        // Two tasks' segments never share L2 PTEs (each has its own L1 table).
        assert_eq!(live_ptes(&[span(1, 1, 1), span(3, 1, 1)], 0, false).0, 8);
    }

    #[test]
    fn l3_ptes_follow_the_l2_table_pages() {
        // One L2-table page per task (a task's L2 PTEs lie in one page), the kernel task's,
        // and two for the two regions of mapped kernel data.
        let (l2, l3) = live_ptes(&[span(1, 24, 200), span(2, 24, 48)], 120, true);
        assert_eq!((l2, l3), (8, 1 + 1 + 1 + 2));
        // Ultrix: no L3.
        assert_eq!(live_ptes(&[span(1, 24, 200)], 120, false).1, 0);
    }

    #[test]
    fn addresses_are_the_mips_segments() {
        assert_eq!(LAYOUT.text_base, 0x400);
        assert_eq!(LAYOUT.data_base, 0x10000);
        assert_eq!(LAYOUT.stack_top, 0x7ffff);
        assert_eq!(kernel_data_vpn(0), 0xc0000);
        assert_eq!(kernel_data_vpn(3), 0xc0000 + 1024 + 1);
    }
}
