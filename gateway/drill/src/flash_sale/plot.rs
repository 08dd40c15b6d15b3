//! The picture of a sale (`--plot`): seats left, admissions/s and holds/s over time, and the
//! latency percentiles, as SVG.

use super::Report;
use super::progress::Sample;

/// A named line of (seconds, value) points with its colour.
type Series = (&'static str, Vec<(f64, f64)>, &'static str);

/// An SVG picture of the sale: seats left, admissions/s and holds/s over time, and the latency
/// percentiles.
pub(crate) fn plot_svg(samples: &[Sample], r: &Report) -> String {
    const W: f64 = 900.0;
    const PANEL: f64 = 160.0;
    let t_max = samples.last().map_or(1.0, |s| s.t).max(1.0);
    let rates = |f: fn(&Sample) -> u64| -> Vec<(f64, f64)> {
        samples
            .windows(2)
            .map(|w| {
                let dt = (w[1].t - w[0].t).max(1e-3);
                (w[1].t, f(&w[1]).saturating_sub(f(&w[0])) as f64 / dt)
            })
            .collect()
    };
    let series: [Series; 3] = [
        (
            "seats left",
            samples
                .iter()
                .map(|s| (s.t, f64::from(s.available)))
                .collect(),
            "#1f77b4",
        ),
        ("admissions per second", rates(|s| s.admitted), "#2ca02c"),
        ("holds per second", rates(|s| s.holds), "#d62728"),
    ];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        PANEL * 3.0 + 140.0
    );
    for (k, (name, pts, color)) in series.iter().enumerate() {
        let top = 20.0 + k as f64 * PANEL;
        let y_max = pts.iter().map(|p| p.1).fold(1.0, f64::max);
        out.push_str(&format!(
            "<text x=\"60\" y=\"{}\">{name} (max {:.0})</text>\n<line x1=\"60\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\"/>\n",
            top + 12.0,
            y_max,
            top + PANEL - 10.0,
            W - 20.0,
            top + PANEL - 10.0
        ));
        let path: Vec<String> = pts
            .iter()
            .map(|(t, y)| {
                let x = 60.0 + (W - 80.0) * t / t_max;
                let yy = top + PANEL - 10.0 - (PANEL - 40.0) * y / y_max;
                format!("{x:.1},{yy:.1}")
            })
            .collect();
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
            path.join(" ")
        ));
    }
    let base = 20.0 + 3.0 * PANEL;
    out.push_str(&format!(
        "<text x=\"60\" y=\"{}\">time: 0 to {t_max:.1} s</text>\n",
        base
    ));
    let ms = |us: u64| us as f64 / 1000.0;
    for (k, (name, p)) in [("Hold", r.hold_us), ("Confirm", r.confirm_us)]
        .iter()
        .enumerate()
    {
        out.push_str(&format!(
            "<text x=\"60\" y=\"{}\">{name} latency ms: p50 {:.2}  p95 {:.2}  p99 {:.2}  max {:.2}</text>\n",
            base + 24.0 + 18.0 * k as f64,
            ms(p.p50),
            ms(p.p95),
            ms(p.p99),
            ms(p.max)
        ));
    }
    out.push_str(&format!(
        "<text x=\"60\" y=\"{}\">{} fans, {} seats, sold {}, oversold {}, double-booked {}</text>\n</svg>\n",
        base + 66.0,
        r.fans,
        r.seats,
        r.sold,
        r.oversold,
        r.double_booked
    ));
    out
}
