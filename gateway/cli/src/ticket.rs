//! `boxoffice ticket`: the public key door scanners verify e-ticket codes with, and the offline
//! verification of a code (exit code 1 if it is not genuine).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use boxoffice_gateway::tickets;
use clap::Subcommand;

/// The subcommands of `boxoffice ticket`.
#[derive(Subcommand, Debug)]
pub enum TicketCommand {
    /// Print the public key door scanners verify ticket codes with (hex).
    PublicKey {
        /// The server's data dir (where `ticket-signing.key` is).
        #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
        data_dir: PathBuf,
    },
    /// Verify a ticket code offline; prints what it says, exits 1 if it is not genuine.
    Verify {
        /// The code, as `Ticket.code` shows it.
        code: String,
        /// The public key (hex); without it, the one of `--data-dir`.
        #[arg(long)]
        public_key: Option<String>,
        /// The server's data dir (used when no `--public-key` is given).
        #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
        data_dir: PathBuf,
    },
}

/// Runs the subcommand; its exit code.
pub fn run(command: TicketCommand) -> anyhow::Result<ExitCode> {
    match command {
        TicketCommand::PublicKey { data_dir } => {
            println!(
                "{}",
                tickets::TicketSigner::load(&data_dir)?.public_key_hex()
            );
            Ok(ExitCode::SUCCESS)
        }
        TicketCommand::Verify {
            code,
            public_key,
            data_dir,
        } => verify(&code, public_key, &data_dir),
    }
}

fn verify(code: &str, key: Option<String>, data_dir: &Path) -> anyhow::Result<ExitCode> {
    let hex_key = match key {
        Some(k) => k,
        None => tickets::TicketSigner::load(data_dir)?.public_key_hex(),
    };
    let key = tickets::public_key(&hex_key).map_err(anyhow::Error::from)?;
    match tickets::verify(code, &key) {
        Ok(t) => {
            println!("valid ticket");
            println!("event   {}", t.event_id);
            println!("section {}", t.section_id);
            println!(
                "seat    {}",
                if t.seat_id.is_empty() {
                    "(general admission)"
                } else {
                    &t.seat_id
                }
            );
            println!("order   {}", t.order_id);
            println!("ticket  {}", t.ticket_id);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("NOT VALID: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}
