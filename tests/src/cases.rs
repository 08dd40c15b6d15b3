//! Calls that must be refused, as tables: one row per case (a name, the request, the gRPC code
//! and `ErrorInfo.reason` it must get, and optionally the field its `BadRequest` must blame),
//! run in order by [`check_error_cases`], which also checks that each refused call changed
//! nothing, and names every case that went wrong.

use std::fmt::Debug;

use tonic::{Code, Response, Status};
use tonic_types::StatusExt;

/// The `ErrorInfo.domain` of every error boxoffice gives.
pub const DOMAIN: &str = "boxoffice";

/// One call that must be refused.
pub struct ErrorCase<R> {
    /// Names the case in failure messages.
    pub name: &'static str,
    /// What is sent.
    pub request: R,
    /// The status code it must get.
    pub code: Code,
    /// The `ErrorInfo.reason` it must get.
    pub reason: &'static str,
    /// The field the first `BadRequest` violation must name, if checked.
    pub field: Option<&'static str>,
}

/// The case `name`: sending `request` must get `code` and `reason`.
pub fn case<R>(name: &'static str, request: R, code: Code, reason: &'static str) -> ErrorCase<R> {
    ErrorCase {
        name,
        request,
        code,
        reason,
        field: None,
    }
}

impl<R> ErrorCase<R> {
    /// The status must also blame `field` (its first `BadRequest` field violation).
    pub fn field(mut self, field: &'static str) -> Self {
        self.field = Some(field);
        self
    }
}

/// What is wrong with the answer `r` to a call that must get `code`, `reason` (in [`DOMAIN`])
/// and, if given, a `BadRequest` blaming `field`; `None` if it is right.
pub fn mismatch<T: Debug>(
    r: Result<Response<T>, Status>,
    code: Code,
    reason: &str,
    field: Option<&str>,
) -> Option<String> {
    let s = match r {
        Ok(v) => return Some(format!("succeeded: {:?}", v.get_ref())),
        Err(s) => s,
    };
    let mut wrong = Vec::new();
    if s.code() != code {
        wrong.push(format!("code {:?}, not {code:?}", s.code()));
    }
    let details = s.get_error_details();
    match details.error_info() {
        Some(info) => {
            if info.reason != reason {
                wrong.push(format!("reason {:?}, not {reason:?}", info.reason));
            }
            if info.domain != DOMAIN {
                wrong.push(format!("domain {:?}, not {DOMAIN:?}", info.domain));
            }
        }
        None => wrong.push(format!("no ErrorInfo, so no reason (wanted {reason:?})")),
    }
    if let Some(field) = field {
        let blamed = details
            .bad_request()
            .and_then(|b| b.field_violations.first())
            .map(|v| v.field.clone());
        if blamed.as_deref() != Some(field) {
            wrong.push(format!("blames {blamed:?}, not {field:?}"));
        }
    }
    (!wrong.is_empty()).then(|| format!("{}\n    in {s:?}", wrong.join("; ")))
}

/// Fails the test unless `r` is refused with `code` and `reason` (in [`DOMAIN`]).
#[track_caller]
pub fn expect_err<T: Debug>(r: Result<Response<T>, Status>, code: Code, reason: &str) {
    if let Some(wrong) = mismatch(r, code, reason, None) {
        panic!("expected {code:?}/{reason}: {wrong}");
    }
}

/// Sends the request of every case of `table` (named `name` in messages) through `call`, in
/// order. Each must be refused as its row says, and `state` must read the same after the call
/// as before it: a refused call changes nothing. Fails the test naming every case that did not.
pub async fn check_error_cases<R, T: Debug, S: PartialEq + Debug>(
    name: &str,
    table: Vec<ErrorCase<R>>,
    mut call: impl AsyncFnMut(R) -> Result<Response<T>, Status>,
    mut state: impl AsyncFnMut() -> S,
) {
    assert!(!table.is_empty(), "{name}: an empty table checks nothing");
    let mut failures = Vec::new();
    for case in table {
        let before = state().await;
        let answer = call(case.request).await;
        if let Some(wrong) = mismatch(answer, case.code, case.reason, case.field) {
            failures.push(format!(
                "{name} / {}: expected {:?}/{}: {wrong}",
                case.name, case.code, case.reason
            ));
        }
        let after = state().await;
        if after != before {
            failures.push(format!(
                "{name} / {}: the refused call changed the state\n    before: {before:?}\n    after: {after:?}",
                case.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing case(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
