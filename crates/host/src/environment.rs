//! What changes the meaning of the figures, recorded beside every result:
//! kernel, CPU model, cores, hypervisor and paravirtual TLB flush, PTI,
//! INVLPGB. Each fact is `yes`, `no` or `unknown` with the evidence it was
//! read from; nothing is guessed (see README.md for why each one matters).
//!
//! The parsers are pure functions on file text or CPUID words so that they
//! are tested on samples; `Environment::detect` does the reading.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Known {
    Yes,
    No,
    Unknown,
}

/// A yes/no/unknown fact and the evidence it rests on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fact {
    pub value: Known,
    pub detail: String,
}

impl Fact {
    pub fn yes(detail: impl Into<String>) -> Fact {
        Fact {
            value: Known::Yes,
            detail: detail.into(),
        }
    }
    pub fn no(detail: impl Into<String>) -> Fact {
        Fact {
            value: Known::No,
            detail: detail.into(),
        }
    }
    pub fn unknown(detail: impl Into<String>) -> Fact {
        Fact {
            value: Known::Unknown,
            detail: detail.into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    /// `std::env::consts::OS`.
    pub os: String,
    /// `std::env::consts::ARCH`.
    pub arch: String,
    /// uname: sysname, release and version, or "unknown".
    pub kernel: String,
    /// /proc/cpuinfo `model name` (or the arm equivalent), or "unknown".
    pub cpu_model: String,
    /// CPUs online (/sys/devices/system/cpu/online).
    pub online_cores: Option<usize>,
    /// CPUs this process may run on (sched_getaffinity): one initiator and
    /// at most `usable_cores - 1` responders.
    pub usable_cores: Option<usize>,
    /// Running under a hypervisor (virtual CPUs: a responder's vCPU can be
    /// descheduled by the host, and IPIs are emulated).
    pub hypervisor: Fact,
    /// The hypervisor's CPUID signature, e.g. "KVM", when there is one.
    pub hypervisor_vendor: Option<String>,
    /// Remote TLB flushes done by the hypervisor (no IPI to preempted vCPUs,
    /// or no IPI at all) instead of by IPIs.
    pub pv_tlb_flush: Fact,
    /// Page-table isolation (Meltdown mitigation): every flush also flushes
    /// the user copy of the page tables.
    pub pti: Fact,
    /// AMD broadcast invalidation (INVLPGB): Linux 6.15+ may flush remote
    /// TLBs without any IPI.
    pub invlpgb: Fact,
    /// Whether /proc/interrupts has a `TLB` line to count shootdown IPIs.
    pub tlb_interrupt_line: Fact,
}

impl Environment {
    /// A record with every field unknown (the non-Linux answer).
    pub fn unknown() -> Environment {
        let u = || Fact::unknown("not detected on this OS");
        Environment {
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            kernel: "unknown".into(),
            cpu_model: "unknown".into(),
            online_cores: None,
            usable_cores: None,
            hypervisor: u(),
            hypervisor_vendor: None,
            pv_tlb_flush: u(),
            pti: u(),
            invlpgb: u(),
            tlb_interrupt_line: u(),
        }
    }

    /// Reads the running machine.
    pub fn detect() -> Environment {
        #[cfg(target_os = "linux")]
        {
            linux::detect()
        }
        #[cfg(not(target_os = "linux"))]
        {
            Environment::unknown()
        }
    }

    /// One line for the text table.
    pub fn summary_line(&self) -> String {
        let f = |x: &Fact| match x.value {
            Known::Yes => "yes",
            Known::No => "no",
            Known::Unknown => "unknown",
        };
        let hv = match (&self.hypervisor.value, &self.hypervisor_vendor) {
            (Known::Yes, Some(v)) => format!("yes ({v})"),
            _ => f(&self.hypervisor).to_string(),
        };
        let cores = |c: Option<usize>| c.map_or("unknown".to_string(), |n| n.to_string());
        format!(
            "{} | {} | {} online cores, {} usable | hypervisor: {hv} | paravirtual TLB flush: {} | PTI: {} | INVLPGB: {}",
            self.kernel,
            self.cpu_model,
            cores(self.online_cores),
            cores(self.usable_cores),
            f(&self.pv_tlb_flush),
            f(&self.pti),
            f(&self.invlpgb),
        )
    }
}

/// The fields of /proc/cpuinfo that matter here (first processor).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuInfo {
    pub model: Option<String>,
    pub flags: Vec<String>,
}

impl CpuInfo {
    pub fn has_flag(&self, f: &str) -> bool {
        self.flags.iter().any(|x| x == f)
    }
}

/// Parses /proc/cpuinfo: the model from `model name` (x86), `cpu model`
/// (MIPS), `Hardware` or `Processor` (arm); flags from `flags` (x86) or
/// `Features` (arm). Only the first processor's block is read.
pub fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    let mut model_rank = usize::MAX;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        let rank = ["model name", "cpu model", "Hardware", "Processor"]
            .iter()
            .position(|n| *n == k);
        if let Some(r) = rank
            && r < model_rank
            && !v.is_empty()
        {
            model_rank = r;
            info.model = Some(v.to_string());
        }
        if (k == "flags" || k == "Features") && info.flags.is_empty() {
            info.flags = v.split_whitespace().map(str::to_string).collect();
        }
    }
    info
}

/// Counts the CPUs of a kernel CPU list such as `0-3,8,10-11`.
pub fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// PTI from /sys/devices/system/cpu/vulnerabilities/meltdown (`None`: the
/// file could not be read) and the cpuinfo flag `pti`.
pub fn pti_fact(meltdown: Option<&str>, cpuinfo: &CpuInfo, x86: bool) -> Fact {
    const PATH: &str = "/sys/devices/system/cpu/vulnerabilities/meltdown";
    match meltdown.map(str::trim) {
        Some(m) if m.starts_with("Mitigation: PTI") => Fact::yes(format!("{PATH}: {m}")),
        Some(m) if m == "Not affected" => Fact::no(format!("{PATH}: {m} (the CPU needs no PTI)")),
        Some(m) if m.starts_with("Vulnerable") => Fact::no(format!("{PATH}: {m} (PTI is off)")),
        Some(m) => Fact::unknown(format!("{PATH}: unrecognised {m:?}")),
        None if x86 && cpuinfo.has_flag("pti") => Fact::yes("cpuinfo flag `pti`"),
        None => Fact::unknown(format!("{PATH} unreadable (kernel older than 4.15?)")),
    }
}

/// INVLPGB from the cpuinfo flag (Linux 6.15+ shows it) or CPUID
/// 0x8000_0008 EBX bit 3 (`None`: not read).
pub fn invlpgb_fact(x86: bool, cpuinfo: &CpuInfo, cpuid_ebx_80000008: Option<u32>) -> Fact {
    if !x86 {
        return Fact::no(
            "INVLPGB is an x86 (AMD) instruction; other architectures have their own broadcast invalidation (arm64 TLBI ... IS), which takes no IPI either",
        );
    }
    if cpuinfo.has_flag("invlpgb") {
        return Fact::yes(
            "cpuinfo flag `invlpgb`: Linux 6.15+ may flush remote TLBs by broadcast, without IPIs",
        );
    }
    match cpuid_ebx_80000008 {
        Some(ebx) if ebx & (1 << 3) != 0 => Fact::yes(
            "CPUID 0x80000008 EBX[3] (the kernel does not list the flag, so it does not use it)",
        ),
        Some(_) => Fact::no("neither the cpuinfo flag `invlpgb` nor CPUID 0x80000008 EBX[3]"),
        None => Fact::unknown("no cpuinfo flag `invlpgb`, and CPUID not read"),
    }
}

/// What CPUID says about a hypervisor: the 12-byte signature at the base
/// leaf and, for KVM and Hyper-V, the words that decide the paravirtual
/// flush.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HypervisorCpuid {
    pub signature: String,
    /// KVM: EAX (features) and EDX (hints) of leaf base+1.
    pub kvm_features: Option<(u32, u32)>,
    /// Hyper-V: EAX of leaf 0x4000_0004 (enlightenment recommendations).
    pub hyperv_hints: Option<u32>,
}

/// A readable name for a CPUID hypervisor signature.
pub fn hypervisor_name(signature: &str) -> String {
    let s = signature.trim_end_matches('\0');
    match s {
        "KVMKVMKVM" => "KVM".into(),
        "Microsoft Hv" => "Hyper-V".into(),
        "VMwareVMware" => "VMware".into(),
        "XenVMMXenVMM" => "Xen".into(),
        "TCGTCGTCGTCG" => "QEMU TCG".into(),
        "bhyve bhyve " => "bhyve".into(),
        " lrpepyh  vr" => "Parallels".into(),
        "ACRNACRNACRN" => "ACRN".into(),
        "VBoxVBoxVBox" => "VirtualBox".into(),
        other => format!("unrecognised signature {other:?}"),
    }
}

const KVM_FEATURE_STEAL_TIME: u32 = 5;
const KVM_FEATURE_PV_TLB_FLUSH: u32 = 9;
const KVM_HINTS_REALTIME: u32 = 0;
const HV_X64_REMOTE_TLB_FLUSH_RECOMMENDED: u32 = 2;

/// Whether the guest kernel flushes remote TLBs through the hypervisor.
/// For KVM this is the kernel's own test (`pv_tlb_flush_supported()` in
/// arch/x86/kernel/kvm.c): PV_TLB_FLUSH and STEAL_TIME offered, no REALTIME
/// hint, no MWAIT, more than one CPU. `kernel_log` is true when the boot log
/// says "KVM setup pv remote TLB flush" (`None`: not readable).
pub fn pv_tlb_flush_fact(
    hypervisor: Known,
    cpuid: Option<&HypervisorCpuid>,
    has_mwait: bool,
    possible_cpus: Option<usize>,
    kernel_log: Option<bool>,
) -> Fact {
    match hypervisor {
        Known::No => return Fact::no("no hypervisor: remote TLBs are flushed by IPIs"),
        Known::Unknown => return Fact::unknown("whether there is a hypervisor is unknown"),
        Known::Yes => {}
    }
    let Some(c) = cpuid else {
        return Fact::unknown("hypervisor present, but its CPUID leaves were not read (not x86)");
    };
    let log = match kernel_log {
        Some(true) => "; boot log: \"KVM setup pv remote TLB flush\"",
        Some(false) => "; the boot log (as far as it is kept) has no \"pv remote TLB flush\" line",
        None => "; boot log unreadable",
    };
    if let Some((features, hints)) = c.kvm_features {
        let bit = |w: u32, b: u32| w & (1 << b) != 0;
        let offered = bit(features, KVM_FEATURE_PV_TLB_FLUSH);
        let steal = bit(features, KVM_FEATURE_STEAL_TIME);
        let realtime = bit(hints, KVM_HINTS_REALTIME);
        let one_cpu = possible_cpus == Some(1);
        let used = offered && steal && !realtime && !has_mwait && !one_cpu;
        let why = format!(
            "KVM CPUID: PV_TLB_FLUSH {}, STEAL_TIME {}, REALTIME hint {}, MWAIT {}, CPUs {}{log}",
            yn(offered),
            yn(steal),
            yn(realtime),
            yn(has_mwait),
            possible_cpus.map_or("unknown".into(), |n| n.to_string()),
        );
        return if used || kernel_log == Some(true) {
            Fact::yes(format!(
                "{why}: a preempted vCPU gets no IPI, the host flushes it before it runs again"
            ))
        } else {
            Fact::no(why)
        };
    }
    if let Some(h) = c.hyperv_hints {
        let rec = h & (1 << HV_X64_REMOTE_TLB_FLUSH_RECOMMENDED) != 0;
        let why = format!(
            "Hyper-V CPUID 0x40000004 EAX[2] (remote TLB flush recommended): {}",
            yn(rec)
        );
        return if rec {
            Fact::yes(format!("{why}: Linux flushes by hypercall, with no IPIs"))
        } else {
            Fact::no(why)
        };
    }
    Fact::unknown(format!(
        "hypervisor {} has no paravirtual-flush test here",
        hypervisor_name(&c.signature)
    ))
}

fn yn(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

#[cfg(target_os = "linux")]
mod linux {
    use super::*;

    fn read(path: &str) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    fn kernel() -> String {
        // SAFETY: uname fills the struct it is given; all-zero is a valid
        // initial value for this plain C struct of byte arrays.
        let mut u: nix::libc::utsname = unsafe { std::mem::zeroed() };
        if unsafe { nix::libc::uname(&mut u) } != 0 {
            return "unknown".into();
        }
        let s = |f: &[nix::libc::c_char]| {
            let bytes: Vec<u8> = f
                .iter()
                .take_while(|c| **c != 0)
                .map(|c| *c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        format!("{} {} {}", s(&u.sysname), s(&u.release), s(&u.version))
    }

    #[cfg(target_arch = "x86_64")]
    fn cpuid(leaf: u32) -> [u32; 4] {
        // SAFETY: CPUID exists on every x86_64 CPU; unknown leaves return
        // zeros or the highest basic leaf, never fault.
        #[allow(unused_unsafe)]
        let r = unsafe { core::arch::x86_64::__cpuid(leaf) };
        [r.eax, r.ebx, r.ecx, r.edx]
    }

    #[cfg(target_arch = "x86_64")]
    fn hypervisor_cpuid() -> Option<HypervisorCpuid> {
        // Hypervisor leaves live at 0x4000_0000 + k·0x100 (Linux scans the
        // same range for KVM, which may sit behind a Hyper-V facade).
        let mut first: Option<HypervisorCpuid> = None;
        for base in (0x4000_0000u32..0x4001_0000).step_by(0x100) {
            let [max, b, c, d] = cpuid(base);
            let mut sig = Vec::with_capacity(12);
            for w in [b, c, d] {
                sig.extend_from_slice(&w.to_le_bytes());
            }
            if sig.iter().all(|x| *x == 0) {
                continue;
            }
            let signature = String::from_utf8_lossy(&sig).into_owned();
            let mut h = HypervisorCpuid {
                signature: signature.clone(),
                ..Default::default()
            };
            if signature.starts_with("KVMKVMKVM") {
                let [eax, _, _, edx] = cpuid(base + 1);
                h.kvm_features = Some((eax, edx));
                return Some(h);
            }
            if signature == "Microsoft Hv" && max >= 0x4000_0004 {
                h.hyperv_hints = Some(cpuid(base + 4)[0]);
            }
            if first.is_none() {
                first = Some(h);
            }
        }
        first
    }

    /// Scans the kernel log (/dev/kmsg, root only on most systems) for the
    /// line KVM prints when it sets up the paravirtual remote flush.
    fn kmsg_says_pv_flush() -> Option<bool> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()?;
        let mut buf = vec![0u8; 8192];
        // Each read returns one record; the loop is bounded.
        for _ in 0..200_000 {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if String::from_utf8_lossy(&buf[..n]).contains("pv remote TLB flush") {
                        return Some(true);
                    }
                }
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
        Some(false)
    }

    pub(super) fn detect() -> Environment {
        let x86 = cfg!(any(target_arch = "x86_64", target_arch = "x86"));
        let cpuinfo = read("/proc/cpuinfo")
            .map(|t| parse_cpuinfo(&t))
            .unwrap_or_default();
        let online = read("/sys/devices/system/cpu/online").and_then(|t| count_cpu_list(&t));
        let possible = read("/sys/devices/system/cpu/possible").and_then(|t| count_cpu_list(&t));
        let usable = crate::tester::usable_cpus().ok().map(|v| v.len());

        #[cfg(target_arch = "x86_64")]
        let (hv_cpuid, ebx_80000008) = {
            let max_ext = cpuid(0x8000_0000)[0];
            let ebx = (max_ext >= 0x8000_0008).then(|| cpuid(0x8000_0008)[1]);
            let hv = if cpuid(1)[2] & (1 << 31) != 0 {
                hypervisor_cpuid()
            } else {
                None
            };
            (hv, ebx)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (hv_cpuid, ebx_80000008): (Option<HypervisorCpuid>, Option<u32>) = (None, None);

        let sys_hv = read("/sys/hypervisor/type").map(|s| s.trim().to_string());
        let hypervisor = if x86 && cpuinfo.has_flag("hypervisor") {
            Fact::yes("cpuinfo flag `hypervisor` (CPUID.1:ECX[31])")
        } else if let Some(t) = sys_hv.as_ref().filter(|t| !t.is_empty()) {
            Fact::yes(format!("/sys/hypervisor/type: {t}"))
        } else if x86 && !cpuinfo.flags.is_empty() {
            Fact::no("cpuinfo has no `hypervisor` flag (CPUID.1:ECX[31] clear)")
        } else {
            Fact::unknown(
                "no /sys/hypervisor/type, and no CPUID hypervisor bit on this architecture",
            )
        };
        let hypervisor_vendor = hv_cpuid
            .as_ref()
            .map(|h| hypervisor_name(&h.signature))
            .or_else(|| sys_hv.clone().filter(|t| !t.is_empty()));
        let kernel_log = if hv_cpuid.as_ref().is_some_and(|h| h.kvm_features.is_some()) {
            kmsg_says_pv_flush()
        } else {
            None
        };
        let pv_tlb_flush = pv_tlb_flush_fact(
            hypervisor.value,
            hv_cpuid.as_ref(),
            cpuinfo.has_flag("monitor"),
            possible,
            kernel_log,
        );
        let meltdown = read("/sys/devices/system/cpu/vulnerabilities/meltdown");
        let tlb_interrupt_line = match crate::interrupts::read_tlb_counts() {
            Ok(Some(t)) => Fact::yes(format!(
                "/proc/interrupts `TLB` line, {} CPU columns",
                t.cpus.len()
            )),
            Ok(None) => Fact::no(crate::interrupts::NO_TLB_LINE),
            Err(e) => Fact::unknown(format!("/proc/interrupts unreadable: {e}")),
        };
        Environment {
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            kernel: kernel(),
            cpu_model: cpuinfo.model.clone().unwrap_or_else(|| "unknown".into()),
            online_cores: online,
            usable_cores: usable,
            hypervisor,
            hypervisor_vendor,
            pv_tlb_flush,
            pti: pti_fact(meltdown.as_deref(), &cpuinfo, x86),
            invlpgb: invlpgb_fact(x86, &cpuinfo, ebx_80000008),
            tlb_interrupt_line,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPUINFO_EPYC_GUEST: &str = "processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc msr pae hypervisor lahf_lm invpcid avx512f
bugs\t\t: sysret_ss_attrs

processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu vme
";
    const CPUINFO_ARM: &str = "processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU part\t: 0xd08

Hardware\t: BCM2835
";

    #[test]
    fn cpuinfo_model_and_flags() {
        let c = parse_cpuinfo(CPUINFO_EPYC_GUEST);
        assert_eq!(c.model.as_deref(), Some("AMD EPYC"));
        assert!(c.has_flag("hypervisor") && c.has_flag("invpcid"));
        assert!(!c.has_flag("invlpgb"));
        assert_eq!(c.flags.len(), 11, "only the first processor's flags");
        let a = parse_cpuinfo(CPUINFO_ARM);
        assert_eq!(a.model.as_deref(), Some("BCM2835"));
        assert!(a.has_flag("asimd"));
        assert_eq!(parse_cpuinfo("").model, None);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
    }

    #[test]
    fn pti_states() {
        let c = CpuInfo::default();
        assert_eq!(
            pti_fact(Some("Mitigation: PTI\n"), &c, true).value,
            Known::Yes
        );
        assert_eq!(pti_fact(Some("Not affected"), &c, true).value, Known::No);
        assert_eq!(pti_fact(Some("Vulnerable"), &c, true).value, Known::No);
        assert_eq!(
            pti_fact(Some("Something new"), &c, true).value,
            Known::Unknown
        );
        assert_eq!(pti_fact(None, &c, true).value, Known::Unknown);
        let with_flag = CpuInfo {
            model: None,
            flags: vec!["pti".into()],
        };
        assert_eq!(pti_fact(None, &with_flag, true).value, Known::Yes);
    }

    #[test]
    fn invlpgb_states() {
        let none = CpuInfo::default();
        let flag = CpuInfo {
            model: None,
            flags: vec!["invlpgb".into()],
        };
        assert_eq!(invlpgb_fact(true, &flag, None).value, Known::Yes);
        assert_eq!(invlpgb_fact(true, &none, Some(1 << 3)).value, Known::Yes);
        assert_eq!(invlpgb_fact(true, &none, Some(0)).value, Known::No);
        assert_eq!(invlpgb_fact(true, &none, None).value, Known::Unknown);
        assert_eq!(invlpgb_fact(false, &none, None).value, Known::No);
    }

    #[test]
    fn kvm_pv_flush_follows_the_kernel_test() {
        let kvm = |features: u32, hints: u32| HypervisorCpuid {
            signature: "KVMKVMKVM\0\0\0".into(),
            kvm_features: Some((features, hints)),
            hyperv_hints: None,
        };
        let offered = (1 << 9) | (1 << 5);
        let f = pv_tlb_flush_fact(Known::Yes, Some(&kvm(offered, 0)), false, Some(2), None);
        assert_eq!(f.value, Known::Yes, "{}", f.detail);
        // REALTIME hint, MWAIT, one CPU, or no STEAL_TIME: the kernel keeps IPIs.
        assert_eq!(
            pv_tlb_flush_fact(Known::Yes, Some(&kvm(offered, 1)), false, Some(2), None).value,
            Known::No
        );
        assert_eq!(
            pv_tlb_flush_fact(Known::Yes, Some(&kvm(offered, 0)), true, Some(2), None).value,
            Known::No
        );
        assert_eq!(
            pv_tlb_flush_fact(Known::Yes, Some(&kvm(offered, 0)), false, Some(1), None).value,
            Known::No
        );
        assert_eq!(
            pv_tlb_flush_fact(Known::Yes, Some(&kvm(1 << 9, 0)), false, Some(2), None).value,
            Known::No
        );
        // The boot log is direct evidence.
        assert_eq!(
            pv_tlb_flush_fact(Known::Yes, Some(&kvm(0, 0)), false, Some(2), Some(true)).value,
            Known::Yes
        );
    }

    #[test]
    fn pv_flush_unknowns_are_unknown() {
        assert_eq!(
            pv_tlb_flush_fact(Known::No, None, false, None, None).value,
            Known::No
        );
        assert_eq!(
            pv_tlb_flush_fact(Known::Unknown, None, false, None, None).value,
            Known::Unknown
        );
        assert_eq!(
            pv_tlb_flush_fact(Known::Yes, None, false, None, None).value,
            Known::Unknown
        );
        let vmware = HypervisorCpuid {
            signature: "VMwareVMware".into(),
            ..Default::default()
        };
        let f = pv_tlb_flush_fact(Known::Yes, Some(&vmware), false, Some(4), None);
        assert_eq!(f.value, Known::Unknown);
        assert!(f.detail.contains("VMware"));
        let hv = HypervisorCpuid {
            signature: "Microsoft Hv".into(),
            hyperv_hints: Some(1 << 2),
            ..Default::default()
        };
        assert_eq!(
            pv_tlb_flush_fact(Known::Yes, Some(&hv), false, Some(4), None).value,
            Known::Yes
        );
    }

    #[test]
    fn facts_serialize_lowercase() {
        let j = serde_json::to_value(Fact::unknown("x")).unwrap();
        assert_eq!(j["value"], "unknown");
        assert_eq!(hypervisor_name("KVMKVMKVM\0\0\0"), "KVM");
    }
}
