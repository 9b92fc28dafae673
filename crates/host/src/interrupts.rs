//! The `TLB` line of /proc/interrupts: how many TLB-shootdown IPIs each CPU
//! has taken since boot (x86: `TLB: … TLB shootdowns`). Read before and
//! after each operation; the difference is what the operation caused.
//!
//! Not every kernel has the line: arm64 invalidates by broadcast `TLBI`
//! instructions and takes no shootdown IPI at all, and an x86 kernel that
//! flushes with INVLPGB or a paravirtual hypercall may count few or none.
//! The parse is a pure function on the file's text so that it is tested on
//! captured samples.

use serde::{Deserialize, Serialize};

/// Per-CPU TLB-shootdown counts, in the column order of the file. `cpus`
/// holds the CPU numbers of the header (offline CPUs have no column).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlbCounts {
    pub cpus: Vec<usize>,
    pub counts: Vec<u64>,
}

impl TlbCounts {
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `self - earlier`, CPU by CPU (matched by CPU number; a CPU missing
    /// from `earlier` counts from zero). Counters only grow, so a negative
    /// difference (a CPU that went offline and came back) is clamped to 0.
    pub fn since(&self, earlier: &TlbCounts) -> TlbCounts {
        let counts = self
            .cpus
            .iter()
            .zip(&self.counts)
            .map(|(cpu, now)| {
                let before = earlier
                    .cpus
                    .iter()
                    .position(|c| c == cpu)
                    .map_or(0, |i| earlier.counts[i]);
                now.saturating_sub(before)
            })
            .collect();
        TlbCounts {
            cpus: self.cpus.clone(),
            counts,
        }
    }

    /// Adds `other` into `self`, CPU by CPU.
    pub fn accumulate(&mut self, other: &TlbCounts) {
        for (cpu, n) in other.cpus.iter().zip(&other.counts) {
            match self.cpus.iter().position(|c| c == cpu) {
                Some(i) => self.counts[i] += n,
                None => {
                    self.cpus.push(*cpu);
                    self.counts.push(*n);
                }
            }
        }
    }
}

/// Why there is no TLB column; shown to the user as is.
pub const NO_TLB_LINE: &str = "/proc/interrupts has no `TLB` line on this kernel (arm64 and some others flush by broadcast instructions and take no shootdown IPIs; others do not count them): running without the TLB-interrupt column";

/// Parses the text of /proc/interrupts. `None` when there is no `TLB:` line
/// or the header has no CPU columns.
pub fn parse_tlb_line(text: &str) -> Option<TlbCounts> {
    let mut lines = text.lines();
    let header = lines.next()?;
    let cpus: Vec<usize> = header
        .split_whitespace()
        .filter_map(|t| t.strip_prefix("CPU")?.parse().ok())
        .collect();
    if cpus.is_empty() {
        return None;
    }
    let line = lines.find(|l| l.trim_start().starts_with("TLB:"))?;
    let rest = line.trim_start().strip_prefix("TLB:")?;
    let counts: Vec<u64> = rest
        .split_whitespace()
        .take(cpus.len())
        .map(|t| t.parse::<u64>())
        .collect::<Result<_, _>>()
        .ok()?;
    if counts.len() != cpus.len() {
        return None;
    }
    Some(TlbCounts { cpus, counts })
}

/// Reads and parses /proc/interrupts. `Ok(None)`: readable, but no TLB line.
#[cfg(target_os = "linux")]
pub fn read_tlb_counts() -> std::io::Result<Option<TlbCounts>> {
    Ok(parse_tlb_line(&std::fs::read_to_string(
        "/proc/interrupts",
    )?))
}

#[cfg(test)]
pub(crate) mod samples {
    /// A 2-vCPU KVM guest (this project's CI machine), Linux 6.18.
    pub const KVM_2CPU: &str = "           CPU0       CPU1       
 24:          1          0  IO-APIC   5-edge      ACPI:Ged
 26:          0         17  IO-APIC   4-edge      ttyS0
 36:          0      35208 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
NMI:          0          0   Non-maskable interrupts
LOC:      22996      25777   Local timer interrupts
SPU:          0          0   Spurious interrupts
RES:       5836       4885   Rescheduling interrupts
CAL:      37920      29782   Function call interrupts
TLB:      10133      11067   TLB shootdowns
TRM:          0          0   Thermal event interrupts
HYP:         28         94   Hypervisor callback interrupts
ERR:          0
MIS:          0
PIN:          0          0   Posted-interrupt notification event
";

    /// A 4-core laptop (Intel), Linux 6.8: wide counts, MSI lines with names.
    pub const LAPTOP_4CPU: &str = "            CPU0       CPU1       CPU2       CPU3       
   0:         11          0          0          0  IR-IO-APIC    2-edge      timer
   8:          0          0          0          0  IR-IO-APIC    8-edge      rtc0
   9:          0      12034          0          0  IR-IO-APIC    9-fasteoi   acpi
 120:          0          0          0          0  DMAR-MSI    0-edge      dmar0
 126:    1829334          0          0     204711  IR-PCI-MSI-0000:00:14.0    0-edge      xhci_hcd
 NMI:        171        158        160        165   Non-maskable interrupts
 LOC:   52894830   48012377   51209950   47299871   Local timer interrupts
 SPU:          0          0          0          0   Spurious interrupts
 PMI:        171        158        160        165   Performance monitoring interrupts
 IWI:     402113     210978     398107     199877   IRQ work interrupts
 RTR:          0          0          0          0   APIC ICR read retries
 RES:    9182736    8277311    8834122    8101938   Rescheduling interrupts
 CAL:    4112873    4390021    4201987    4322991   Function call interrupts
 TLB:    1203947    1187622    1219013    1190448   TLB shootdowns
 TRM:          0          0          0          0   Thermal event interrupts
 THR:          0          0          0          0   Threshold APIC interrupts
 DFR:          0          0          0          0   Deferred Error APIC interrupts
 MCE:          0          0          0          0   Machine check exceptions
 MCP:       1071       1070       1070       1070   Machine check polls
 ERR:          0
 MIS:          0
";

    /// An 8-CPU server with CPU2 offline: the header skips it.
    pub const SERVER_7_OF_8: &str = "            CPU0       CPU1       CPU3       CPU4       CPU5       CPU6       CPU7       
  0:         36          0          0          0          0          0          0   IO-APIC   2-edge      timer
 NMI:          5          4          4          4          4          4          4   Non-maskable interrupts
 LOC:    1000000     999999     999998     999997     999996     999995     999994   Local timer interrupts
 CAL:       2000       2001       2002       2003       2004       2005       2006   Function call interrupts
 TLB:        700        701        703        704        705        706        707   TLB shootdowns
 ERR:          0
";

    /// arm64 (a Raspberry Pi class board): IPI lines, no `TLB` line.
    pub const ARM64_4CPU: &str = "           CPU0       CPU1       CPU2       CPU3       
 11:     204981     175540     203310     170116     GICv2  30 Level     arch_timer
 14:          0          0          0          0     GICv2  65 Level     fe00b880.mailbox
IPI0:      23011      30122      28190      31902       Rescheduling interrupts
IPI1:       8102       9917       9033       9511       Function call interrupts
IPI2:          0          0          0          0       CPU stop interrupts
IPI3:          0          0          0          0       CPU stop (for crash dump) interrupts
IPI4:          0          0          0          0       Timer broadcast interrupts
IPI5:       1021        950       1100        987       IRQ work interrupts
IPI6:          0          0          0          0       CPU wake-up interrupts
Err:          0
";
}

#[cfg(test)]
mod tests {
    use super::samples::*;
    use super::*;

    #[test]
    fn two_cpu_kvm_guest() {
        let t = parse_tlb_line(KVM_2CPU).unwrap();
        assert_eq!(t.cpus, vec![0, 1]);
        assert_eq!(t.counts, vec![10133, 11067]);
        assert_eq!(t.total(), 21200);
    }

    #[test]
    fn four_cpu_laptop_with_leading_spaces() {
        let t = parse_tlb_line(LAPTOP_4CPU).unwrap();
        assert_eq!(t.cpus, vec![0, 1, 2, 3]);
        assert_eq!(t.counts, vec![1203947, 1187622, 1219013, 1190448]);
    }

    #[test]
    fn offline_cpu_has_no_column() {
        let t = parse_tlb_line(SERVER_7_OF_8).unwrap();
        assert_eq!(t.cpus, vec![0, 1, 3, 4, 5, 6, 7]);
        assert_eq!(t.counts, vec![700, 701, 703, 704, 705, 706, 707]);
    }

    #[test]
    fn no_tlb_line_is_none_with_a_clear_message() {
        assert_eq!(parse_tlb_line(ARM64_4CPU), None);
        assert!(NO_TLB_LINE.contains("no `TLB` line"));
        assert!(NO_TLB_LINE.contains("without the TLB-interrupt column"));
        assert_eq!(parse_tlb_line(""), None);
    }

    #[test]
    fn truncated_or_garbled_line_is_none() {
        let t = "  CPU0 CPU1\nTLB: 5 TLB shootdowns\n";
        assert_eq!(parse_tlb_line(t), None);
        let t = "  CPU0 CPU1\nTLB: 5 x TLB shootdowns\n";
        assert_eq!(parse_tlb_line(t), None);
    }

    #[test]
    fn before_and_after_difference_per_cpu() {
        let before = parse_tlb_line(KVM_2CPU).unwrap();
        let after_text =
            KVM_2CPU.replace("TLB:      10133      11067", "TLB:      10133      11069");
        let after = parse_tlb_line(&after_text).unwrap();
        let d = after.since(&before);
        assert_eq!(d.counts, vec![0, 2]);
        assert_eq!(d.total(), 2);
        let mut sum = TlbCounts::default();
        sum.accumulate(&d);
        sum.accumulate(&d);
        assert_eq!(sum.counts, vec![0, 4]);
    }

    #[test]
    fn difference_matches_cpus_by_number() {
        let before = TlbCounts {
            cpus: vec![0, 1, 3],
            counts: vec![10, 20, 30],
        };
        let after = TlbCounts {
            cpus: vec![0, 1, 2, 3],
            counts: vec![11, 20, 5, 29],
        };
        let d = after.since(&before);
        assert_eq!(d.counts, vec![1, 0, 5, 0]);
    }
}
