//! The fixed speed workloads of `mmulab bench` and `cargo bench -p
//! mmulab-experiment`: the foundation's (flat memory, protocol `global`)
//! and the same workload on romanescu10's machine (caches, directory,
//! PCAMs, Jetty and the MOSI checker, protocol `unitd`). The sweep's
//! stride is the workload's `stride_bytes` (default one word).

/// What both share: the foundation issue's "Speed" workload.
const WORKLOAD: &str = r#"seed = 1
[machine]
cpus = 16
memory_mb = 256
[workload]
kind = "bench"
threads = 16
private_pages = 256
shared_pages = 64
mprotect_every = 100000
"#;

/// The foundation issue's workload, as a spec: flat memory, `global`.
pub fn foundation_spec() -> String {
    format!("protocol = \"global\"\n{WORKLOAD}")
}

/// The romanescu10 issue's "Speed" workload: the foundation's on preset
/// `x86-simics-2010`, protocol `unitd`.
pub fn unitd_spec() -> String {
    format!("protocol = \"unitd\"\npreset = \"x86-simics-2010\"\n{WORKLOAD}")
}

/// Why a saved `mmulab bench --json` result cannot be compared with.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("bench --compare {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("bench --compare {path}: not JSON: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("bench --compare {path}: `{key}` {why}")]
    Key {
        path: String,
        key: &'static str,
        why: String,
    },
}

/// A saved result's rate, read for `mmulab bench --compare`.
#[derive(Clone, Debug, PartialEq)]
pub struct Reference {
    pub refs_per_second: f64,
}

/// Reads a saved `mmulab bench --json` result and checks that it measured
/// the same workload (`foundation` or `unitd`) at the same stride as this
/// run: a ratio between two workloads would read as a regression that is
/// none. The description (`workload`) is not compared, so that a result
/// saved by an earlier version, whose wording may differ, still serves.
pub fn read_reference(
    path: &str,
    text: &str,
    workload_kind: &str,
    stride_bytes: u64,
) -> Result<Reference, CompareError> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|source| CompareError::Json {
        path: path.to_string(),
        source,
    })?;
    let key = |key: &'static str, why: String| CompareError::Key {
        path: path.to_string(),
        key,
        why,
    };
    let rate = v
        .get("refs_per_second")
        .and_then(serde_json::Value::as_f64)
        .ok_or_else(|| key("refs_per_second", "is missing or not a number".into()))?;
    if !(rate.is_finite() && rate > 0.0) {
        return Err(key(
            "refs_per_second",
            format!("is {rate}, not a positive rate"),
        ));
    }
    match v.get("stride_bytes").and_then(serde_json::Value::as_u64) {
        Some(s) if s == stride_bytes => {}
        Some(s) => {
            return Err(key(
                "stride_bytes",
                format!("is {s}; this run's is {stride_bytes}"),
            ));
        }
        None => return Err(key("stride_bytes", "is missing or not a number".into())),
    }
    // Results saved before `workload_kind` existed tell the workload by
    // their hit rates: only `unitd` has a memory system.
    let kind = match v.get("workload_kind") {
        Some(k) => k
            .as_str()
            .ok_or_else(|| key("workload_kind", "is not a string".into()))?,
        None if v.get("memory").is_some_and(serde_json::Value::is_null) => "foundation",
        None if v.get("memory").is_some() => "unitd",
        None => {
            return Err(key(
                "workload_kind",
                "is missing (and so is `memory`)".into(),
            ));
        }
    };
    if kind != workload_kind {
        return Err(key(
            "workload_kind",
            format!("is `{kind}`; this run's is `{workload_kind}`"),
        ));
    }
    Ok(Reference {
        refs_per_second: rate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(rate: &str, kind: &str, stride: u64) -> String {
        format!(r#"{{"refs_per_second":{rate},"workload_kind":"{kind}","stride_bytes":{stride}}}"#)
    }

    #[test]
    fn reads_a_matching_reference() {
        let r = read_reference("ref.json", &saved("5e7", "unitd", 8), "unitd", 8).unwrap();
        assert_eq!(r.refs_per_second, 5e7);
    }

    #[test]
    fn refuses_another_workload_or_stride_naming_the_key() {
        let e = read_reference("ref.json", &saved("5e7", "unitd", 8), "foundation", 8).unwrap_err();
        assert!(e.to_string().contains("`workload_kind`"), "{e}");
        let e = read_reference("ref.json", &saved("5e7", "unitd", 64), "unitd", 8).unwrap_err();
        assert!(e.to_string().contains("`stride_bytes`"), "{e}");
    }

    /// Results saved before `workload_kind` are told apart by `memory`.
    #[test]
    fn reads_a_reference_saved_without_workload_kind() {
        let flat = r#"{"refs_per_second":4e7,"memory":null,"stride_bytes":8}"#;
        assert!(read_reference("ref.json", flat, "foundation", 8).is_ok());
        let e = read_reference("ref.json", flat, "unitd", 8).unwrap_err();
        assert!(e.to_string().contains("`workload_kind`"), "{e}");
        let caches = r#"{"refs_per_second":4e7,"memory":{"l1d_hit_pct":87.0},"stride_bytes":8}"#;
        assert!(read_reference("ref.json", caches, "unitd", 8).is_ok());
    }

    #[test]
    fn refuses_a_missing_or_zero_rate_and_bad_json() {
        let e = read_reference(
            "ref.json",
            r#"{"workload_kind":"unitd","stride_bytes":8}"#,
            "unitd",
            8,
        )
        .unwrap_err();
        assert!(e.to_string().contains("`refs_per_second`"), "{e}");
        let e = read_reference("ref.json", &saved("0", "unitd", 8), "unitd", 8).unwrap_err();
        assert!(e.to_string().contains("not a positive rate"), "{e}");
        let e = read_reference("ref.json", "{", "unitd", 8).unwrap_err();
        assert!(e.to_string().contains("not JSON"), "{e}");
    }
}
