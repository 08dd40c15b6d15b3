//! `boxoffice sale`: an operator steers a live sale through `EventService.UpdateSale` on a
//! running server (any node of a cluster): pause, resume, queue everyone, end, or set the
//! admission rate, the hold TTL of new holds and the per-user limit. Prints the sale as it
//! stands after the change.

use boxoffice_proto::v1 as pb;
use clap::Subcommand;

use crate::cluster::{Target, refused};
use crate::exit::Exit;

/// What may change along with any state (or alone, with `set`).
#[derive(clap::Args, Debug, Default)]
pub struct Settings {
    /// Fans admitted from the waiting room per second (0 admits nobody).
    #[arg(long, allow_negative_numbers = true)]
    admit_rate: Option<i64>,
    /// Lifetime in seconds of holds placed from now on.
    #[arg(long, allow_negative_numbers = true)]
    hold_ttl_seconds: Option<i64>,
    /// Most places one fan may hold or own (lowering it takes nothing away).
    #[arg(long, allow_negative_numbers = true)]
    user_limit: Option<i64>,
    /// Seconds after a fan's hold expired before that fan may hold again (0: none): against
    /// bots that hold again as each hold expires.
    #[arg(long, allow_negative_numbers = true)]
    hold_cooldown_seconds: Option<i64>,
    /// An idempotency key: the same command again answers the sale as it is now.
    #[arg(long, default_value = "")]
    idempotency_key: String,
}

/// The subcommands of `boxoffice sale`, each naming its event.
#[derive(Subcommand, Debug)]
pub enum SaleCommand {
    /// Emergency stop: new holds and joins are refused (SALE_PAUSED), nobody is admitted, and
    /// holds that exist may still be paid; their deadlines are extended by the pause.
    Pause(Call),
    /// Go on after a pause or a queue-all (the sale is OPEN again).
    Resume(Call),
    /// Everyone queues: joins are accepted, nobody is admitted.
    QueueAll(Call),
    /// End the sale for good: holds and joins are refused (SALE_ENDED), the line is told.
    End(Call),
    /// Change settings only (at least one of --admit-rate, --hold-ttl-seconds, --user-limit).
    Set(Call),
}

/// One call: the event, the server, and settings to change with it.
#[derive(clap::Args, Debug)]
pub struct Call {
    /// The event.
    event: String,
    #[command(flatten)]
    settings: Settings,
    #[command(flatten)]
    target: Target,
}

/// Runs the subcommand; its exit code (1 if the server refused, with its reason on stderr).
pub async fn run(command: SaleCommand) -> anyhow::Result<Exit> {
    let (state, call) = match command {
        SaleCommand::Pause(c) => (pb::SaleState::Paused, c),
        SaleCommand::Resume(c) => (pb::SaleState::Open, c),
        SaleCommand::QueueAll(c) => (pb::SaleState::QueueAll, c),
        SaleCommand::End(c) => (pb::SaleState::Ended, c),
        SaleCommand::Set(c) => (pb::SaleState::Unspecified, c),
    };
    let mut client = pb::event_service_client::EventServiceClient::new(call.target.authed().await?);
    let s = call.settings;
    let req = pb::UpdateSaleRequest {
        event_id: call.event,
        state: state as i32,
        admit_rate_per_second: s.admit_rate,
        hold_ttl_seconds: s.hold_ttl_seconds,
        per_user_limit: s.user_limit,
        hold_cooldown_seconds: s.hold_cooldown_seconds,
        idempotency_key: s.idempotency_key,
    };
    match client.update_sale(req).await {
        Ok(e) => {
            println!("{}", describe(e.get_ref()));
            Ok(Exit::Ok)
        }
        Err(status) => Ok(refused(&status)),
    }
}

/// One line: the event's sale as it stands.
fn describe(e: &pb::Event) -> String {
    let state = e
        .sale_state()
        .as_str_name()
        .trim_start_matches("SALE_STATE_");
    format!(
        "event {}: sale {state} (since {} Unix ms), admit rate {}/s (since {}), hold TTL {} s, \
         per-user limit {}, hold cool-down {} s",
        e.event_id,
        e.sale_state_changed_at_unix_ms,
        e.admit_rate_per_second,
        e.admit_rate_changed_at_unix_ms,
        e.hold_ttl_seconds,
        e.per_user_limit,
        e.hold_cooldown_seconds
    )
}
