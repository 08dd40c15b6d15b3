//! The writer process of the sled power-cut tests: `powercut-sled-child DIR PLAN` follows
//! `PLAN` on the sled database in `DIR` ([`boxoffice_powercut::sled_plan::run`]) and waits to
//! be killed.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, plan] = args.as_slice() else {
        eprintln!("usage: powercut-sled-child DIR PLAN");
        std::process::exit(2);
    };
    boxoffice_powercut::sled_plan::run(std::path::Path::new(dir), plan);
}
