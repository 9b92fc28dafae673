//! `mmulab trace capture`: run a command under Valgrind lackey and write binary traces.
//!
//! Valgrind runs with `--tool=lackey --trace-mem=yes --trace-syscalls=yes
//! --trace-children=yes --log-file=DIR/lackey.%p.log`, so every process of the command
//! (the command itself and each child it forks or execs) writes its own log. The logs are
//! parsed *online*: while Valgrind runs, this process follows every log in DIR, decodes
//! each complete line as it appears and appends it to that process's binary trace; when
//! Valgrind exits the rest is drained. The logs are deleted afterwards unless kept.
//!
//! The command's own process is written to `out`; every other process to `out.PID`.
//!
//! When a traced process execs, the new Valgrind instance reopens the same `%p` log and
//! truncates it. The follower notices (the log shrank, or its first bytes — the banner with
//! the `Command:` line — changed), finishes the old image and starts reading the new one
//! into the same binary trace. Lines of the old image not yet read when the rewrite
//! happened are lost (Valgrind itself discards them); following online keeps that small.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::binary::{BinaryWriter, LackeyToBinary, Staged};
use crate::lackey::LackeyDecoder;
use crate::{Result, TraceError, page_shift};

/// Capture settings.
#[derive(Clone, Debug)]
pub struct CaptureOptions {
    /// Page size the binary traces are split at (the smallest they can be simulated at).
    /// Default 4096.
    pub page_size: u64,
    /// The Valgrind executable. Default `valgrind` (from `PATH`).
    pub valgrind: PathBuf,
    /// Where the lackey logs go; default a fresh directory under the system temp dir.
    pub log_dir: Option<PathBuf>,
    /// Keep the lackey logs after parsing. Default false.
    pub keep_logs: bool,
    /// Unless logs are kept, give back the disk space of each log's parsed part (Linux
    /// `fallocate` hole punching) whenever this many more bytes have been parsed, so a long
    /// capture needs little more disk than its binary traces. 0 = never. Default 64 MiB.
    pub release_every_bytes: u64,
}

impl Default for CaptureOptions {
    fn default() -> CaptureOptions {
        CaptureOptions {
            page_size: 4096,
            valgrind: PathBuf::from("valgrind"),
            log_dir: None,
            keep_logs: false,
            release_every_bytes: 64 << 20,
        }
    }
}

/// One traced process.
#[derive(Clone, Debug, Serialize)]
pub struct CapturedProcess {
    pub pid: u32,
    /// The binary trace written.
    pub trace: PathBuf,
    /// The lackey log it came from (deleted unless kept).
    pub log: PathBuf,
    pub log_bytes: u64,
    pub lackey_lines: u64,
    pub accesses: u64,
    pub page_refs: u64,
    pub syscalls: u64,
    pub trace_bytes: u64,
    /// Times the process exec'd: Valgrind then truncates and rewrites its log; the
    /// binary trace keeps the images one after the other.
    pub execs: u32,
}

/// What [`capture`] did.
#[derive(Clone, Debug, Serialize)]
pub struct CaptureSummary {
    /// The exact command run.
    pub command: Vec<String>,
    /// The command's exit status (Valgrind passes the guest's through); None if killed.
    pub exit_code: Option<i32>,
    /// The command's own process first, then the others by pid.
    pub processes: Vec<CapturedProcess>,
    pub log_dir: PathBuf,
    /// True: logs were parsed while Valgrind ran.
    pub online: bool,
    pub wall_seconds: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

struct Follower {
    pid: u32,
    log: PathBuf,
    file: File,
    decoder: LackeyDecoder,
    sink: LackeyToBinary,
    trace: PathBuf,
    /// The trace is written beside `trace` and renamed over it only when
    /// the whole capture succeeded; an error (or a panic) removes it.
    staged: Staged,
    log_bytes: u64,
    /// Next byte of the log to read.
    offset: u64,
    /// The log's first bytes as read; a change means Valgrind rewrote the log (exec).
    prefix: Vec<u8>,
    execs: u32,
    lines_before: u64,
    accesses_before: u64,
    /// Release parsed log bytes every this many (0 = never).
    release_every: u64,
    /// Log bytes before this offset have been released.
    released: u64,
}

/// Bytes of a log's beginning compared to notice a rewrite: the banner, through the
/// `Command:` line, differs between the images before and after an exec.
const PREFIX_LEN: usize = 1024;

impl Follower {
    /// Was the log truncated and rewritten (the process exec'd)?
    fn rewritten(&self) -> Result<bool> {
        let len = self
            .file
            .metadata()
            .map_err(|e| TraceError::io(&self.log, e))?
            .len();
        if len < self.offset {
            return Ok(true);
        }
        if self.prefix.is_empty() {
            return Ok(false);
        }
        let mut now = vec![0u8; self.prefix.len()];
        let n = self
            .file
            .read_at(&mut now, 0)
            .map_err(|e| TraceError::io(&self.log, e))?;
        Ok(n < now.len() || now != self.prefix)
    }

    /// Starts over on a rewritten log, keeping the trace written so far.
    fn restart(&mut self, warnings: &mut Vec<String>) {
        // The old image's last line is the execve call, which Valgrind prints without its
        // newline (the result would follow in the same process): keep it as a syscall.
        if self.decoder.pending().starts_with(b"SYSCALL[")
            && self.decoder.feed(b"\n", &mut self.sink).is_err()
        {
            warnings.push(format!(
                "{}: could not decode the cut syscall line before the exec",
                self.log.display()
            ));
        }
        if let Some(w) = self.decoder.finish(true).ok().flatten() {
            warnings.push(w);
        }
        warnings.push(format!(
            "{}: process {} exec'd and Valgrind rewrote its log; its trace holds the image before the exec \
             (up to the last line read) and then the new one",
            self.log.display(),
            self.pid
        ));
        self.lines_before += self.decoder.lines();
        self.accesses_before += self.decoder.accesses();
        self.decoder = LackeyDecoder::new(&self.log);
        self.offset = 0;
        self.released = 0;
        self.prefix.clear();
        self.execs += 1;
    }

    /// Reads and decodes what is new; true if anything was.
    fn poll(&mut self, buf: &mut [u8], warnings: &mut Vec<String>) -> Result<bool> {
        if self.rewritten()? {
            self.restart(warnings);
        }
        let mut progressed = false;
        loop {
            let n = self
                .file
                .read_at(buf, self.offset)
                .map_err(|e| TraceError::io(&self.log, e))?;
            if n == 0 {
                return Ok(progressed);
            }
            progressed = true;
            if self.prefix.len() < PREFIX_LEN {
                let take = (PREFIX_LEN - self.prefix.len()).min(n);
                self.prefix.extend_from_slice(&buf[..take]);
            }
            self.offset += n as u64;
            self.log_bytes += n as u64;
            if let Err(e) = self.decoder.feed(&buf[..n], &mut self.sink) {
                // Lost the race with a rewrite: the bytes came from the new image.
                if self.rewritten()? {
                    self.restart(warnings);
                    continue;
                }
                return Err(e);
            }
            if let Some(e) = self.sink.error.take() {
                return Err(e);
            }
            if self.release_every > 0 && self.offset - self.released >= self.release_every {
                self.release();
            }
        }
    }

    /// Punches out the parsed part of the log, except its first page (which holds the
    /// prefix compared to notice an exec). The file keeps its size, so offsets stay valid.
    fn release(&mut self) {
        let start = self.released.max(4096);
        let end = self.offset & !4095;
        if end > start && release_range(&self.file, start, end - start).is_ok() {
            self.released = end;
        } else {
            // Not supported here (or nothing to do): stop trying.
            self.release_every = 0;
        }
    }
}

#[cfg(target_os = "linux")]
fn release_range(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use rustix::fs::{FallocateFlags, fallocate};
    fallocate(
        file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    )
    .map_err(std::io::Error::from)
}

#[cfg(not(target_os = "linux"))]
fn release_range(_file: &File, _offset: u64, _len: u64) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Runs `cmd` under lackey with default options; see [`capture_with`].
pub fn capture(out_path: &Path, cmd: &[String]) -> Result<CaptureSummary> {
    capture_with(out_path, cmd, &CaptureOptions::default())
}

fn pid_of_log(name: &str) -> Option<u32> {
    name.strip_prefix("lackey.")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

/// Runs `cmd` under Valgrind lackey, parses the logs online and writes one binary trace per
/// process.
pub fn capture_with(
    out_path: &Path,
    cmd: &[String],
    opts: &CaptureOptions,
) -> Result<CaptureSummary> {
    if cmd.is_empty() {
        return Err(TraceError::InvalidOptions(
            "capture needs a command to run".into(),
        ));
    }
    let shift = page_shift(opts.page_size)?;
    let log_dir = match &opts.log_dir {
        Some(d) => d.clone(),
        None => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            std::env::temp_dir().join(format!("mmulab-capture-{}-{nanos}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&log_dir).map_err(|e| TraceError::io(&log_dir, e))?;
    let mut command = vec![
        opts.valgrind.display().to_string(),
        "--tool=lackey".into(),
        "--trace-mem=yes".into(),
        "--trace-syscalls=yes".into(),
        "--trace-children=yes".into(),
        format!("--log-file={}/lackey.%p.log", log_dir.display()),
        "--".into(),
    ];
    command.extend(cmd.iter().cloned());
    let start = Instant::now();
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            TraceError::Capture(format!(
                "cannot run {:?} (is Valgrind installed?): {e}",
                opts.valgrind
            ))
        })?;
    let root_pid = child.id();
    let release_every = if opts.keep_logs {
        0
    } else {
        opts.release_every_bytes
    };
    let mut followers: Vec<Follower> = Vec::new();
    let mut buf = vec![0u8; 4 << 20];
    let mut status = None;
    let mut warnings = Vec::new();
    loop {
        let exited = match status {
            Some(_) => true,
            None => {
                status = child
                    .try_wait()
                    .map_err(|e| TraceError::Capture(format!("waiting for Valgrind: {e}")))?;
                status.is_some()
            }
        };
        discover(
            &log_dir,
            root_pid,
            out_path,
            shift,
            release_every,
            &mut followers,
        )?;
        let mut progressed = false;
        for f in &mut followers {
            progressed |= f.poll(&mut buf, &mut warnings)?;
        }
        if exited {
            // One last look: a log created just before exit.
            if discover(
                &log_dir,
                root_pid,
                out_path,
                shift,
                release_every,
                &mut followers,
            )? {
                continue;
            }
            if !progressed {
                break;
            }
        } else if !progressed {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let status = status.expect("loop ends after exit");
    let mut processes = Vec::new();
    let mut staged = Vec::new();
    for mut f in followers {
        // A process killed mid-line leaves a cut last line: keep the rest, warn.
        if let Some(w) = f.decoder.finish(true)? {
            warnings.push(w);
        }
        let lines = f.lines_before + f.decoder.lines();
        let accesses = f.accesses_before + f.decoder.accesses();
        let summary = f.sink.writer.finish()?;
        staged.push(f.staged);
        processes.push(CapturedProcess {
            pid: f.pid,
            trace: f.trace,
            log: f.log.clone(),
            log_bytes: f.log_bytes,
            lackey_lines: lines,
            accesses,
            page_refs: summary.header.access_count,
            syscalls: summary.header.syscall_count,
            trace_bytes: summary.bytes,
            execs: f.execs,
        });
        if !opts.keep_logs {
            let _ = std::fs::remove_file(&f.log);
        }
    }
    if !opts.keep_logs && opts.log_dir.is_none() {
        let _ = std::fs::remove_dir(&log_dir);
    }
    processes.sort_by_key(|p| (p.pid != root_pid, p.pid));
    if processes.is_empty() {
        return Err(TraceError::Capture(format!(
            "Valgrind exited ({status}) without writing a lackey log in {}",
            log_dir.display()
        )));
    }
    // Every trace is complete: only now do they take their names (a failed
    // capture leaves nothing at -o).
    for s in staged {
        s.commit()?;
    }
    Ok(CaptureSummary {
        command,
        exit_code: status.code(),
        processes,
        log_dir,
        online: true,
        wall_seconds: start.elapsed().as_secs_f64(),
        warnings,
    })
}

/// Opens logs not followed yet; true if any was new.
fn discover(
    dir: &Path,
    root_pid: u32,
    out: &Path,
    shift: u32,
    release_every: u64,
    followers: &mut Vec<Follower>,
) -> Result<bool> {
    let mut new = false;
    let entries = std::fs::read_dir(dir).map_err(|e| TraceError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| TraceError::io(dir, e))?;
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(pid_of_log) else {
            continue;
        };
        if followers.iter().any(|f| f.pid == pid) {
            continue;
        }
        let log = entry.path();
        let trace = if pid == root_pid {
            out.to_path_buf()
        } else {
            let mut s = out.as_os_str().to_owned();
            s.push(format!(".{pid}"));
            PathBuf::from(s)
        };
        // Writable only to release parsed bytes; read-only otherwise.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(release_every > 0)
            .open(&log)
            .map_err(|e| TraceError::io(&log, e))?;
        let staged = Staged::new(&trace);
        let writer = BinaryWriter::create(staged.path(), shift, pid)?;
        followers.push(Follower {
            pid,
            decoder: LackeyDecoder::new(&log),
            log,
            file,
            sink: LackeyToBinary {
                writer,
                error: None,
            },
            trace,
            staged,
            log_bytes: 0,
            offset: 0,
            prefix: Vec::new(),
            execs: 0,
            lines_before: 0,
            accesses_before: 0,
            release_every,
            released: 0,
        });
        new = true;
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::read_all;
    use crate::lackey::SyscallPhase;
    use std::io::Write;

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    /// Valgrind truncates and rewrites a process's log when it execs: the follower keeps
    /// the old image (with the cut execve line) and reads the new one into the same trace.
    #[test]
    fn a_rewritten_log_is_followed_into_the_same_trace() {
        let dir = std::env::temp_dir().join(format!("mmulab-capture-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("lackey.77.log");
        let out = dir.join("t.mmutrace");
        let _ = std::fs::remove_file(&log);
        append(
            &log,
            "==77== Command: sh -c gzip\n==77== \nI  00401000,4\n L 1fff0000,8\n\
             SYSCALL[77,1](59) sys_execve ( 0x4035e28(/usr/bin/gzip), 0x129960, 0x4035cc8 )",
        );
        let mut followers = Vec::new();
        assert!(discover(&dir, 77, &out, 12, 1 << 20, &mut followers).unwrap());
        let mut buf = vec![0u8; 1 << 16];
        let mut warnings = Vec::new();
        assert!(followers[0].poll(&mut buf, &mut warnings).unwrap());
        // The exec: Valgrind truncates the log and writes the new image's banner and
        // accesses; by the next poll the file is already longer than what was read, so only
        // the changed first bytes (the `Command:` line) tell.
        std::fs::write(
            &log,
            format!(
                "==77== Command: gzip\n==77== \nI  00402000,4\n S 1fff1000,8\n{}",
                "I  00402004,4\n".repeat(20)
            ),
        )
        .unwrap();
        assert!(followers[0].poll(&mut buf, &mut warnings).unwrap());
        let f = followers.pop().unwrap();
        assert_eq!(f.execs, 1);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("exec'd"));
        f.sink.writer.finish().unwrap();
        assert!(!out.exists(), "written beside the target until complete");
        f.staged.commit().unwrap();
        let t = read_all(&out, false).unwrap();
        let pages: Vec<u64> = t.refs.iter().map(|r| r.vpn()).collect();
        let mut want = vec![0x401, 0x1fff0, 0x402, 0x1fff1];
        want.extend([0x402; 20]);
        assert_eq!(pages, want);
        assert_eq!(t.syscalls.len(), 1);
        assert_eq!(
            (t.syscalls[0].1.nr, t.syscalls[0].1.phase),
            (59, SyscallPhase::Call)
        );
        assert_eq!(t.syscalls[0].0, 2, "after the first image's two references");
        std::fs::remove_dir_all(&dir).ok();
    }
}
