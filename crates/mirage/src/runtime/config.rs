//! `cluster.toml`: the sites, their addresses and Δ per key.
//!
//! ```toml
//! cluster_id = 1          # both sides of a handshake must agree
//! tick_ns = 1000000       # Δ's tick (default 1 ms); Δ runs on the clock site's clock
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

use crate::core::SiteId;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub cluster_id: u64,
    #[serde(default = "default_tick_ns")]
    pub tick_ns: u64,
    #[serde(rename = "site")]
    pub sites: Vec<SiteConfig>,
    #[serde(default, rename = "key")]
    pub keys: Vec<KeyConfig>,
}

fn default_tick_ns() -> u64 {
    1_000_000
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
}

impl ClusterConfig {
    pub fn parse(text: &str) -> Result<ClusterConfig, ConfigError> {
        let c: ClusterConfig = toml::from_str(text)?;
        c.validate()?;
        Ok(c)
    }

    /// Loopback sites `a`, `b`, … on the given addresses (tests, bench).
    pub fn loopback(cluster_id: u64, addrs: &[SocketAddr]) -> ClusterConfig {
        ClusterConfig {
            cluster_id,
            tick_ns: default_tick_ns(),
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
            "cluster_id = 7\n[[site]]\nname = \"a\"\naddr = \"127.0.0.1:7401\"\n\
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
        let dup = "cluster_id = 7\n[[site]]\nname = \"a\"\naddr = \"127.0.0.1:1\"\n\
                   [[site]]\nname = \"a\"\naddr = \"127.0.0.1:2\"\n";
        assert!(ClusterConfig::parse(dup).is_err());
        assert!(ClusterConfig::parse("cluster_id = 7\nsitez = 1\n").is_err());
    }
}
