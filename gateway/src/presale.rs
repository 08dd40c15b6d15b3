//! The presale as the contract carries it: `CreateEventRequest`'s presale fields made into the
//! engine's [`Presale`] (codes checked, then kept as digests only), and `Event`'s presale
//! fields (each code's uses to admin keys only). The rules are the engine's
//! ([`boxoffice_engine::access`]).

use boxoffice_engine::Rejection;
use boxoffice_engine::access::{AccessCode, Presale, check_code};
use boxoffice_engine::types::{EventView, SectionId};
use boxoffice_proto::v1 as pb;

/// The presale of a `CreateEventRequest`: its sections, its end, its codes (each checked, then
/// only its digest kept). The engine checks the rest against the event's sections.
pub(crate) fn of_request(
    section_ids: Vec<String>,
    ends_at_unix_ms: i64,
    codes: Vec<pb::AccessCode>,
) -> Result<Presale, Rejection> {
    let time = |field: &str, v: i64| {
        u64::try_from(v).map_err(|_| Rejection::invalid(field, "a time after 1970 (or 0)"))
    };
    let ends_at_ms = time("presale_ends_at_unix_ms", ends_at_unix_ms)?;
    let mut kept = Vec::with_capacity(codes.len());
    for (i, c) in codes.into_iter().enumerate() {
        let field = |f: &str| format!("access_codes[{i}].{f}");
        check_code(&field("code"), &c.code)?;
        kept.push(AccessCode::new(
            &c.code,
            c.max_uses,
            time(&field("valid_from_unix_ms"), c.valid_from_unix_ms)?,
            time(&field("valid_until_unix_ms"), c.valid_until_unix_ms)?,
            c.section_ids.into_iter().map(SectionId).collect(),
        ));
    }
    Ok(Presale {
        sections: section_ids.into_iter().map(SectionId).collect(),
        ends_at_ms,
        codes: kept,
    })
}

/// Unix ms as the contract's int64.
fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `Event`'s presale fields: its sections, its end, and (to an admin key only) each code's id,
/// terms and uses now.
pub(crate) fn fill(out: &mut pb::Event, e: &EventView, admin: bool, now_ms: u64) {
    let p = &e.spec.presale;
    out.presale_section_ids = p.sections.iter().map(|s| s.0.clone()).collect();
    out.presale_ends_at_unix_ms = ms(p.ends_at_ms);
    for s in &mut out.sections {
        s.access_code_required = p.requires(&SectionId(s.section_id.clone()), now_ms);
    }
    if !admin {
        return;
    }
    out.access_codes = p
        .codes
        .iter()
        .enumerate()
        .map(|(i, c)| pb::AccessCodeUsage {
            code_id: c.code_id().to_owned(),
            max_uses: c.max_uses,
            uses: e.access_code_uses.get(i).copied().unwrap_or(0),
            valid_from_unix_ms: ms(c.valid_from_ms),
            valid_until_unix_ms: ms(c.valid_until_ms),
            section_ids: c.section_ids.iter().map(|s| s.0.clone()).collect(),
        })
        .collect();
}
