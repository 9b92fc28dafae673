//! Experiment specs. Layering, lowest first: built-in defaults, the
//! preset's values, the spec file, then `--set key=value` overrides. Every
//! table denies unknown keys; values are validated and an error names the
//! key (exit status 2 in the CLI).

use std::path::Path;

use mmulab_kernel::Costs;
use mmulab_kernel::sim::DisabledWindows;
use mmulab_machine::{PtFormat, TlbConfig};
use mmulab_workloads::WorkloadSpec;
use serde::{Deserialize, Serialize};
use toml::Value;

use crate::preset;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A key or value that is wrong; the message names it. Whatever of the
    /// user's input it echoes is cut to [`ECHO_CHARS`] characters on
    /// display (a 50 MB protocol name came back whole).
    #[error("{}", clip_message(.0))]
    Invalid(String),
    #[error("cannot read {}: {err}", clip(path))]
    Io { path: String, err: std::io::Error },
}

/// The most characters of a user's key, value or line an error echoes.
pub const ECHO_CHARS: usize = 200;

/// The largest spec file read (specs are a few KiB; a 50 MB one peaked at
/// 1.3 GB of memory while parsing).
pub const MAX_SPEC_BYTES: u64 = 1 << 20;

/// The most components a `--set` key may have (the deepest spec key has 4,
/// `memory.interconnect.mesh_cols` 3); 60,000 overflowed the stack.
pub const MAX_KEY_DEPTH: usize = 8;

/// The longest run a spec may ask for (`engine.max_cycles`): 10^15 cycles,
/// 11 days at 1 GHz. Every other duration in a spec is bounded by the
/// run's own limit, so sums of them stay far from overflowing a u64.
pub const MAX_CYCLES: u64 = 1_000_000_000_000_000;

/// The longest per-CPU action queue (`protocol_options.action_queue`):
/// Mach's queues hold a handful of entries; a queue longer than the
/// largest TLB only delays the full flush it stands for.
pub const MAX_ACTION_QUEUE: usize = mmulab_machine::TlbConfig::MAX_ENTRIES;

/// A spec or preset file's text, refused past [`MAX_SPEC_BYTES`]. The
/// limit is applied while reading (at most one byte past it is taken), so
/// it holds for a file that grows, a pipe, or /dev/zero.
pub(crate) fn read_bounded(path: &Path, what: &str) -> Result<String, SpecError> {
    use std::io::Read;
    let io = |err| SpecError::Io {
        path: path.display().to_string(),
        err,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_SPEC_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_SPEC_BYTES {
        return Err(invalid(format!(
            "{}: {what} is at most {MAX_SPEC_BYTES} bytes (1 MiB)",
            path.display()
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        invalid(format!(
            "{}: not UTF-8 text (byte {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

/// `s` cut to [`ECHO_CHARS`] characters, saying how long it was. A string
/// already cut (its 200 characters and the `…`) is left as it is.
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(ECHO_CHARS + 1) {
        None => s.to_string(),
        Some(_) => {
            let (i, _) = s.char_indices().nth(ECHO_CHARS).expect("longer");
            format!("{}… ({} bytes in all)", &s[..i], s.len())
        }
    }
}

/// An error message with every echo of the user's input cut: each quoted
/// (`…`, "…") or unbroken run longer than [`ECHO_CHARS`], and the source
/// lines a TOML parse error quotes (`12 | …` and the caret line under it).
pub fn clip_message(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len().min(64 * 1024));
    for (n, line) in msg.split('\n').enumerate() {
        if n > 0 {
            out.push('\n');
        }
        let t = line.trim_start();
        let snippet = t.starts_with('|')
            || (t.starts_with(|c: char| c.is_ascii_digit())
                && t.trim_start_matches(|c: char| c.is_ascii_digit())
                    .starts_with(" |"));
        if snippet {
            out.push_str(&clip(line));
            continue;
        }
        clip_runs(line, &mut out);
    }
    out
}

/// Copies `line`, cutting quoted spans and unbroken runs that are too long.
fn clip_runs(line: &str, out: &mut String) {
    let mut rest = line;
    while !rest.is_empty() {
        let c = rest.chars().next().expect("not empty");
        if c.is_whitespace() {
            out.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if (c == '`' || c == '"')
            && let Some(end) = rest[1..].find(c)
        {
            let inner = &rest[1..1 + end];
            out.push(c);
            out.push_str(&clip(inner));
            out.push(c);
            rest = &rest[end + 2..];
            continue;
        }
        let end = rest[c.len_utf8()..]
            .find(|ch: char| ch.is_whitespace() || ch == '`' || ch == '"')
            .map_or(rest.len(), |i| i + c.len_utf8());
        out.push_str(&clip(&rest[..end]));
        rest = &rest[end..];
    }
}

fn invalid(s: impl Into<String>) -> SpecError {
    SpecError::Invalid(s.into())
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// The protocol behind the pmap interface (`mmulab list`).
    pub protocol: String,
    /// The run seed; run r of `runs` uses `seed + r`.
    #[serde(default = "Spec::default_seed")]
    pub seed: u64,
    /// Independent runs (seeds) whose results are merged.
    #[serde(default = "Spec::default_runs")]
    pub runs: u64,
    /// Timing preset: a built-in name (`mmulab list`) or a path to a preset
    /// file (`mmulab host preset` writes one).
    #[serde(default = "Spec::default_preset")]
    pub preset: String,
    #[serde(default)]
    pub machine: MachineSpec,
    #[serde(default)]
    pub engine: EngineSpec,
    #[serde(default)]
    pub kernel: KernelSpec,
    #[serde(default)]
    pub protocol_options: ProtocolOptionsSpec,
    #[serde(default)]
    pub costs: Costs,
    /// The cache hierarchy behind the walker and references (romanescu10
    /// Table 1); absent = flat memory. `unitd` and `ideal` need it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<mmulab_memsys::MemConfig>,
    pub workload: WorkloadSpec,
}

impl Spec {
    fn default_seed() -> u64 {
        1
    }
    fn default_runs() -> u64 {
        1
    }
    fn default_preset() -> String {
        "generic".into()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MachineSpec {
    /// Processors, 1 to 1024.
    pub cpus: usize,
    /// Physical memory in MiB.
    pub memory_mb: u64,
    /// `i386`, `pae` or `x86-64`.
    pub page_table: PtFormat,
    pub tlb: TlbConfig,
}

impl Default for MachineSpec {
    fn default() -> Self {
        MachineSpec {
            cpus: 16,
            memory_mb: 512,
            page_table: PtFormat::X86_64,
            tlb: TlbConfig::default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSpec {
    /// How far (cycles) a CPU in user mode may run ahead of the event
    /// frontier; also the bound on extra interrupt latency.
    pub quantum_cycles: u64,
    /// Spin iterations before the watchdog reports a liveness failure.
    pub spin_bound: u64,
    /// Simulated time limit per run (cycles).
    pub max_cycles: u64,
}

impl Default for EngineSpec {
    fn default() -> Self {
        EngineSpec {
            quantum_cycles: 500,
            spin_bound: 2_000_000,
            max_cycles: 20_000_000_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KernelSpec {
    /// Interrupt-disabled kernel windows taken from user mode (black89
    /// §8); absent = none.
    pub disabled_windows: Option<DisabledWindows>,
    /// Mean length (cycles, exponential) of the interrupt-disabled section
    /// of every system call and fault; 0 = none.
    pub trap_disabled_mean_cycles: u64,
    /// Clock ticks per second (`lbolt`); default 100.
    pub hz: u64,
    /// Pages of kernel virtual space managed by segkmem (balan92); default
    /// 4096 (16 MB).
    pub segkmem_pages: u64,
    /// Bytes of segkmem bitmap per zone (balan92: default 16).
    pub segkmem_zone_bytes: u64,
    /// Pages of kernel virtual space managed by segmap (balan92);
    /// default 16 (8 chunks of 8 KB: small, so that `mmulab check` reuses
    /// chunks often).
    pub segmap_pages: u64,
    /// segmap chunk size in bytes, a page multiple (balan92: 8192).
    pub segmap_chunk_bytes: u64,
    /// segmap ablation: unload and shoot at every last release.
    pub segmap_eager: bool,
    /// balan92 §Pageout: SVR4's global daemon instead of local aging.
    pub pageout_global: bool,
    /// segkmem allocates first fit instead of next fit (an ablation).
    pub segkmem_first_fit: bool,
    /// balan92 §Physical Memory Scalability: SVR4's map of all physical
    /// memory in kernel virtual space, which limits memory to 256 MB
    /// (SVR4.2, the default false, caches each level-2 table's address
    /// instead and maps other pages transiently: no limit).
    pub physmap: bool,
    /// Linux's APIC mode at boot: flat (one ICR write for every target)
    /// on machines of at most this many CPUs, bigsmp (one per target)
    /// above; 0 = bigsmp always.
    pub apic_flat_max_cpus: u64,
    /// The level the kernel's interrupt-disabled sections (the trap
    /// sections and `disabled_windows`) raise to: `all` (every interrupt
    /// masked, the default) or `high` (every device interrupt masked, a
    /// cross-processor interrupt above them let through, black89 §9).
    pub disabled_level: String,
}

impl Default for KernelSpec {
    fn default() -> Self {
        let k = mmulab_kernel::KernelParams::default();
        KernelSpec {
            disabled_windows: None,
            trap_disabled_mean_cycles: 0,
            hz: k.hz,
            segkmem_pages: k.segkmem_pages,
            segkmem_zone_bytes: k.segkmem_zone_bytes,
            segmap_pages: k.segmap_pages,
            segmap_chunk_bytes: k.segmap_chunk_pages * 4096,
            segmap_eager: k.segmap_eager,
            pageout_global: k.pageout_global,
            physmap: false,
            segkmem_first_fit: k.segkmem_first_fit,
            apic_flat_max_cpus: k.apic_flat_max_cpus,
            disabled_level: "all".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProtocolOptionsSpec {
    /// No shootdown for pages not mapped in the pmap (black89 §4).
    pub lazy: bool,
    /// Pages above which a TLB is flushed whole instead of per entry.
    pub flush_threshold: u64,
    /// Per-CPU action-queue size (overflow → full flush).
    pub action_queue: usize,
    /// svr42: immediate shootdowns invalidate single entries (balan92
    /// §Other Architectures); default false (the i386 flushes whole TLBs).
    pub single_entry_flush: bool,
    /// svr42: ranges of at least this many pages use the L1 trick (i386
    /// tables only); 0 = off; default 64.
    pub l1_trick_pages: u64,
    /// svr42: skip spans without a mapping chunk (balan92 §Background);
    /// default true.
    pub mapping_chunks: bool,
    /// svr42: immediate shootdowns take the global lock even with no other
    /// CPU in the address space (balan92 step 1); default true.
    pub shoot_lock_when_alone: bool,
    /// svr42: fork drops the HAT lock after each mapping chunk (balan92
    /// §Analysis, "being considered"); default false.
    pub fork_chunk_unlock: bool,
    /// svr42: one HAT lock per page table, the address space's lock kept
    /// for its CPU set and level-1 directory (balan92 §Locking Design,
    /// "considered"); default false.
    pub hat_lock_per_pt: bool,
    /// mach: the shootdown interrupt's level, `device` (the measured
    /// kernel's, black89 §8-9) or `above-device` (§9's recommended design;
    /// the default).
    pub shootdown_level: String,
    /// mach: how the initiator sends its interrupts, `each` (Fig. 1's
    /// loop; the default), `multicast` or `broadcast` (black89 §9).
    pub interrupt_send: String,
    /// mach: TLBs other processors can invalidate (black89 §9): no
    /// interrupts, no responders; default false.
    pub remote_invalidate: bool,
}

impl Default for ProtocolOptionsSpec {
    fn default() -> Self {
        let d = mmulab_protocols::ProtocolOptions::default();
        ProtocolOptionsSpec {
            lazy: d.lazy,
            flush_threshold: d.flush_threshold,
            action_queue: d.action_queue,
            single_entry_flush: d.single_entry_flush,
            l1_trick_pages: d.l1_trick_pages,
            mapping_chunks: d.mapping_chunks,
            shoot_lock_when_alone: d.shoot_lock_when_alone,
            fork_chunk_unlock: d.fork_chunk_unlock,
            hat_lock_per_pt: d.hat_lock_per_pt,
            shootdown_level: d.shootdown_level.name().into(),
            interrupt_send: d.interrupt_send.name().into(),
            remote_invalidate: d.remote_invalidate,
        }
    }
}

/// `kernel.disabled_level`'s names: `all` masks every interrupt, `high`
/// (splhigh) every device interrupt.
pub fn kernel_disabled_ipl(name: &str) -> Option<mmulab_kernel::Ipl> {
    match name {
        "all" => Some(mmulab_kernel::Ipl::ALL),
        "high" => Some(mmulab_kernel::Ipl::HIGH),
        _ => None,
    }
}

/// Parses a `--set` value: a TOML literal when it is one, else a string.
fn parse_value(raw: &str) -> Value {
    let doc = format!("v = {raw}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").expect("parsed"),
        Err(_) => Value::String(raw.to_string()),
    }
}

/// Sets a dotted key in a TOML table, creating tables on the way.
pub fn set_path(root: &mut toml::Table, key: &str, value: Value) -> Result<(), SpecError> {
    // Counted before splitting: a key of 60,000 components is refused
    // without building anything from it.
    let depth = key.split('.').take(MAX_KEY_DEPTH + 1).count();
    if depth > MAX_KEY_DEPTH {
        return Err(invalid(format!(
            "--set {}: a key has at most {MAX_KEY_DEPTH} dotted components",
            clip(key)
        )));
    }
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(invalid(format!("--set {key}: empty key component")));
    }
    let mut t = root;
    for (i, p) in parts[..parts.len() - 1].iter().enumerate() {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| Value::Table(toml::Table::new()));
        t = entry.as_table_mut().ok_or_else(|| {
            invalid(format!(
                "--set {key}: `{}` is not a table",
                parts[..=i].join(".")
            ))
        })?;
    }
    t.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// Deep merge: `over` wins, tables merge recursively — except a tagged
/// table (one with a `kind`) whose kind changes, which replaces the old
/// one whole (a preset's directory interconnect does not lend its mesh
/// keys to a snooping one).
pub fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(Value::Table(b)), Value::Table(o))
                if o.get("kind").is_none() || o.get("kind") == b.get("kind") =>
            {
                merge(b, o)
            }
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

impl Spec {
    /// Loads a spec file; a path that is not a file but names a spec of
    /// the embedded `experiments/` (`experiments/tester.toml`,
    /// `black89/fig2.toml`, `black89/fig2`) loads that one, so that the
    /// shipped specs run from any folder.
    pub fn load(path: &Path, sets: &[String]) -> Result<Spec, SpecError> {
        if !path.exists()
            && let Some((rel, text)) = embedded(path)
        {
            return Spec::parse(&text, sets, &format!("experiments/{rel}"));
        }
        let text = read_bounded(path, "a spec file")?;
        Spec::parse(&text, sets, &path.display().to_string())
    }

    /// Parses spec text with overrides applied. `origin` names the file in
    /// error messages.
    pub fn parse(text: &str, sets: &[String], origin: &str) -> Result<Spec, SpecError> {
        if text.len() as u64 > MAX_SPEC_BYTES {
            return Err(invalid(format!(
                "{origin}: a spec is at most {MAX_SPEC_BYTES} bytes (1 MiB), this one has {}",
                text.len()
            )));
        }
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| invalid(format!("{origin}: {e}")))?;
        // `experiments/PAPER/*.toml` carry the paper's numbers in `[paper]`
        // for `mmulab reproduce`; a plain run of such a spec ignores them.
        if matches!(table.get("paper"), Some(Value::Table(_))) {
            table.remove("paper");
        }
        for s in sets {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| invalid(format!("--set {s}: expected KEY=VALUE")))?;
            set_path(&mut table, k.trim(), parse_value(v.trim()))?;
        }
        let preset_name = match table.get("preset") {
            None => Spec::default_preset(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(invalid(format!(
                    "preset: expected a string, got {}",
                    other.type_str()
                )));
            }
        };
        let mut effective = preset::load(&preset_name)?.spec;
        merge(&mut effective, table);
        let spec: Spec = Spec::deserialize(effective.clone())
            .map_err(|e| invalid(format!("{origin}: {}", e.to_string().trim())))?;
        // serde reads a struct from an array by position; a spec never
        // does (`--set engine=[1,1,1]` set three keys no one named).
        let shape = serde_json::to_value(&spec).expect("a spec serialises");
        no_positional_tables(&effective, &shape, "")?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks values the types cannot; each error names its key.
    pub fn validate(&self) -> Result<(), SpecError> {
        if mmulab_protocols::find(&self.protocol).is_none() {
            return Err(invalid(format!(
                "protocol: unknown protocol `{}` (known: {})",
                self.protocol,
                mmulab_protocols::names().join(", ")
            )));
        }
        let m = &self.machine;
        if !(1..=1024).contains(&m.cpus) {
            return Err(invalid(format!(
                "machine.cpus: must be 1 to 1024, got {}",
                m.cpus
            )));
        }
        if m.memory_mb == 0 {
            return Err(invalid("machine.memory_mb: must be at least 1"));
        }
        if m.memory_mb > m.page_table.max_memory_mb() {
            return Err(invalid(format!(
                "machine.memory_mb: {} page tables address at most {} MB of physical memory, got {}",
                m.page_table.name(),
                m.page_table.max_memory_mb(),
                m.memory_mb
            )));
        }
        m.tlb.validate("machine.tlb").map_err(invalid)?;
        if self.runs == 0 {
            return Err(invalid("runs: must be at least 1"));
        }
        if self.engine.quantum_cycles == 0 {
            return Err(invalid("engine.quantum_cycles: must be at least 1"));
        }
        if self.engine.spin_bound == 0 {
            return Err(invalid("engine.spin_bound: must be at least 1"));
        }
        if !(self.costs.clock_hz > 0.0 && self.costs.clock_hz.is_finite()) {
            return Err(invalid(format!(
                "costs.clock_hz: must be a positive rate, got {}",
                self.costs.clock_hz
            )));
        }
        let e = &self.engine;
        if !(1..=MAX_CYCLES).contains(&e.max_cycles) {
            return Err(invalid(format!(
                "engine.max_cycles: must be 1 to {MAX_CYCLES} (10^15), got {}",
                e.max_cycles
            )));
        }
        if e.quantum_cycles > e.max_cycles {
            return Err(invalid(format!(
                "engine.quantum_cycles: {} is longer than the run (engine.max_cycles = {})",
                e.quantum_cycles, e.max_cycles
            )));
        }
        self.costs
            .validate("costs", e.max_cycles, self.memory.is_none())
            .map_err(invalid)?;
        let q = self.protocol_options.action_queue;
        if !(1..=MAX_ACTION_QUEUE).contains(&q) {
            return Err(invalid(format!(
                "protocol_options.action_queue: must be 1 to {MAX_ACTION_QUEUE} entries, got {q}"
            )));
        }
        if let Some(dw) = &self.kernel.disabled_windows {
            dw.validate("kernel.disabled_windows", e.max_cycles)
                .map_err(invalid)?;
        }
        let o = &self.protocol_options;
        for (key, value, names, known) in [
            (
                "shootdown_level",
                &o.shootdown_level,
                &mmulab_protocols::ShootdownLevel::NAMES[..],
                mmulab_protocols::ShootdownLevel::parse(&o.shootdown_level).is_some(),
            ),
            (
                "interrupt_send",
                &o.interrupt_send,
                &mmulab_protocols::InterruptSend::NAMES[..],
                mmulab_protocols::InterruptSend::parse(&o.interrupt_send).is_some(),
            ),
        ] {
            if !known {
                return Err(invalid(format!(
                    "protocol_options.{key}: must be one of {}, got {:?}",
                    names.join(", "),
                    clip(value)
                )));
            }
        }
        // Remote invalidation replaces Fig. 1's responders, which the mach
        // negative controls mutate and the other protocols do not have: it
        // would do nothing there, or undo the mutation.
        if self.protocol_options.remote_invalidate && self.protocol != "mach" {
            return Err(invalid(format!(
                "protocol_options.remote_invalidate: only protocol \"mach\" has it, got {:?}",
                clip(&self.protocol)
            )));
        }
        let k = &self.kernel;
        if kernel_disabled_ipl(&k.disabled_level).is_none() {
            return Err(invalid(format!(
                "kernel.disabled_level: must be all or high, got {:?}",
                clip(&k.disabled_level)
            )));
        }
        if k.hz == 0 {
            return Err(invalid("kernel.hz: must be at least 1"));
        }
        // A clock interrupt needs at least a cycle: a tick rate above the
        // processor's clock (10^12 Hz on a 15 MHz machine) is no machine.
        if k.hz as f64 > self.costs.clock_hz {
            return Err(invalid(format!(
                "kernel.hz: {} ticks a second is faster than the processor's clock (costs.clock_hz = {} Hz)",
                k.hz, self.costs.clock_hz
            )));
        }
        if k.segkmem_zone_bytes == 0 {
            return Err(invalid(
                "kernel.segkmem_zone_bytes: must be at least 1 (balan92's default is 16)",
            ));
        }
        if k.segkmem_pages == 0 {
            return Err(invalid("kernel.segkmem_pages: must be at least 1"));
        }
        // balan92 §Physical Memory Scalability: the kernel has 1 GB of the
        // i386's 4 GB virtual space, shared by segkmem, segmap and segu.
        const KERNEL_VIRTUAL_PAGES: u64 = (1 << 30) / 4096;
        // segkmem starts 256 pages above the kernel base.
        if k.segkmem_pages > KERNEL_VIRTUAL_PAGES - 0x100 {
            return Err(invalid(format!(
                "kernel.segkmem_pages: {} pages exceed the 1 GB kernel virtual space ({} pages)",
                k.segkmem_pages, KERNEL_VIRTUAL_PAGES
            )));
        }
        if k.segmap_chunk_bytes == 0 || !k.segmap_chunk_bytes.is_multiple_of(4096) {
            return Err(invalid(format!(
                "kernel.segmap_chunk_bytes: must be a positive multiple of the 4096-byte page, got {}",
                k.segmap_chunk_bytes
            )));
        }
        if k.segmap_pages < k.segmap_chunk_bytes / 4096 {
            return Err(invalid(format!(
                "kernel.segmap_pages: {} pages hold no {}-byte chunk",
                k.segmap_pages, k.segmap_chunk_bytes
            )));
        }
        // segmap sits at the top of the kernel's 1 GB (below 16 guard
        // pages), segkmem at the bottom (above 256 pages).
        if k.segkmem_pages + k.segmap_pages + 0x100 + 16 > KERNEL_VIRTUAL_PAGES {
            return Err(invalid(format!(
                "kernel.segmap_pages: segkmem ({}) and segmap ({}) pages exceed the 1 GB kernel virtual space ({} pages)",
                k.segkmem_pages, k.segmap_pages, KERNEL_VIRTUAL_PAGES
            )));
        }
        // balan92 §Physical Memory Scalability.
        const PHYSMAP_LIMIT_MB: u64 = 256;
        if k.physmap && m.memory_mb > PHYSMAP_LIMIT_MB {
            return Err(invalid(format!(
                "kernel.physmap: SVR4's map of all physical memory covers at most {PHYSMAP_LIMIT_MB} MB, machine.memory_mb is {}",
                m.memory_mb
            )));
        }
        self.validate_memory()?;
        cycles_within(&self.to_json(), "", e.max_cycles)?;
        self.workload.validate(m.cpus).map_err(invalid)?;
        self.workload
            .fits(m.cpus, self.usable_pages())
            .map_err(invalid)?;
        Ok(())
    }

    /// Frames of `machine.memory_mb` a workload may fill: all but a 1/64
    /// share and 256 frames kept for page tables and the kernel's own
    /// (a leaf table maps 512 pages, 1024 on the i386).
    pub fn usable_pages(&self) -> u64 {
        let frames = self.machine.memory_mb.saturating_mul(256);
        frames.saturating_sub(frames / 64 + 256)
    }

    /// The `[memory]` table against the machine and the protocol.
    fn validate_memory(&self) -> Result<(), SpecError> {
        let entry = mmulab_protocols::find(&self.protocol).expect("checked above");
        let hw = (entry.make)(&mmulab_protocols::ProtocolOptions::default()).tlb_hardware();
        let Some(mem) = &self.memory else {
            if hw != mmulab_kernel::memory::TlbHardware::Software {
                return Err(invalid(format!(
                    "protocol: `{}` needs a cache hierarchy; add a [memory] table or use preset = \"x86-simics-2010\" (memory is flat)",
                    self.protocol
                )));
            }
            return Ok(());
        };
        let mut mem = mem.clone();
        // The simulator sets the core count from the machine.
        mem.cores = self.machine.cpus;
        mem.validate("memory").map_err(invalid)?;
        mem.validate_against_tlb("memory", self.machine.tlb.entries, self.machine.tlb.ways)
            .map_err(invalid)?;
        if mem.tlbs_per_core != 2 {
            // The kernel's cores have an I-TLB (PCAM 0) and a D-TLB (PCAM 1).
            return Err(invalid(format!(
                "memory.tlbs_per_core: {} is not 2 (each core has an I-TLB and a D-TLB, Table 1)",
                mem.tlbs_per_core
            )));
        }
        Ok(())
    }

    /// The effective spec as JSON (written into every result).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a spec serialises")
    }
}

/// Refuses an array given where the spec has a table (`shape` is the
/// parsed spec), naming the key.
fn no_positional_tables(
    given: &toml::Table,
    shape: &serde_json::Value,
    prefix: &str,
) -> Result<(), SpecError> {
    for (k, v) in given {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let Some(want) = shape.get(k.as_str()) else {
            continue;
        };
        match (v, want) {
            (Value::Array(_), serde_json::Value::Object(_)) => {
                return Err(invalid(format!(
                    "{}: expected a table of named keys, got an array (a table's keys are never taken by position)",
                    clip(&key)
                )));
            }
            (Value::Table(t), serde_json::Value::Object(_)) => {
                no_positional_tables(t, want, &key)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Every `*_cycles` value of the spec (costs, kernel, workload, memory) is
/// at most `max`, the run's own time limit: a duration the run can never
/// reach is a typo or an overflow waiting to happen.
fn cycles_within(v: &serde_json::Value, prefix: &str, max: u64) -> Result<(), SpecError> {
    if let serde_json::Value::Object(m) = v {
        for (k, x) in m {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            if k.ends_with("_cycles")
                && key != "engine.max_cycles"
                && let Some(n) = x.as_u64()
                && n > max
            {
                return Err(invalid(format!(
                    "{key}: {n} cycles is longer than the run's time limit (engine.max_cycles = {max})"
                )));
            }
            cycles_within(x, &key, max)?;
        }
    }
    Ok(())
}

/// The embedded spec `path` names, with or without `experiments/` and
/// `.toml`: its path under `experiments/` and its text.
pub fn embedded(path: &Path) -> Option<(String, String)> {
    let name = path.to_str()?;
    let name = name.strip_prefix("./").unwrap_or(name);
    let name = name.strip_prefix("experiments/").unwrap_or(name);
    let rel = if name.ends_with(".toml") {
        name.to_string()
    } else {
        format!("{name}.toml")
    };
    let text = mmulab_report::Experiments::Embedded.read(&rel).ok()?;
    Some((rel, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "protocol = \"global\"\n[workload]\nkind = \"tester\"\nchildren = 2\n";

    fn err(text: &str, sets: &[&str]) -> String {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Spec::parse(text, &sets, "spec.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn base_spec_parses_with_defaults() {
        let s = Spec::parse(BASE, &[], "t").unwrap();
        assert_eq!(s.machine.cpus, 16);
        assert_eq!(s.seed, 1);
    }

    #[test]
    fn set_overrides_any_field() {
        let s = Spec::parse(
            BASE,
            &[
                "machine.cpus=4".into(),
                "seed=9".into(),
                "machine.tlb.policy=fifo".into(),
            ],
            "t",
        )
        .unwrap();
        assert_eq!(s.machine.cpus, 4);
        assert_eq!(s.seed, 9);
        assert_eq!(s.machine.tlb.policy, mmulab_machine::Policy::Fifo);
    }

    #[test]
    fn interrupt_levels_are_checked_by_name() {
        let e = err(BASE, &["protocol_options.shootdown_level=\"above\""]);
        assert!(
            e.contains("protocol_options.shootdown_level") && e.contains("above-device"),
            "{e}"
        );
        let e = err(BASE, &["kernel.disabled_level=\"device\""]);
        assert!(e.contains("kernel.disabled_level"), "{e}");
        let e = err(BASE, &["protocol_options.remote_invalidate=true"]);
        assert!(
            e.contains("protocol_options.remote_invalidate") && e.contains("mach"),
            "{e}"
        );
        let e = err(BASE, &["protocol_options.interrupt_send=\"all\""]);
        assert!(
            e.contains("protocol_options.interrupt_send") && e.contains("broadcast"),
            "{e}"
        );
        let s = Spec::parse(
            BASE,
            &[
                "protocol_options.shootdown_level=\"device\"".into(),
                "kernel.disabled_level=\"high\"".into(),
            ],
            "t",
        )
        .unwrap();
        assert_eq!(s.protocol_options.shootdown_level, "device");
        assert_eq!(
            kernel_disabled_ipl(&s.kernel.disabled_level),
            Some(mmulab_kernel::Ipl::HIGH)
        );
    }

    #[test]
    fn unknown_key_is_named() {
        assert!(err(&format!("{BASE}[machine]\ncpuz = 3\n"), &[]).contains("cpuz"));
        assert!(err(BASE, &["engine.bogus=1"]).contains("bogus"));
    }

    #[test]
    fn a_paper_table_is_ignored_by_a_run_but_a_paper_value_is_not() {
        let s = Spec::parse(&format!("{BASE}[paper]\nslope_us = 55.0\n"), &[], "t").unwrap();
        assert_eq!(s.machine.cpus, 16);
        assert!(err(&format!("paper = 3\n{BASE}"), &[]).contains("paper"));
    }

    #[test]
    fn wrong_type_is_named() {
        let e = err(BASE, &["machine.cpus=\"many\""]);
        assert!(e.contains("cpus"), "{e}");
    }

    #[test]
    fn impossible_values_are_named() {
        assert!(err(BASE, &["machine.cpus=0"]).starts_with("machine.cpus"));
        assert!(err(BASE, &["machine.cpus=2000"]).starts_with("machine.cpus"));
        let e = err(BASE, &["machine.tlb.entries=4", "machine.tlb.ways=8"]);
        assert!(e.starts_with("machine.tlb.ways"), "{e}");
        assert!(err(BASE, &["preset=\"no-such-preset\""]).starts_with("preset"));
        assert!(err(BASE, &["protocol=\"bogus\""]).starts_with("protocol"));
        assert!(err(BASE, &["workload.children=16"]).starts_with("workload.children"));
        assert!(err(BASE, &["runs=0"]).starts_with("runs"));
    }
}

#[cfg(test)]
mod clip_tests {
    use super::*;

    /// Regression: a 50 MB protocol name came back whole on stderr.
    #[test]
    fn echoed_input_is_cut_to_200_characters_once() {
        let key = "a.".repeat(60_000);
        let msg = format!(
            "--set {}: a key has at most 8 dotted components",
            clip(&key)
        );
        let once = clip_message(&msg);
        assert_eq!(clip_message(&once), once, "clipping is idempotent");
        assert!(once.len() < 400, "{once}");
        assert!(once.contains("(120000 bytes in all)"), "{once}");
        assert_eq!(once.matches("bytes in all").count(), 1, "{once}");
        let quoted = format!("unknown protocol `{}` (known: none)", "x".repeat(5_000_000));
        let cut = clip_message(&quoted);
        assert!(cut.len() < 400 && cut.ends_with("(known: none)"), "{cut}");
        let snippet = format!(
            "TOML parse error\n1 | x = {}\n  |     ^\n",
            "[".repeat(100_000)
        );
        assert!(clip_message(&snippet).len() < 700);
        // Short messages pass through untouched.
        let plain = "machine.cpus: must be 1 to 1024, got 0";
        assert_eq!(clip_message(plain), plain);
    }
}
