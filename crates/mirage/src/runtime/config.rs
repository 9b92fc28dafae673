//! `cluster.toml`: the sites, their addresses and Δ per key.
//!
//! ```toml
//! cluster_id = 1          # both sides of a handshake must agree
//! tick_ns = 1000000       # Δ's tick (default 1 ms); Δ runs on the clock site's clock
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
use crate::core::SiteId;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

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
