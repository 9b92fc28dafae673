//! Embeds every file under the repository's `experiments/` in the library,
//! so that `mmulab reproduce PAPER` works from any folder and after
//! `cargo install --path .`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        // Every folder and file is watched by name: an edit deep inside
        // experiments/ must rebuild the embedded copy.
        println!("cargo:rerun-if-changed={}", p.display());
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "toml") {
            out.push(p);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.join("../../experiments");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    let mut code = String::from("pub static EMBEDDED: &[(&str, &str)] = &[\n");
    for f in &files {
        let rel = f.strip_prefix(&root).expect("under root");
        let rel = rel.to_str().expect("UTF-8 path").replace('\\', "/");
        let abs = f.canonicalize().expect("file exists");
        writeln!(
            code,
            "    ({rel:?}, include_str!({:?})),",
            abs.to_str().expect("UTF-8 path")
        )
        .expect("write to String");
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    std::fs::write(out.join("experiments.rs"), code).expect("write OUT_DIR");
}
