//! A program whose site daemon is gone (issue #23, finding 6).
//!
//! On the userfaultfd path the daemon reads the program's faults from the
//! program's own userfaultfd (passed at the first attach). When the daemon
//! died or stopped, nobody read them: a faulting thread slept in the
//! kernel's `handle_userfault` forever. Closing the fd is no way out (the
//! kernel would then fill missing pages from the segment's memfd: holes
//! read as zeros, a stale page with no fault). So when the daemon's socket
//! closes, the service thread takes the fd over:
//! - it wakes every thread asleep on a DSM mapping (the daemon had read
//!   their faults and took them along); each retries its access and
//!   faults again, now to this thread;
//! - each fault then gets what the mprotect path gives: one stderr line
//!   ("the site daemon is gone") and a SIGBUS at that address (the page
//!   is replaced by a mapping past the end of an empty memfd, then the
//!   faulter is woken). Pages held here stay readable and writable
//!   without a fault, as on the mprotect path.
//!
//! The daemon's socket closes at once when its process dies (kill -9
//! included) or exits, so the next fault fails at once, well within the
//! heartbeat timeout. A daemon stopped by SIGSTOP (or hung) keeps its
//! socket open, but goes silent: the service thread hears no `ALIVE` for
//! the peers' timeout, shuts the socket and comes here the same way
//! (docs/dsm.md, "A stopped daemon").

use crate::uffd::{self, Uffd};

/// Serves `u`'s faults after the daemon is gone, until the fd fails.
/// `maps()` lists the attach mappings (base, len) now.
pub(crate) fn serve_faults(u: &Uffd, maps: impl Fn() -> Vec<(usize, usize)>) {
    let ps = crate::page_size();
    for (base, len) in maps() {
        u.wake(base, len);
    }
    loop {
        let (addr, _) = match u.next_fault(200) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(_) => return,
        };
        let page = addr & !(ps - 1);
        if maps()
            .iter()
            .any(|&(base, len)| page >= base && page < base + len)
        {
            eprintln!("mmulab dsm: page at {page:#x}: the site daemon is gone; SIGBUS");
            uffd::poison(page, ps);
        }
        u.wake(page, ps);
    }
}
