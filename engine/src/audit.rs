//! Audits of a running engine: the reconciliation, invariant checks and order listings. They
//! gather the books (section cores, backstop claims, charges) and hand them to the pure checks of
//! [`reconcile`](crate::reconcile).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::core::SectionCore;
use crate::error::EngineError;
use crate::kernel::Kernel;
use crate::orphans::Orphans;
use crate::payment::PaymentProvider;
use crate::reconcile::{self, Books, Finding};
use crate::section::SectionMsg;
use crate::types::{EventId, OrderView, SectionId};

/// The books of [`Books`], owned.
pub(crate) struct OwnedBooks {
    pub sections: Vec<(String, SectionCore)>,
    pub claims: Vec<(String, Vec<u8>)>,
    pub claims_before: Vec<(String, Vec<u8>)>,
    pub charges: Vec<crate::payment::Charge>,
}

impl OwnedBooks {
    pub(crate) fn borrowed(&self) -> Books<'_> {
        Books {
            sections: &self.sections,
            claims: &self.claims,
            claims_before: &self.claims_before,
            charges: &self.charges,
        }
    }
}

/// Audits of the running engine (see the module's doc): cheap to clone.
#[derive(Clone)]
pub(crate) struct Audit {
    kernel: Arc<Kernel>,
    catalog: Arc<Catalog>,
    payments: Arc<dyn PaymentProvider>,
    orphans: Arc<Orphans>,
}

impl Audit {
    /// The payment provider whose charges the books hold.
    pub(crate) fn payments(&self) -> &Arc<dyn PaymentProvider> {
        &self.payments
    }

    /// The orphaned charges and running checkouts.
    pub(crate) fn orphans(&self) -> &Orphans {
        &self.orphans
    }

    pub(crate) fn new(
        kernel: Arc<Kernel>,
        catalog: Arc<Catalog>,
        payments: Arc<dyn PaymentProvider>,
        orphans: Arc<Orphans>,
    ) -> Audit {
        Audit {
            kernel,
            catalog,
            payments,
            orphans,
        }
    }
}

impl Audit {
    /// A copy of a section's core, from its actor (queued behind everything sent before).
    pub(crate) async fn section_core(
        &self,
        event_id: &EventId,
        section_id: &SectionId,
    ) -> Result<SectionCore, EngineError> {
        let e = self.catalog.entry(event_id)?;
        Ok(*self.kernel.ask(&e, section_id, SectionMsg::Inspect).await?)
    }

    /// Every section's core, named `event/section`.
    async fn section_cores(&self) -> Result<Vec<(String, SectionCore)>, EngineError> {
        let mut out = Vec::new();
        for e in self.catalog.entries() {
            for slot in &e.sections {
                let core = self.section_core(&e.event_id, &slot.section_id).await?;
                out.push((format!("{}/{}", e.event_id, slot.section_id), core));
            }
        }
        Ok(out)
    }

    /// Checks sold seats against orders, payments and the sold-seat backstop, and every
    /// section's counters; returns what does not add up.
    /// Every finding is counted in `boxoffice_reconcile_findings_total` and logged. Changes
    /// nothing (the server's periodic pass, [`Refunds::settle_and_reconcile`](crate::refunds::Refunds::settle_and_reconcile), also refunds).
    pub async fn reconcile(&self) -> Result<Vec<Finding>, EngineError> {
        let books = self.books().await?;
        let findings = reconcile::check(&books.borrowed());
        reconcile::report(&findings, &self.orphans.last_findings);
        Ok(findings)
    }

    /// What reconciliation compares, gathered now: the claims before the sections, then (once
    /// everything the sections queued is durable: in a cluster, committed and applied) after
    /// them, so that a sale in flight is neither a claim without a sale nor a sale without a
    /// claim.
    pub(crate) async fn books(&self) -> Result<OwnedBooks, EngineError> {
        let claims_before = self.kernel.store().sink.claims()?;
        let sections = self.section_cores().await?;
        self.kernel.store().barrier().await?;
        let claims = self.kernel.store().sink.claims()?;
        let charges =
            self.payments
                .charges()
                .await
                .map_err(|e| EngineError::PaymentUnavailable {
                    timeout: false,
                    reason: e.to_string(),
                })?;
        Ok(OwnedBooks {
            sections,
            claims,
            claims_before,
            charges,
        })
    }

    /// Every section whose state breaks an invariant (counts, seats, holds, orders), one line
    /// each: `{event}/{section}: what is wrong`. Empty when all is well.
    /// Also every presale access code whose places held or sold (by the sections' holds) are
    /// over its cap: `{event}: access code {code_id}: ...`.
    pub async fn invariant_violations(&self) -> Result<Vec<String>, EngineError> {
        let cores = self.section_cores().await?;
        let uses = code_uses_of(&cores);
        let mut found: Vec<String> = cores
            .into_iter()
            .filter_map(|(name, core)| {
                core.check_invariants()
                    .err()
                    .map(|d| format!("{name}: {d}"))
            })
            .collect();
        for ((event, code), n) in uses {
            let spec = self.catalog.entry(&event)?.spec.presale.clone();
            match spec.codes.get(code as usize) {
                Some(c) if n <= c.max_uses => {}
                Some(c) => found.push(format!(
                    "{event}: access code {}: {n} places held or sold, over its cap of {}",
                    c.code_id(),
                    c.max_uses
                )),
                None => found.push(format!(
                    "{event}: holds under an unknown access code {code}"
                )),
            }
        }
        Ok(found)
    }

    /// Each presale code whose live count of uses (what the hold path takes and gives back)
    /// differs from its places held or sold by the sections' holds, one line each. Only
    /// meaningful while no hold is on its way (a hold takes its uses just before its section
    /// places it): at the end of a sale, after a restart.
    pub async fn access_code_miscounts(&self) -> Result<Vec<String>, EngineError> {
        let uses = code_uses_of(&self.section_cores().await?);
        let mut found = Vec::new();
        for event in self.catalog.entries() {
            for (i, c) in event.spec.presale.codes.iter().enumerate() {
                let code = u32::try_from(i).unwrap_or(u32::MAX);
                let held = uses
                    .get(&(event.event_id.clone(), code))
                    .copied()
                    .unwrap_or(0);
                let live = self.kernel.redemptions().used(&event.event_id, code);
                if held != live {
                    found.push(format!(
                        "{}: access code {}: {live} uses counted, {held} places held or sold",
                        event.event_id,
                        c.code_id()
                    ));
                }
            }
        }
        Ok(found)
    }

    /// Every order of every section (for reconciliation and tools).
    pub async fn orders(&self) -> Result<Vec<OrderView>, EngineError> {
        Ok(self
            .section_cores()
            .await?
            .into_iter()
            .flat_map(|(_, core)| core.orders())
            .collect())
    }
}

/// Each (event, code)'s places held or sold by the sections' holds.
fn code_uses_of(cores: &[(String, SectionCore)]) -> BTreeMap<(EventId, u32), u32> {
    let mut uses = BTreeMap::new();
    for (_, core) in cores {
        for (code, places) in core.code_uses() {
            *uses.entry((core.event_id().clone(), code)).or_default() += places;
        }
    }
    uses
}
