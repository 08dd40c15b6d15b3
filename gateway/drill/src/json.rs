//! How the reports' JSON is written: one object per line, numbers rounded to the precision
//! the reports have always had (seconds to the millisecond, shares to 1e-4, rates to 0.1).

use serde::{Serialize, Serializer};

/// `value` as one line of JSON, newline included.
pub(crate) fn line(value: &impl Serialize) -> String {
    // A report is plain numbers, strings, options and vectors: nothing that can fail.
    let mut out = serde_json::to_string(value).expect("a report serializes to JSON");
    out.push('\n');
    out
}

fn rounded(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

/// Seconds, to the millisecond.
pub(crate) fn millis<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(rounded(*v, 3))
}

/// Seconds, to the millisecond, or `null`.
pub(crate) fn opt_millis<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    v.map(|v| rounded(v, 3)).serialize(s)
}

/// A share, to four decimals, or `null`.
pub(crate) fn opt_share<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    v.map(|v| rounded(v, 4)).serialize(s)
}

/// A rate, to one decimal.
pub(crate) fn tenths<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(rounded(*v, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Figures {
        #[serde(serialize_with = "millis")]
        seconds: f64,
        #[serde(serialize_with = "opt_millis")]
        after: Option<f64>,
        #[serde(serialize_with = "opt_share")]
        share: Option<f64>,
        #[serde(serialize_with = "tenths")]
        rate: f64,
    }

    #[test]
    fn numbers_keep_the_reports_precision() {
        let f = Figures {
            seconds: 12.345_678,
            after: None,
            share: Some(0.987_654),
            rate: 153.24,
        };
        assert_eq!(
            line(&f),
            "{\"seconds\":12.346,\"after\":null,\"share\":0.9877,\"rate\":153.2}\n"
        );
    }
}
