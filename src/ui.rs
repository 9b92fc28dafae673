//! What the binary shows around a command's output: progress on a terminal,
//! a clean stop on Ctrl-C, the width to wrap tables to.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// `-q/--quiet`: no progress and no notes on stderr (results, warnings
/// and errors still print).
static QUIET: AtomicBool = AtomicBool::new(false);

pub fn set_quiet(q: bool) {
    QUIET.store(q, Ordering::Relaxed);
}

pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// A note for the user on stderr (what was written where), unless quiet.
pub fn note(msg: impl std::fmt::Display) {
    if !quiet() {
        eprintln!("{msg}");
    }
}

/// A progress bar of `len` steps on stderr. Hidden when stderr is not a
/// terminal (indicatif draws nothing there) or under `--quiet`; its
/// steady tick keeps the elapsed time moving through long steps.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    if quiet() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb.enable_steady_tick(Duration::from_millis(250));
    pb
}

/// A spinner with a message, for work whose length is not known up front.
/// On a terminal it shows the message and the time so far; elsewhere it is
/// hidden, and [`Spinner::step`] prints each message as a line instead, so
/// that a log still shows where a long run is (unless quiet).
pub struct Spinner {
    pb: ProgressBar,
    lines: bool,
}

impl Spinner {
    pub fn new(what: &str) -> Spinner {
        let tty = std::io::stderr().is_terminal();
        if quiet() || !tty {
            return Spinner {
                pb: ProgressBar::hidden(),
                lines: !quiet(),
            };
        }
        let pb = ProgressBar::new_spinner();
        pb.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("template"));
        pb.set_message(what.to_string());
        pb.enable_steady_tick(Duration::from_millis(200));
        Spinner { pb, lines: false }
    }

    pub fn step(&self, msg: &str) {
        if self.lines {
            eprintln!("{msg}");
        } else {
            self.pb.set_message(msg.to_string());
        }
    }

    pub fn finish(&self) {
        self.pb.finish_and_clear();
    }
}

/// Raised by the first Ctrl-C (SIGINT): long commands stop at their next
/// check and keep what they have.
static STOP: OnceLock<Arc<AtomicBool>> = OnceLock::new();

extern "C" fn on_sigint(_: nix::libc::c_int) {
    // Async-signal-safe: an atomic load of the initialised cell and an
    // atomic store.
    if let Some(flag) = STOP.get() {
        flag.store(true, Ordering::SeqCst);
    }
}

/// Installs the Ctrl-C handler and returns its flag. The handler is reset
/// by its first delivery (SA_RESETHAND), so a second Ctrl-C kills the
/// process at once, as without it.
pub fn stop_on_ctrl_c() -> Arc<AtomicBool> {
    let flag = STOP
        .get_or_init(|| Arc::new(AtomicBool::new(false)))
        .clone();
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_sigint),
        SaFlags::SA_RESETHAND | SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only touches atomics (see on_sigint).
    if let Err(e) = unsafe { sigaction(Signal::SIGINT, &action) } {
        note(format!("note: Ctrl-C will not stop cleanly ({e})"));
    }
    flag
}

/// Whether Ctrl-C was pressed.
pub fn stopped() -> bool {
    STOP.get().is_some_and(|f| f.load(Ordering::SeqCst))
}

/// The width to lay text out in: the terminal's, or 100 columns when
/// stdout is not a terminal.
pub fn width() -> usize {
    let out = std::io::stdout();
    if out.is_terminal()
        && let Ok(ws) = rustix::termios::tcgetwinsize(&out)
        && ws.ws_col > 0
    {
        return ws.ws_col as usize;
    }
    100
}
