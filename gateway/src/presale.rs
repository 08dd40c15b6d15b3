//! `Event`'s presale fields as the contract shows them: the presale sections, their end, and each
//! code's uses to admin keys only. (`CreateEventRequest`'s presale is read in
//! [`crate::convert`]; the rules are the engine's, [`boxoffice_engine::access`].)

use boxoffice_engine::types::{EventView, SectionId};
use boxoffice_proto::v1 as pb;

use crate::convert::ms;

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
