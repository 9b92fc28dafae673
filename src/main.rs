fn main() {
    println!("mmulab");
}
