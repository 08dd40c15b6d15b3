//! Reconciliation: sold seats against orders, payments and the backstop.
//!
//! Checks that every section's counters add up (`available + held + sold == capacity` and the
//! core's full consistency check), that every sold place has exactly one sold-seat claim and
//! every claim a sale, that every order is paid by exactly one captured charge of its amount,
//! and that every captured charge belongs to an order (else it should have been refunded).

use crate::core::{RefundDue, SectionCore};
use crate::hash::{HashMap, HashSet};
use crate::payment::{Charge, ChargeStatus};
use crate::types::OrderView;

/// Something that does not add up, with what is needed to act on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// A section's counters or seat states are inconsistent.
    SectionInconsistent {
        /// `event/section`.
        section: String,
        /// What the check found.
        detail: String,
    },
    /// A sold place has no sold-seat claim in the backstop.
    SoldWithoutClaim {
        /// The backstop key.
        key: String,
    },
    /// A sold-seat claim has no confirmed hold behind it.
    ClaimWithoutSale {
        /// The backstop key.
        key: String,
    },
    /// An order whose payment is missing, not captured, or of another amount.
    OrderNotPaid {
        /// The order.
        order_id: String,
        /// Its payment id.
        payment_id: String,
        /// What is wrong.
        detail: String,
    },
    /// One payment pays several orders.
    PaymentOnSeveralOrders {
        /// The payment.
        payment_id: String,
        /// The orders.
        orders: Vec<String>,
    },
    /// A captured charge no order refers to (neither sold nor refunded).
    CapturedWithoutOrder {
        /// The payment.
        payment_id: String,
        /// Its amount.
        amount_cents: u64,
    },
    /// Tickets were given back (`CancelTickets`) and the provider has no refund of them (the
    /// refund failed and was not retried yet), or one of another amount.
    RefundMissing {
        /// The order.
        order_id: String,
        /// The payment the order was paid with (what is refunded).
        payment_id: String,
        /// The refund's idempotency key with the provider.
        refund_key: String,
        /// What is owed, cents.
        amount_cents: u64,
        /// Whose money it is.
        user_id: String,
        /// What is wrong.
        detail: String,
    },
}

impl Finding {
    /// Every [`Finding::kind`], for metrics labels made ready before the first finding.
    pub const KINDS: [&'static str; 7] = [
        "section_inconsistent",
        "sold_without_claim",
        "claim_without_sale",
        "order_not_paid",
        "payment_on_several_orders",
        "captured_without_order",
        "refund_missing",
    ];

    /// A short label for metrics (one of [`Finding::KINDS`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Finding::SectionInconsistent { .. } => "section_inconsistent",
            Finding::SoldWithoutClaim { .. } => "sold_without_claim",
            Finding::ClaimWithoutSale { .. } => "claim_without_sale",
            Finding::OrderNotPaid { .. } => "order_not_paid",
            Finding::PaymentOnSeveralOrders { .. } => "payment_on_several_orders",
            Finding::CapturedWithoutOrder { .. } => "captured_without_order",
            Finding::RefundMissing { .. } => "refund_missing",
        }
    }
}

/// What reconciliation compares: every section's state, every backstop claim, every charge.
pub(crate) struct Books<'a> {
    /// (`event/section`, its core).
    pub sections: &'a [(String, SectionCore)],
    /// Every sold-seat claim (key, holder), read after `sections` were gathered and everything
    /// queued before was durable (a barrier): every seat `sections` show sold has its claim here.
    pub claims: &'a [(String, Vec<u8>)],
    /// The claims as read before `sections` were gathered: each was made by a sale `sections`
    /// show. (A sale made while the books are gathered is in `claims` but may be missing from
    /// `sections`; a sale not yet durable is in `sections` but may be missing from this.)
    pub claims_before: &'a [(String, Vec<u8>)],
    /// Every charge the payment provider knows.
    pub charges: &'a [Charge],
}

/// Everything that does not add up in `books` (pure: no IO; [`report`] counts and logs them).
pub(crate) fn check(books: &Books<'_>) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut expected_claims: HashMap<String, String> = HashMap::default();
    let mut orders = Vec::new();
    let mut refunds = Vec::new();
    for (name, core) in books.sections {
        if let Err(detail) = core.check_invariants() {
            findings.push(Finding::SectionInconsistent {
                section: name.clone(),
                detail,
            });
        }
        for (key, hold) in core.all_sold_keys() {
            expected_claims.insert(key, hold.0);
        }
        orders.extend(core.orders());
        refunds.extend(core.refunds_due());
    }
    // The backstop.
    let mut seen = HashSet::default();
    for (key, _) in books.claims_before {
        if !expected_claims.contains_key(key) {
            findings.push(Finding::ClaimWithoutSale { key: key.clone() });
        }
    }
    for (key, _) in books.claims {
        seen.insert(key.clone());
    }
    for key in expected_claims.keys() {
        if !seen.contains(key) {
            findings.push(Finding::SoldWithoutClaim { key: key.clone() });
        }
    }
    check_payments(&orders, books.charges, &mut findings);
    check_refunds(&refunds, books.charges, &mut findings);
    findings
}

/// Every refund a cancellation owes is at the provider, of its amount (per ticket given back:
/// each cancellation's tickets at their section's price).
fn check_refunds(due: &[RefundDue], charges: &[Charge], findings: &mut Vec<Finding>) {
    let by_key: HashMap<&str, &Charge> = charges.iter().map(|c| (c.key.as_str(), c)).collect();
    for d in due {
        let detail = match by_key.get(d.refund_key.as_str()) {
            None => "no refund at the provider".to_owned(),
            Some(c) if c.status != ChargeStatus::Refunded => {
                format!("the refund is {:?}", c.status)
            }
            Some(c) if c.amount_cents != d.amount_cents => {
                format!("refunded {} of {}", c.amount_cents, d.amount_cents)
            }
            Some(_) => continue,
        };
        findings.push(Finding::RefundMissing {
            order_id: d.order_id.to_string(),
            payment_id: d.payment_ref.clone(),
            refund_key: d.refund_key.clone(),
            amount_cents: d.amount_cents,
            user_id: d.user_id.to_string(),
            detail,
        });
    }
}

/// Counts `findings` in metrics and logs each; `last` is the engine's share of
/// `boxoffice_reconcile_last_findings`.
pub(crate) fn report(findings: &[Finding], last: &crate::share::Share) {
    for f in findings {
        metrics::counter!("boxoffice_reconcile_findings_total", "kind" => f.kind()).increment(1);
        tracing::error!(finding = ?f, "reconciliation finding");
    }
    last.set(i64::try_from(findings.len()).unwrap_or(i64::MAX));
}

/// Every order is paid by exactly one captured charge of its amount, and every captured charge
/// belongs to an order.
fn check_payments(orders: &[OrderView], charges: &[Charge], findings: &mut Vec<Finding>) {
    let by_id: HashMap<&str, &Charge> =
        charges.iter().map(|c| (c.payment_id.as_str(), c)).collect();
    let mut orders_of: HashMap<&str, Vec<String>> = HashMap::default();
    // A received order (`TransferTickets`) was paid for in the order it came from.
    for o in orders.iter().filter(|o| o.transferred_from.is_none()) {
        orders_of
            .entry(o.payment_ref.as_str())
            .or_default()
            .push(o.order_id.to_string());
        match by_id.get(o.payment_ref.as_str()) {
            None => findings.push(Finding::OrderNotPaid {
                order_id: o.order_id.to_string(),
                payment_id: o.payment_ref.clone(),
                detail: "no such payment".into(),
            }),
            Some(c) if c.status != ChargeStatus::Captured => findings.push(Finding::OrderNotPaid {
                order_id: o.order_id.to_string(),
                payment_id: o.payment_ref.clone(),
                detail: format!("payment is {:?}", c.status),
            }),
            Some(c) if c.amount_cents != o.amount_cents => findings.push(Finding::OrderNotPaid {
                order_id: o.order_id.to_string(),
                payment_id: o.payment_ref.clone(),
                detail: format!("paid {} for an order of {}", c.amount_cents, o.amount_cents),
            }),
            Some(_) => {}
        }
    }
    for (payment_id, os) in &orders_of {
        if os.len() > 1 {
            findings.push(Finding::PaymentOnSeveralOrders {
                payment_id: (*payment_id).to_owned(),
                orders: os.clone(),
            });
        }
    }
    for c in charges {
        if c.status == ChargeStatus::Captured && !orders_of.contains_key(c.payment_id.as_str()) {
            findings.push(Finding::CapturedWithoutOrder {
                payment_id: c.payment_id.clone(),
                amount_cents: c.amount_cents,
            });
        }
    }
}
