//! The sold-seat backstop at recovery: every confirmed seat's claim checked against the
//! orders (a claim without its confirm set aside, a missing claim restored), and places of
//! orphaned holds withdrawn.

use super::check::Check;
use super::report::{RecoveryReport, Repair, corrupt};
use crate::hash::HashMap;
use std::collections::BTreeSet;

use crate::codec;
use crate::core::{SectionCore, SectionRecord};
use crate::error::StorageError;
use crate::integrity::Damage;
use crate::store::{LogSink, names};
use crate::types::{EventId, HoldId, SectionId};

/// The backstop, checked against the orders: a claim naming another hold than the order is
/// damage; a claim without a confirm is set aside if every stream is whole (the superblock proves
/// the confirm was never acknowledged) and damage otherwise (its sale's record may be lost);
/// fewer claims than the superblock counted is damage; a confirm without its claim gets it back.
/// `claims`: the table as read; `sold`: each section's sold places' keys
/// ([`SectionCore::all_sold_keys`]).
pub(super) fn recover_backstop(
    sink: &dyn LogSink,
    claims: Vec<(String, Vec<u8>)>,
    sold: Vec<Vec<(String, HoldId)>>,
    check: &mut Check,
    report: &mut RecoveryReport,
) -> Result<(), StorageError> {
    let whole = check.found.damage.is_empty();
    let mut expected: HashMap<String, HoldId> = HashMap::default();
    expected.reserve(sold.iter().map(Vec::len).sum());
    for keys in sold {
        expected.extend(keys);
    }
    check.found.claims = claims.len() as u64;
    check.found.claims_set_aside = sink.claims_set_aside()?.len() as u64;
    if (claims.len() as u64) < check.marks.claims {
        check.found.damage.push(Damage::ClaimsMissing {
            expected: check.marks.claims,
            found: claims.len() as u64,
        });
    }
    for (key, value) in claims {
        let holder = String::from_utf8_lossy(&value).into_owned();
        match expected.remove(&key) {
            Some(hold) if hold.as_str() == holder => {}
            Some(hold) if check.marks.accepted_claims.contains(&key) => {
                check.found.notes.push(format!(
                    "accepted earlier: seat {key} is claimed by {holder} but sold to {hold}"
                ));
            }
            Some(hold) => {
                check.accepted_claims.push(key.clone());
                check.found.damage.push(Damage::ClaimMismatch {
                    key,
                    claimed_by: holder,
                    sold_to: hold.to_string(),
                });
            }
            None if check.marks.accepted_claims.contains(&key) => {
                check.found.notes.push(format!(
                    "accepted earlier: seat {key} is claimed by {holder} with no sale in the log \
                     (kept)"
                ));
            }
            None if whole => {
                tracing::warn!(key = %key, "setting aside a sold-seat claim never acknowledged");
                check.found.actions.push(format!(
                    "table `sold`: set aside the claim of seat {key} by {holder} (its confirm was \
                     never acknowledged: every stream is whole)"
                ));
                report.claims_set_aside += 1;
                check.repairs.push(Repair::SetAside { key });
            }
            None => {
                check.orphans.push((key.clone(), holder.clone()));
                check
                    .found
                    .damage
                    .push(Damage::OrphanClaim { key, hold: holder });
            }
        }
    }
    for (key, hold) in expected {
        check.found.actions.push(format!(
            "table `sold`: claimed seat {key} for {hold} again (its confirm is in the log)"
        ));
        report.claims_restored += 1;
        check.repairs.push(Repair::Restore { key, hold });
    }
    Ok(())
}

/// Accepted damage: the places of sales whose records are lost leave the sale (a live hold on
/// such a seat is released first), recorded in their sections' logs; their claims stay. In a
/// section whose records may be lost (its stream damaged, or claims missing anywhere), every live
/// hold may have been paid for in the lost records: its places leave the sale too, claimed for
/// it. A claim no section can withdraw is kept and remembered as accepted. What was withdrawn
/// and released goes to the change stream too.
pub(super) fn withdraw_orphans(
    sink: &dyn LogSink,
    cores: &mut HashMap<(EventId, SectionId), (SectionCore, u64)>,
    check: &mut Check,
    now_ms: u64,
) -> Result<(), StorageError> {
    let mut left: BTreeSet<String> = check.orphans.iter().map(|(k, _)| k.clone()).collect();
    let orphans = std::mem::take(&mut check.orphans);
    let claims_lost = check
        .found
        .damage
        .iter()
        .any(|d| matches!(d, Damage::ClaimsMissing { .. }));
    let damaged: BTreeSet<String> = check
        .found
        .damage
        .iter()
        .filter_map(Damage::stream)
        .map(str::to_owned)
        .collect();
    for ((event_id, section_id), (core, last_seq)) in cores.iter_mut() {
        let prefix = format!("{event_id}/{section_id}/");
        let name = names::section(event_id, section_id);
        let mine: Vec<(String, String)> = orphans
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .cloned()
            .collect();
        if !mine.is_empty() {
            let records = core.plan_withdrawal(&mine, now_ms).0;
            append_withdrawal(core, last_seq, &name, records, check, &mut left)?;
        }
        if claims_lost || damaged.contains(&name) {
            let records = core.plan_withdraw_live(now_ms);
            append_withdrawal(core, last_seq, &name, records, check, &mut left)?;
        }
    }
    for key in left {
        check.found.actions.push(format!(
            "table `sold`: kept the claim of seat {key}: no section could withdraw it"
        ));
        check.accepted_claims.push(key);
    }
    note_changes(sink, check)
}

/// Appends what accepted damage changed to the change stream, numbered after what it holds and
/// after the superblock's mark (as the live stream goes on), the mark raised over it.
fn note_changes(sink: &dyn LogSink, check: &mut Check) -> Result<(), StorageError> {
    let changes = std::mem::take(&mut check.changes);
    let Some(noted) = crate::changes::Noted::of(&changes) else {
        return Ok(());
    };
    // The stream's summary, whose mark `finish` writes: numbered after the last record the
    // check kept (a torn last record is about to be dropped) and the superblock's mark.
    let at = match check
        .found
        .streams
        .iter()
        .position(|s| s.stream == names::CHANGES)
    {
        Some(at) => at,
        None => {
            check.found.streams.push(crate::integrity::StreamSummary {
                stream: names::CHANGES.to_owned(),
                ..Default::default()
            });
            check.found.streams.len() - 1
        }
    };
    let acknowledged = check.marks.of(names::CHANGES);
    let mut log = crate::store::ChangeLog::open(sink, std::time::Duration::MAX, acknowledged)?;
    log.continue_after(check.found.streams[at].last.max(acknowledged));
    for (seq, bytes) in log.seal(vec![noted]) {
        check.found.streams[at].last = seq;
        check.repairs.push(Repair::Append {
            stream: names::CHANGES.to_owned(),
            seq,
            bytes,
        });
    }
    check.found.actions.push(format!(
        "stream `{}`: told the change stream of {} changes the withdrawals made",
        names::CHANGES,
        changes.len()
    ));
    Ok(())
}

/// Applies withdrawal records to a recovered section, plans their append after `last_seq`, and
/// says what was done. A withdrawn place with no surviving claim (a live hold's) is claimed.
pub(super) fn append_withdrawal(
    core: &mut SectionCore,
    last_seq: &mut u64,
    name: &str,
    records: Vec<SectionRecord>,
    check: &mut Check,
    orphans_left: &mut BTreeSet<String>,
) -> Result<(), StorageError> {
    for record in records {
        core.apply(&record)
            .map_err(|e| corrupt(name, *last_seq + 1, e))?;
        *last_seq += 1;
        check.changes.extend(crate::section::changes_of(
            core,
            std::slice::from_ref(&record),
        ));
        match &record {
            SectionRecord::HoldReleased { hold_id, .. } => check.found.actions.push(format!(
                "stream `{name}`: released hold {hold_id} to take its places out of sale"
            )),
            SectionRecord::PlacesWithdrawn { places, .. } => {
                for w in places {
                    if orphans_left.remove(&w.key) {
                        check.found.actions.push(format!(
                            "stream `{name}`: withdrew seat {} from sale (claimed by {}, whose \
                             sale record is lost: its fan may hold a ticket)",
                            w.key, w.holder
                        ));
                    } else {
                        check.found.actions.push(format!(
                            "stream `{name}`: withdrew seat {} of live hold {} from sale (records \
                             were lost: it may have been paid for)",
                            w.key, w.holder
                        ));
                        check.repairs.push(Repair::Restore {
                            key: w.key.clone(),
                            hold: HoldId::from(w.holder.as_str()),
                        });
                    }
                }
            }
            _ => {}
        }
        check.repairs.push(Repair::Append {
            stream: name.to_owned(),
            seq: *last_seq,
            bytes: codec::encode(&record),
        });
    }
    if let Some(s) = check.found.streams.iter_mut().find(|s| s.stream == name) {
        s.last = *last_seq;
    }
    Ok(())
}
