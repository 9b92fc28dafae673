//! `mmulab dsm status`: a site daemon's view as data. The daemon answers
//! the local socket's STATUS with this structure as JSON; `dsm status`
//! prints it as text ([`SiteStatus::render`]) or passes it on
//! (`--json`), so that scripts read named fields instead of parsing text.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// A site's view: itself, its peers, the segments mapped there, the pages
/// it knows lost, and (from the System V layer) its shmids.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SiteStatus {
    /// This site's name in the cluster file.
    pub site: String,
    /// Its index in the cluster file.
    pub id: u16,
    pub cluster: u64,
    /// This daemon's incarnation (a restart under the same name gets a
    /// new one).
    pub incarnation: u64,
    /// Every site of the cluster file, this one included.
    pub sites: Vec<PeerStatus>,
    pub segments: Vec<SegmentStatus>,
    /// Pages known lost here, each with why (its only current copy was at
    /// a dead site, its library died, its request timed out).
    pub lost_pages: Vec<String>,
    /// `sysv` or `mirage` (null from a bare core, without its System V
    /// layer).
    pub semantics: Option<String>,
    pub shmids: Vec<ShmidStatus>,
    /// Entries were left out to fit the reply in one message.
    #[serde(default)]
    pub truncated: bool,
}

/// One site as this one sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub name: String,
    pub addr: String,
    /// `this site`, `dead`, `alive` or `not heard from`.
    pub state: String,
    /// Why it was declared dead.
    pub dead_reason: Option<String>,
    /// This site's connection to it: `connected`, `connection broken` or
    /// `not dialled` (null for this site and a dead one).
    pub connection: Option<String>,
    /// Milliseconds since it was last heard from.
    pub heard_ms_ago: Option<u64>,
    /// Its incarnation, as last heard.
    pub incarnation: Option<u64>,
}

/// A segment mapped at this site.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SegmentStatus {
    pub segment: String,
    /// The site that is its library.
    pub library: String,
    pub pages: usize,
    /// Pages held here with write, read, and no rights.
    pub held_write: usize,
    pub held_read: usize,
    pub held_none: usize,
    /// Attaches at this site, and who holds them (`pid N`, `daemon`).
    pub attaches: usize,
    pub programs: Vec<String>,
}

/// A shmid of this site.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShmidStatus {
    pub shmid: i32,
    pub key: i32,
    /// IPC_RMID was called; it goes with its last detach.
    pub removed: bool,
    pub segment: String,
    pub bytes: usize,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (as octal in the text).
    pub mode: u32,
    pub nattch: usize,
}

impl PeerStatus {
    fn describe(&self) -> String {
        let conn = self.connection.as_deref().unwrap_or("not dialled");
        match self.state.as_str() {
            "dead" => format!("DEAD: {}", self.dead_reason.as_deref().unwrap_or("")),
            "alive" => format!(
                "alive ({conn}; heard {} ms ago, incarnation {})",
                self.heard_ms_ago.unwrap_or(0),
                self.incarnation.unwrap_or(0)
            ),
            "not heard from" => format!("not heard from yet ({conn})"),
            other => other.to_string(),
        }
    }
}

impl SiteStatus {
    /// The text `mmulab dsm status` prints.
    pub fn render(&self) -> String {
        let mut t = self.render_core();
        if let Some(sem) = &self.semantics {
            let why = match sem.as_str() {
                "sysv" => "sysv (a segment lives until IPC_RMID and its last detach)",
                "mirage" => "mirage (the last detach destroys a segment, fleisch89 §2.2)",
                other => other,
            };
            let _ = writeln!(t, "semantics: {why}");
            let _ = writeln!(t, "shmids on this site:");
            if self.shmids.is_empty() {
                let _ = writeln!(t, "  none");
            }
            for e in &self.shmids {
                let _ = writeln!(
                    t,
                    "  shmid {}: key {}{}, segment {}, {} bytes, owner {}:{}, mode {:o}, nattch {}",
                    e.shmid,
                    e.key,
                    if e.removed { " (removed)" } else { "" },
                    e.segment,
                    e.bytes,
                    e.uid,
                    e.gid,
                    e.mode,
                    e.nattch
                );
            }
        }
        if self.truncated {
            let _ = writeln!(t, "(some entries left out to fit one reply)");
        }
        t
    }

    /// The core's part of the text: sites, segments, lost pages.
    pub fn render_core(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "site {} (id {}), cluster {}, incarnation {}",
            self.site, self.id, self.cluster, self.incarnation
        );
        let _ = writeln!(t, "sites:");
        for p in &self.sites {
            let _ = writeln!(t, "  {:<8} {:<22} {}", p.name, p.addr, p.describe());
        }
        let _ = writeln!(t, "segments mapped here:");
        if self.segments.is_empty() {
            let _ = writeln!(t, "  none");
        }
        for s in &self.segments {
            let _ = writeln!(
                t,
                "  segment {} (library {}): {} pages; held here: {} write, {} read, {} none; attaches {} ({})",
                s.segment,
                s.library,
                s.pages,
                s.held_write,
                s.held_read,
                s.held_none,
                s.attaches,
                s.programs.join(", ")
            );
        }
        let _ = writeln!(t, "lost pages:");
        if self.lost_pages.is_empty() {
            let _ = writeln!(t, "  none");
        }
        for why in &self.lost_pages {
            let _ = writeln!(t, "  {why}");
        }
        t
    }

    /// As JSON of at most `max` bytes: entries are left out from the end
    /// of the longest list (marked `truncated`) until it fits.
    pub fn to_json_within(&self, max: usize) -> String {
        let mut s = self.clone();
        loop {
            let j = serde_json::to_string(&s).expect("a status serialises");
            if j.len() <= max {
                return j;
            }
            s.truncated = true;
            let longest = [
                s.shmids.len(),
                s.segments.len(),
                s.lost_pages.len(),
                s.sites.len(),
            ];
            match longest.iter().enumerate().max_by_key(|(_, n)| **n) {
                Some((_, 0)) | None => {
                    // Nothing left to drop: the names alone are too long.
                    s.site.truncate(200);
                    return serde_json::to_string(&s).expect("a status serialises");
                }
                Some((0, _)) => {
                    s.shmids.pop();
                }
                Some((1, _)) => {
                    s.segments.pop();
                }
                Some((2, _)) => {
                    s.lost_pages.pop();
                }
                Some(_) => {
                    s.sites.pop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SiteStatus {
        SiteStatus {
            site: "a".into(),
            id: 0,
            cluster: 7,
            incarnation: 3,
            sites: vec![
                PeerStatus {
                    name: "a".into(),
                    addr: "127.0.0.1:7001".into(),
                    state: "this site".into(),
                    ..Default::default()
                },
                PeerStatus {
                    name: "b".into(),
                    addr: "127.0.0.1:7002".into(),
                    state: "alive".into(),
                    connection: Some("connected".into()),
                    heard_ms_ago: Some(12),
                    incarnation: Some(5),
                    ..Default::default()
                },
            ],
            segments: vec![SegmentStatus {
                segment: "a:1".into(),
                library: "a".into(),
                pages: 2,
                held_write: 1,
                held_read: 0,
                held_none: 1,
                attaches: 1,
                programs: vec!["pid 42".into()],
            }],
            lost_pages: vec![],
            semantics: Some("sysv".into()),
            shmids: vec![ShmidStatus {
                shmid: 65536,
                key: 0x4d49,
                removed: true,
                segment: "a:1".into(),
                bytes: 8192,
                uid: 1000,
                gid: 1000,
                mode: 0o600,
                nattch: 1,
            }],
            truncated: false,
        }
    }

    #[test]
    fn text_shows_every_field_and_json_round_trips() {
        let s = sample();
        let t = s.render();
        for want in [
            "site a (id 0), cluster 7, incarnation 3",
            "  b        127.0.0.1:7002         alive (connected; heard 12 ms ago, incarnation 5)",
            "  segment a:1 (library a): 2 pages; held here: 1 write, 0 read, 1 none; attaches 1 (pid 42)",
            "lost pages:\n  none",
            "semantics: sysv (",
            "  shmid 65536: key 19785 (removed), segment a:1, 8192 bytes, owner 1000:1000, mode 600, nattch 1",
        ] {
            assert!(t.contains(want), "{want:?} not in\n{t}");
        }
        let back: SiteStatus = serde_json::from_str(&s.to_json_within(1 << 16)).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn a_status_too_long_for_one_reply_is_cut_and_says_so() {
        let mut s = sample();
        s.shmids = (0..5000)
            .map(|i| ShmidStatus {
                shmid: i,
                ..s.shmids[0].clone()
            })
            .collect();
        let j = s.to_json_within(64 * 1024);
        assert!(j.len() <= 64 * 1024);
        let back: SiteStatus = serde_json::from_str(&j).unwrap();
        assert!(back.truncated && back.shmids.len() < 5000 && !back.shmids.is_empty());
        assert_eq!(back.sites, s.sites);
        assert!(back.render().contains("left out"));
    }
}
