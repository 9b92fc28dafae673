//! The cluster key: what makes a process a member of the cluster
//! (issue #23, "Cluster membership is cryptographic").
//!
//! `mmulab dsm keygen -o cluster.key` writes 32 random bytes from the
//! kernel (`getrandom`) as 64 hex digits and a newline, in a file created
//! with mode 0600 (it refuses to overwrite one). `cluster.toml` names it
//! (`key_file = "cluster.key"`, relative to the folder of `cluster.toml`),
//! and a site refuses to start when the file grants any right to group or
//! others: a key others can read is no secret, one others can write is no
//! key. The key is the pre-shared key of the Noise handshake
//! ([`super::handshake`]); it never travels.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Bytes of a cluster key (256 bits, Noise's PSK size).
pub const KEY_BYTES: usize = 32;

/// A cluster key. Its `Debug` never prints the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; KEY_BYTES]);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path}: mode {mode:04o} lets group or others at the cluster key; run `chmod 600 {path}` (or make a new key: mmulab dsm keygen -o FILE)"
    )]
    Permissions { path: String, mode: u32 },
    #[error(
        "{path}: not a cluster key: want 64 hex digits (256 bits) on one line, as `mmulab dsm keygen` writes"
    )]
    Format { path: String },
    #[error("{path} exists: a new key would lock every site that uses it out; remove it first")]
    Exists { path: String },
    #[error("no randomness from the kernel: {0}")]
    Random(String),
}

impl ClusterKey {
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> ClusterKey {
        ClusterKey(bytes)
    }

    /// A fresh random key (loopback clusters of tests and the bench).
    pub fn random() -> Result<ClusterKey, KeyError> {
        let mut b = [0u8; KEY_BYTES];
        getrandom::fill(&mut b).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(ClusterKey(b))
    }

    pub fn bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    /// The key as 64 lowercase hex digits (the key file's text).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits (surrounding white space allowed).
    pub fn from_hex(text: &str) -> Option<ClusterKey> {
        let t = text.trim();
        if t.len() != 2 * KEY_BYTES || !t.is_ascii() {
            return None;
        }
        let mut b = [0u8; KEY_BYTES];
        for (i, byte) in b.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(ClusterKey(b))
    }

    /// Reads a key file, refusing one that grants group or others any
    /// right (checked on the open file, so a swap between check and read
    /// cannot slip a different file in).
    pub fn load(path: &Path) -> Result<ClusterKey, KeyError> {
        let shown = path.display().to_string();
        let io = |source| KeyError::Io {
            path: shown.clone(),
            source,
        };
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mode = f.metadata().map_err(io)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions { path: shown, mode });
        }
        let mut text = String::new();
        // A key file is 65 bytes; read a little more to refuse a longer one.
        use std::io::Read;
        (&mut f)
            .take(256)
            .read_to_string(&mut text)
            .map_err(|_| KeyError::Format {
                path: shown.clone(),
            })?;
        ClusterKey::from_hex(&text).ok_or(KeyError::Format { path: shown })
    }

    /// `mmulab dsm keygen -o PATH`: a new random key in a new file, mode
    /// 0600 from its creation (never a moment with wider rights).
    pub fn generate(path: &Path) -> Result<ClusterKey, KeyError> {
        let shown = path.display().to_string();
        let key = ClusterKey::random()?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    KeyError::Exists {
                        path: shown.clone(),
                    }
                } else {
                    KeyError::Io {
                        path: shown.clone(),
                        source: e,
                    }
                }
            })?;
        let io = |source| KeyError::Io {
            path: shown.clone(),
            source,
        };
        // The umask may only have narrowed 0600; make it exactly 0600.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io)?;
        writeln!(f, "{}", key.to_hex()).map_err(io)?;
        f.sync_all().map_err(io)?;
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mirage-key-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn keygen_writes_a_0600_key_that_loads_back_and_never_overwrites() {
        let d = dir("gen");
        let p = d.join("cluster.key");
        let k = ClusterKey::generate(&p).unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        assert_eq!(ClusterKey::load(&p).unwrap(), k);
        assert_eq!(std::fs::read_to_string(&p).unwrap().len(), 65);
        assert!(matches!(
            ClusterKey::generate(&p),
            Err(KeyError::Exists { .. })
        ));
        // Two keys differ (256 random bits).
        let k2 = ClusterKey::generate(&d.join("other.key")).unwrap();
        assert_ne!(k, k2);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_key_readable_by_group_or_others_is_refused_by_name() {
        let d = dir("mode");
        let p = d.join("cluster.key");
        ClusterKey::generate(&p).unwrap();
        for mode in [0o640, 0o604, 0o620, 0o644] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = ClusterKey::load(&p).unwrap_err();
            assert!(matches!(e, KeyError::Permissions { .. }), "{mode:o}: {e}");
            assert!(e.to_string().contains("cluster.key"), "{e}");
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(ClusterKey::load(&p).is_ok());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_file_that_is_not_a_key_is_refused() {
        let d = dir("fmt");
        let p = d.join("bad.key");
        for text in ["", "abc\n", &"zz".repeat(32), &"00".repeat(33)] {
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            assert!(
                matches!(ClusterKey::load(&p), Err(KeyError::Format { .. })),
                "{text:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
