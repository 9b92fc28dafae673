//! `cargo run -p mmulab-mirage --example reproduce -- [--quick] [--out DIR]`:
//! what `mmulab reproduce fleisch89` prints, until the binary wires it in.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let mut progress = |line: &str| eprintln!("{line}");
    match mmulab_mirage::cli::run_reproduce(out.as_deref(), quick, &mut progress) {
        Ok(report) => print!("{}", report.text),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
