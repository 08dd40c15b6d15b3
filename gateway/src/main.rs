//! `boxoffice`: the command line of the boxoffice engine.
//!
//! - `boxoffice flash-sale`: plays a flash sale (100,000 fans, 10,000 seats by default) against
//!   a real engine in this process and checks every seat afterwards; exits non-zero if any seat
//!   was oversold or double-booked.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod flash_sale;

#[derive(Parser, Debug)]
#[command(
    name = "boxoffice",
    version,
    about = "Flash-sale ticket inventory engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a flash sale end to end against an embedded engine and check every seat.
    FlashSale(flash_sale::FlashSaleArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::FlashSale(args) => {
            let json = args.json.clone();
            match runtime.block_on(flash_sale::run(args)) {
                Ok(report) => {
                    print!("{}", report.table());
                    if let Some(path) = json
                        && let Err(e) = std::fs::write(&path, report.json())
                    {
                        eprintln!("error: cannot write {}: {e}", path.display());
                        return ExitCode::FAILURE;
                    }
                    if report.clean() {
                        println!("result: every seat sold at most once; counters add up");
                        ExitCode::SUCCESS
                    } else {
                        println!("result: FAILED: the sale broke a promise (see above)");
                        ExitCode::from(2)
                    }
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
