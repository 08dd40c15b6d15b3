//! What a refusal says beyond its code: the reason of its `ErrorInfo` detail.

use tonic::Status;
use tonic_types::StatusExt;

/// The `ErrorInfo.reason` a status carries, if any (`OVERLOADED`, `SOLD_OUT`, ...).
pub fn reason(status: &Status) -> Option<String> {
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
}
