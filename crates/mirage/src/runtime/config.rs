//! `cluster.toml`: the sites, their addresses and Δ per key.
//!
//! ```toml
//! cluster_id = 1          # both sides of a handshake must agree
//! tick_ns = 1000000       # Δ's tick (default 1 ms); Δ runs on the clock site's clock
//! semantics = "sysv"      # or "mirage": when a segment dies (default "sysv")
//! socket_mode = 0o600     # the local socket's mode (default 0600; 0660 with `group`)
//! group = "dsm"           # optional: the local socket's group (name or gid)
//! key_file = "cluster.key"  # `mmulab dsm keygen -o cluster.key`; relative to this file
//! # insecure = true       # instead of key_file: no authentication (warned at every start)
//! max_peers_pending = 64  # inbound connections not yet authenticated (default 64)
//! [[site]]
//! name = "a"
//! addr = "127.0.0.1:7401"
//! [[site]]
//! name = "b"
//! addr = "127.0.0.1:7402"
//! socket = "/run/dsm-b.sock"  # optional: the local socket for programs
//! [[key]]
//! key = 1234
//! delta_ticks = 2         # default 0
//! ```
//!
//! A site's id is its index in the list; the first site keeps the key
//! directory.
//!
//! Exactly one of `key_file` and `insecure = true` must be given: a
//! cluster without a key runs only when its file says so.

use super::key::{ClusterKey, KeyError};
use crate::core::{CoreConfig, Lifetime, SiteId};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// When a segment dies, and so what `shmget`/`shmctl` see (docs/dsm.md,
/// "System V as Linux gives it").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Semantics {
    /// Linux's System V rules: a segment lives until `IPC_RMID` and its
    /// last detach, on every site.
    #[default]
    Sysv,
    /// fleisch89 §2.2: the last detach, on any site, destroys the segment.
    Mirage,
}

impl Semantics {
    pub fn lifetime(self) -> Lifetime {
        match self {
            Semantics::Sysv => Lifetime::RemovedAndDetached,
            Semantics::Mirage => Lifetime::LastDetach,
        }
    }
}

/// A file mode in `cluster.toml`: an integer (`0o660`, `432`) or an octal
/// string (`"0660"`, `"660"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ModeText", into = "u32")]
pub struct FileMode(pub u32);

#[derive(Deserialize)]
#[serde(untagged)]
enum ModeText {
    Int(i64),
    Text(String),
}

impl TryFrom<ModeText> for FileMode {
    type Error = String;
    fn try_from(m: ModeText) -> Result<FileMode, String> {
        let v = match m {
            ModeText::Int(i) => i,
            ModeText::Text(t) => {
                let d = t.trim().trim_start_matches("0o");
                i64::from_str_radix(d, 8)
                    .map_err(|_| format!("socket_mode `{t}` is not an octal mode"))?
            }
        };
        if !(0..=0o777).contains(&v) {
            return Err(format!(
                "socket_mode {v:#o} is not a permission mode (0 to 0777)"
            ));
        }
        Ok(FileMode(v as u32))
    }
}

impl From<FileMode> for u32 {
    fn from(m: FileMode) -> u32 {
        m.0
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub cluster_id: u64,
    #[serde(default = "default_tick_ns")]
    pub tick_ns: u64,
    /// The cluster key file (`mmulab dsm keygen -o FILE`); a relative path
    /// is relative to the folder of `cluster.toml`. Its key authenticates
    /// every connection between sites ([`super::handshake`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// No authentication: anyone who reaches a site's port is a member.
    /// Default false; a site warns at every start when it is set.
    #[serde(default, skip_serializing_if = "is_false")]
    pub insecure: bool,
    /// Inbound connections that have not finished the handshake, at most
    /// (default 64); one past it is closed at once.
    #[serde(default = "default_max_peers_pending")]
    pub max_peers_pending: u32,
    #[serde(rename = "site")]
    pub sites: Vec<SiteConfig>,
    #[serde(default, rename = "key")]
    pub keys: Vec<KeyConfig>,
    /// When a segment dies (default: Linux's System V rules).
    #[serde(default)]
    pub semantics: Semantics,
    /// The local socket's mode. Default 0600 (the daemon's own user), or
    /// 0660 when `group` is set. 0666 lets every local user connect; each
    /// call is still checked against the segment's owner and mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_mode: Option<FileMode>,
    /// The local socket's group (a name or a numeric gid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The key itself: read from `key_file` by [`ClusterConfig::load`], or
    /// random for a loopback cluster. Never serialized.
    #[serde(skip)]
    pub cluster_key: Option<ClusterKey>,
}

fn default_tick_ns() -> u64 {
    1_000_000
}

fn default_max_peers_pending() -> u32 {
    64
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteConfig {
    pub name: String,
    pub addr: SocketAddr,
    /// The local socket programs on this site reach the daemon through
    /// (`libmmulab_shm.so`, `mmulab dsm run`, `mmulab dsm status`).
    /// Default: `$XDG_RUNTIME_DIR` or the temporary directory,
    /// `mmulab-dsm-<cluster_id>-<name>.sock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<std::path::PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    pub key: i32,
    #[serde(default)]
    pub delta_ticks: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("key_file: {0}")]
    Key(#[from] KeyError),
}

impl ClusterConfig {
    /// Parses and checks the text of a `cluster.toml` (the key file, if
    /// named, is not read: see [`ClusterConfig::load`]).
    pub fn parse(text: &str) -> Result<ClusterConfig, ConfigError> {
        let c: ClusterConfig = toml::from_str(text)?;
        c.validate()?;
        Ok(c)
    }

    /// Reads `cluster.toml` at `path` and the key file it names.
    pub fn load(path: &Path) -> Result<ClusterConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Invalid(format!("cannot read it: {e}")))?;
        let mut c = ClusterConfig::parse(&text)?;
        if let Some(k) = &c.key_file {
            let dir = path.parent().unwrap_or(Path::new("."));
            c.cluster_key = Some(ClusterKey::load(&dir.join(k))?);
        }
        Ok(c)
    }

    /// Loopback sites `a`, `b`, … on the given addresses (tests, bench),
    /// with a fresh random cluster key: authenticated, as a real cluster.
    pub fn loopback(cluster_id: u64, addrs: &[SocketAddr]) -> ClusterConfig {
        ClusterConfig {
            cluster_id,
            tick_ns: default_tick_ns(),
            key_file: None,
            insecure: false,
            max_peers_pending: default_max_peers_pending(),
            cluster_key: Some(ClusterKey::random().expect("the kernel's randomness")),
            sites: addrs
                .iter()
                .enumerate()
                .map(|(i, a)| SiteConfig {
                    name: ((b'a' + i as u8) as char).to_string(),
                    addr: *a,
                    socket: None,
                })
                .collect(),
            keys: Vec::new(),
            semantics: Semantics::default(),
            socket_mode: None,
            group: None,
        }
    }

    /// The protocol core's configuration for this cluster.
    pub fn core_config(&self) -> CoreConfig {
        CoreConfig {
            tick_ns: self.tick_ns,
            lifetime: self.semantics.lifetime(),
            ..CoreConfig::default()
        }
    }

    /// The local socket's mode (see [`ClusterConfig::socket_mode`]).
    pub fn effective_socket_mode(&self) -> u32 {
        match (self.socket_mode, &self.group) {
            (Some(m), _) => m.0,
            (None, Some(_)) => 0o660,
            (None, None) => 0o600,
        }
    }

    /// The local socket's group id, if `group` is set.
    pub fn socket_gid(&self) -> Result<Option<u32>, ConfigError> {
        let Some(g) = &self.group else {
            return Ok(None);
        };
        if let Ok(gid) = g.parse::<u32>() {
            return Ok(Some(gid));
        }
        match nix::unistd::Group::from_name(g) {
            Ok(Some(grp)) => Ok(Some(grp.gid.as_raw())),
            Ok(None) => Err(ConfigError::Invalid(format!(
                "group `{g}`: no such group on this machine"
            ))),
            Err(e) => Err(ConfigError::Invalid(format!("group `{g}`: {e}"))),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.sites.is_empty() || self.sites.len() > u16::MAX as usize {
            return Err(ConfigError::Invalid("one site at least".into()));
        }
        if self.tick_ns == 0 {
            return Err(ConfigError::Invalid("tick_ns must be > 0".into()));
        }
        if self.max_peers_pending == 0 {
            return Err(ConfigError::Invalid(
                "max_peers_pending must be > 0 (no peer could ever connect)".into(),
            ));
        }
        match (&self.key_file, self.insecure) {
            (Some(_), true) => {
                return Err(ConfigError::Invalid(
                    "key_file and insecure = true are both set: choose one".into(),
                ));
            }
            (None, false) if self.cluster_key.is_none() => {
                return Err(ConfigError::Invalid(
                    "no key_file: make one with `mmulab dsm keygen -o cluster.key` and add key_file = \"cluster.key\" (or insecure = true to run without authentication)".into(),
                ));
            }
            _ => {}
        }
        for (i, s) in self.sites.iter().enumerate() {
            if self.sites[..i].iter().any(|o| o.name == s.name) {
                return Err(ConfigError::Invalid(format!("site `{}` twice", s.name)));
            }
        }
        for (i, k) in self.keys.iter().enumerate() {
            if self.keys[..i].iter().any(|o| o.key == k.key) {
                return Err(ConfigError::Invalid(format!("key {} twice", k.key)));
            }
        }
        self.socket_gid()?;
        Ok(())
    }

    pub fn site_id(&self, name: &str) -> Option<SiteId> {
        self.sites
            .iter()
            .position(|s| s.name == name)
            .map(|i| SiteId(i as u16))
    }

    pub fn name(&self, site: SiteId) -> &str {
        self.sites
            .get(site.0 as usize)
            .map_or("?", |s| s.name.as_str())
    }

    /// The local socket of a site (see [`SiteConfig::socket`]).
    pub fn socket_path(&self, site: SiteId) -> std::path::PathBuf {
        let s = &self.sites[site.0 as usize];
        s.socket
            .clone()
            .unwrap_or_else(|| super::local::default_socket_path(self.cluster_id, &s.name))
    }

    /// Δ of a key, in ticks (default 0).
    pub fn delta_ticks(&self, key: i32) -> u32 {
        self.keys
            .iter()
            .find(|k| k.key == key)
            .map_or(0, |k| k.delta_ticks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sites_and_delta_per_key() {
        let c = ClusterConfig::parse(
            "cluster_id = 7\ninsecure = true\n[[site]]\nname = \"a\"\naddr = \"127.0.0.1:7401\"\n\
             [[site]]\nname = \"b\"\naddr = \"[::1]:7402\"\n[[key]]\nkey = 5\ndelta_ticks = 3\n",
        )
        .unwrap();
        assert_eq!(c.site_id("b"), Some(SiteId(1)));
        assert_eq!(c.delta_ticks(5), 3);
        assert_eq!(c.delta_ticks(6), 0);
        assert_eq!(c.tick_ns, 1_000_000);
    }

    #[test]
    fn rejects_duplicate_sites_and_unknown_fields() {
        let dup = "cluster_id = 7\ninsecure = true\n[[site]]\nname = \"a\"\naddr = \"127.0.0.1:1\"\n\
                   [[site]]\nname = \"a\"\naddr = \"127.0.0.1:2\"\n";
        assert!(ClusterConfig::parse(dup).is_err());
        assert!(ClusterConfig::parse("cluster_id = 7\nsitez = 1\n").is_err());
    }

    const ONE: &str =
        "cluster_id = 7\ninsecure = true\n[[site]]\nname = \"a\"\naddr = \"127.0.0.1:1\"\n";

    #[test]
    fn semantics_default_to_system_v_and_mirage_is_fleischs_rule() {
        let c = ClusterConfig::parse(ONE).unwrap();
        assert_eq!(c.semantics, Semantics::Sysv);
        assert_eq!(c.core_config().lifetime, Lifetime::RemovedAndDetached);
        let m = ClusterConfig::parse(&format!("semantics = \"mirage\"\n{ONE}")).unwrap();
        assert_eq!(m.core_config().lifetime, Lifetime::LastDetach);
        let bad = ClusterConfig::parse(&format!("semantics = \"posix\"\n{ONE}"));
        let e = bad.unwrap_err().to_string();
        assert!(e.contains("semantics") || e.contains("posix"), "{e}");
    }

    #[test]
    fn socket_mode_defaults_to_0600_or_0660_with_a_group_and_rejects_non_modes() {
        assert_eq!(
            ClusterConfig::parse(ONE).unwrap().effective_socket_mode(),
            0o600
        );
        let g = ClusterConfig::parse(&format!("group = \"0\"\n{ONE}")).unwrap();
        assert_eq!(g.effective_socket_mode(), 0o660);
        assert_eq!(g.socket_gid().unwrap(), Some(0));
        for text in [
            "socket_mode = 0o666",
            "socket_mode = \"0666\"",
            "socket_mode = 438",
        ] {
            let c = ClusterConfig::parse(&format!("{text}\n{ONE}")).unwrap();
            assert_eq!(c.effective_socket_mode(), 0o666, "{text}");
        }
        for text in [
            "socket_mode = 0o1777",
            "socket_mode = \"rw\"",
            "socket_mode = -1",
        ] {
            let e = ClusterConfig::parse(&format!("{text}\n{ONE}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("socket_mode"), "{text}: {e}");
        }
        let e = ClusterConfig::parse(&format!("group = \"no-such-group-xyz\"\n{ONE}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("group `no-such-group-xyz`"), "{e}");
    }

    const SITE: &str = "[[site]]\nname = \"a\"\naddr = \"127.0.0.1:1\"\n";

    #[test]
    fn a_cluster_needs_a_key_file_or_insecure_but_not_both() {
        let e = ClusterConfig::parse(&format!("cluster_id = 1\n{SITE}")).unwrap_err();
        assert!(e.to_string().contains("mmulab dsm keygen"), "{e}");
        let both = format!("cluster_id = 1\nkey_file = \"k\"\ninsecure = true\n{SITE}");
        assert!(ClusterConfig::parse(&both).is_err());
        let c = ClusterConfig::parse(&format!("cluster_id = 1\nkey_file = \"k\"\n{SITE}")).unwrap();
        assert_eq!(c.max_peers_pending, 64);
        assert!(c.cluster_key.is_none(), "parse never reads the key");
        let zero = format!("cluster_id = 1\ninsecure = true\nmax_peers_pending = 0\n{SITE}");
        assert!(ClusterConfig::parse(&zero).is_err());
    }

    #[test]
    fn load_reads_the_key_file_beside_the_config() {
        let d = std::env::temp_dir().join(format!("mirage-cfg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let k = ClusterKey::generate(&d.join("cluster.key")).unwrap();
        let p = d.join("cluster.toml");
        std::fs::write(
            &p,
            format!("cluster_id = 1\nkey_file = \"cluster.key\"\n{SITE}"),
        )
        .unwrap();
        assert_eq!(ClusterConfig::load(&p).unwrap().cluster_key, Some(k));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            d.join("cluster.key"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let e = ClusterConfig::load(&p).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
