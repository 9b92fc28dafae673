//! `cargo run --release -p mmulab-mirage --example dsm_bench -- [--quick] [--json]`:
//! what `mmulab dsm bench` prints, until the lead wires the binary.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let json = args.iter().any(|a| a == "--json");
    match mmulab_mirage::runtime::cli::run_bench(quick) {
        Ok(r) if json => println!("{}", r.to_json()),
        Ok(r) => print!("{}", r.render()),
        Err(e) => {
            eprintln!("mmulab dsm bench: {e}");
            std::process::exit(1);
        }
    }
}
