//! The events the load tools play: the flash sale's layout (40% general admission, three
//! reserved sections of 50-seat rows, priced per section), and its `CreateEvent` request.

use boxoffice_engine::{EventSpec, Layout, RowSpec, SectionId, SectionSpec};
use boxoffice_proto::v1 as pb;

/// The sale's reserved sections: id, name, price in cents.
pub const RESERVED_SECTIONS: [(&str, &str, u64); 3] = [
    ("orch", "Orchestra", 12_000),
    ("mezz", "Mezzanine", 9_000),
    ("balc", "Balcony", 5_500),
];

/// The event the sale plays: 40% GA, the rest over three reserved sections of 50-seat rows.
pub fn sale_event(seats: u32, ttl_ms: u64, per_user_limit: u32) -> EventSpec {
    let ga = seats * 2 / 5;
    let reserved = seats - ga;
    let mut sections = vec![SectionSpec {
        section_id: SectionId::from("floor"),
        name: "Floor (standing)".into(),
        price_cents: 6_500,
        layout: Layout::GeneralAdmission {
            capacity: ga.max(1),
        },
        price_tiers: Vec::new(),
    }];
    for (i, (id, name, price)) in RESERVED_SECTIONS.iter().enumerate() {
        let share = reserved / 3 + u32::from((i as u32) < reserved % 3);
        let rows = rows_of_fifty(share);
        if rows.is_empty() {
            continue;
        }
        sections.push(SectionSpec {
            section_id: SectionId::from(*id),
            name: (*name).into(),
            price_cents: *price,
            layout: Layout::Reserved { rows },
            price_tiers: Vec::new(),
        });
    }
    EventSpec {
        event_id: None,
        name: "Flash sale".into(),
        sections,
        hold_ttl_ms: ttl_ms,
        per_user_limit,
        admit_rate_per_second: 0,
        admission_window_ms: 0,
        sale_opens_at_ms: 0,
        join_pow_difficulty_bits: 0,
        cancellation_deadline_ms: 0,
        transfers_disabled: false,
        presale: Default::default(),
    }
}

/// `seats` seats in rows of 50 (the last one shorter), labelled R1, R2, ...
fn rows_of_fifty(seats: u32) -> Vec<RowSpec> {
    let mut rows = Vec::new();
    let mut left = seats;
    while left > 0 {
        let n = left.min(50);
        rows.push(RowSpec {
            label: format!("R{}", rows.len() + 1),
            seat_count: n,
        });
        left -= n;
    }
    rows
}

/// The `CreateEvent` request of an engine event spec (`event_id` empty: the server picks one;
/// the spec's proof-of-work difficulty as is).
pub fn create_request(
    spec: &EventSpec,
    hold_ttl_seconds: u32,
    admit_rate_per_second: u32,
    admission_window_seconds: u32,
    sale_opens_at_unix_ms: i64,
) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        event_id: spec
            .event_id
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        name: spec.name.clone(),
        sections: spec.sections.iter().map(section_request).collect(),
        hold_ttl_seconds,
        per_user_limit: spec.per_user_limit,
        admit_rate_per_second,
        admission_window_seconds,
        sale_opens_at_unix_ms,
        idempotency_key: String::new(),
        join_pow_difficulty_bits: spec.join_pow_difficulty_bits,
        cancellation_deadline_unix_ms: i64::try_from(spec.cancellation_deadline_ms)
            .unwrap_or(i64::MAX),
        transfers_disabled: spec.transfers_disabled,
        presale_section_ids: Vec::new(),
        presale_ends_at_unix_ms: 0,
        access_codes: Vec::new(),
    }
}

fn section_request(s: &SectionSpec) -> pb::SectionSpec {
    pb::SectionSpec {
        section_id: s.section_id.to_string(),
        name: s.name.clone(),
        price_cents: s.price_cents,
        layout: Some(match &s.layout {
            Layout::GeneralAdmission { capacity } => {
                pb::section_spec::Layout::GeneralAdmissionCapacity(*capacity)
            }
            Layout::Reserved { rows } => pb::section_spec::Layout::Reserved(pb::ReservedLayout {
                rows: rows
                    .iter()
                    .map(|r| pb::RowSpec {
                        label: r.label.clone(),
                        seat_count: r.seat_count,
                    })
                    .collect(),
            }),
        }),
        price_tiers: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sale_event_has_the_asked_number_of_seats() {
        for seats in [4, 10, 200, 10_000, 12_345] {
            let spec = sale_event(seats, 1_000, 4);
            spec.validate().unwrap();
            assert_eq!(
                spec.sections.iter().map(SectionSpec::capacity).sum::<u32>(),
                seats
            );
        }
    }
}
