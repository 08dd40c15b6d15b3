//! Shared helpers for the integration tests: engines on temporary data dirs with a manual
//! clock, and small event layouts.

use std::path::Path;
use std::sync::Arc;

use boxoffice_engine::{
    Durability, Engine, EngineConfig, EventId, EventSpec, Layout, ManualClock, RowSpec, SectionId,
    SectionSpec,
};

/// The instant every test clock starts at (2026-01-01T00:00:00Z), in ms.
pub const T0_MS: u64 = 1_767_225_600_000;

/// An engine config on `dir` driven by `clock`, with small bounds so tests exercise them.
pub fn config(dir: &Path, clock: &Arc<ManualClock>) -> EngineConfig {
    let mut c = EngineConfig::new(dir);
    c.clock = clock.clone();
    c.durability = Durability::Sync;
    c
}

/// Opens an engine on `dir` with `clock`.
pub async fn open(dir: &Path, clock: &Arc<ManualClock>) -> Engine {
    Engine::open(config(dir, clock))
        .await
        .expect("engine opens")
}

/// A general-admission section.
pub fn ga(id: &str, capacity: u32, price_cents: u64) -> SectionSpec {
    SectionSpec {
        section_id: SectionId::from(id),
        name: id.to_uppercase(),
        price_cents,
        layout: Layout::GeneralAdmission { capacity },
    }
}

/// A reserved section with `rows` rows of `seats` seats, labelled A, B, C...
pub fn reserved(id: &str, rows: u32, seats: u32, price_cents: u64) -> SectionSpec {
    SectionSpec {
        section_id: SectionId::from(id),
        name: id.to_uppercase(),
        price_cents,
        layout: Layout::Reserved {
            rows: (0..rows)
                .map(|r| RowSpec {
                    label: row_label(r),
                    seat_count: seats,
                })
                .collect(),
        },
    }
}

/// Row labels A..Z, then AA, AB, ...
pub fn row_label(r: u32) -> String {
    let letters = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    if r < 26 {
        (letters[r as usize] as char).to_string()
    } else {
        format!(
            "{}{}",
            letters[(r / 26 - 1) as usize % 26] as char,
            letters[(r % 26) as usize] as char
        )
    }
}

/// A keyless hold of `q` places of `event`, best available in any section, for `user`.
pub fn any_section(event: &str, user: &str, q: u32) -> boxoffice_engine::HoldRequest {
    boxoffice_engine::HoldRequest {
        event_id: EventId::from(event),
        user_id: boxoffice_engine::UserId::from(user),
        idempotency_key: String::new(),
        selection: boxoffice_engine::Selection::BestAvailable {
            section: None,
            quantity: q,
        },
    }
}

/// An event spec with the given sections, TTL and per-user limit, open now.
pub fn event(id: &str, sections: Vec<SectionSpec>, ttl_ms: u64, per_user_limit: u32) -> EventSpec {
    EventSpec {
        event_id: Some(EventId::from(id)),
        name: format!("Event {id}"),
        sections,
        hold_ttl_ms: ttl_ms,
        per_user_limit,
        admit_rate_per_second: 0,
        admission_window_ms: 0,
        sale_opens_at_ms: 0,
    }
}

/// A real gRPC server on `127.0.0.1:0` for the integration tests, with a manual clock.
pub mod server {
    use std::sync::Arc;
    use std::time::Duration;

    use boxoffice_client::Bearer;
    use boxoffice_engine::ManualClock;
    use boxoffice_gateway::server::{self, Running, ServerConfig};
    use tonic::transport::Channel;

    /// The admin key of test servers.
    pub const ADMIN: &str = "test-admin-key";
    /// The client key of test servers.
    pub const CLIENT: &str = "test-client-key";
    /// The token secret of test servers.
    pub const SECRET: &[u8] = b"test-token-secret";

    /// A config for a test server on `dir`.
    pub fn config(dir: &std::path::Path, clock: &Arc<ManualClock>) -> ServerConfig {
        let mut c = ServerConfig::new(ADMIN, CLIENT, SECRET);
        c.listen = "127.0.0.1:0".parse().expect("loopback");
        c.metrics_listen = Some("127.0.0.1:0".parse().expect("loopback"));
        c.data_dir = dir.to_path_buf();
        c.clock = clock.clone();
        c.grace = Duration::from_secs(5);
        c
    }

    /// Starts a server and waits for recovery.
    pub async fn start(config: ServerConfig) -> Running {
        let mut r = server::start(config).await.expect("server starts");
        r.wait_ready().await.expect("server recovers");
        r
    }

    /// A channel to a running server.
    pub async fn channel(r: &Running) -> Channel {
        boxoffice_client::connect(&format!("http://{}", r.addr))
            .await
            .expect("connects")
    }

    pub use boxoffice_client::Clients;

    /// Clients with `key` over `ch`.
    pub fn clients(ch: &Channel, key: &str) -> Clients {
        Clients::new(ch, &Bearer::new(key).expect("ascii key"))
    }

    /// The `ErrorInfo.reason` of a status.
    pub fn reason(s: &tonic::Status) -> String {
        boxoffice_gateway::status::reason_of(s).unwrap_or_else(|| format!("<no reason: {s:?}>"))
    }
}
