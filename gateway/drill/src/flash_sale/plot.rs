//! The picture of a sale (`--plot`), drawn with `plotters` on its SVG backend: three panels over
//! time (seats left, admissions per second, holds per second), a panel of the hold and confirm
//! latency percentiles, and a line of totals.

use plotters::coord::Shift;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use super::progress::{Sample, per_second};
use super::report::Percentiles;
use super::report::Report;

/// Width of the picture.
const WIDTH: u32 = 900;
/// Height of each panel over time.
const PANEL: u32 = 170;
/// Height of the latency panel.
const LATENCY_PANEL: u32 = 230;
/// Height of the line of totals.
const FOOTER: u32 = 40;
const FONT: &str = "sans-serif";

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A line of (seconds, value) points with its caption (its figures from the report) and colour.
struct Series {
    caption: String,
    points: Vec<(f64, f64)>,
    color: RGBColor,
}

/// An SVG picture of the sale: seats left, admissions/s and holds/s over time, and the latency
/// percentiles.
pub(crate) fn plot_svg(samples: &[Sample], r: &Report) -> anyhow::Result<String> {
    let mut svg = String::new();
    let height = 3 * PANEL + LATENCY_PANEL + FOOTER;
    draw(
        SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area(),
        samples,
        r,
    )?;
    Ok(svg)
}

/// Draws every panel on `root` (the SVG is complete once `root` is dropped).
fn draw(root: Area<'_>, samples: &[Sample], r: &Report) -> anyhow::Result<()> {
    root.fill(&WHITE)?;
    let (over_time, rest) = root.split_vertically(3 * PANEL);
    let (latency, footer) = rest.split_vertically(LATENCY_PANEL);
    let t_max = samples.last().map_or(1.0, |s| s.t).max(1.0);
    for (area, series) in over_time
        .split_evenly((3, 1))
        .iter()
        .zip(series(samples, r))
    {
        time_panel(area, &series, t_max, pause(r))?;
    }
    latency_panel(&latency, r.hold_us, r.confirm_us)?;
    footer.draw(&Text::new(
        format!(
            "{} fans, {} seats, sold {}, oversold {}, double-booked {}; time 0 to {t_max:.1} s",
            r.fans, r.seats, r.sold, r.oversold, r.double_booked
        ),
        (60, 12),
        (FONT, 13),
    ))?;
    root.present()?;
    Ok(())
}

/// The three lines over time: seats left, and the admissions and holds per second over the
/// last second ([`per_second`]: their maxima are the report's busiest seconds, which the
/// captions print with the report's totals).
fn series(samples: &[Sample], r: &Report) -> [Series; 3] {
    let rates = |f: fn(&Sample) -> u64| per_second(samples, f);
    [
        Series {
            caption: format!("seats left (of {}; {} sold)", r.seats, r.sold),
            points: samples
                .iter()
                .map(|s| (s.t, f64::from(s.available)))
                .collect(),
            color: RGBColor(0x1f, 0x77, 0xb4),
        },
        Series {
            caption: format!(
                "admissions per second (busiest second {}; {} admitted in all)",
                r.peak_admissions_per_second, r.admitted
            ),
            points: rates(|s| s.admitted),
            color: RGBColor(0x2c, 0xa0, 0x2c),
        },
        Series {
            caption: format!(
                "holds per second (busiest second {}; {} holds in all)",
                r.peak_holds_per_second, r.holds
            ),
            points: rates(|s| s.holds),
            color: RGBColor(0xd6, 0x27, 0x28),
        },
    ]
}

/// When the sale was paused (`--pause-at`), seconds on the time axis.
fn pause(r: &Report) -> Option<(f64, f64)> {
    r.paused_at_seconds.zip(r.resumed_at_seconds)
}

/// One line over the sale's seconds, under its caption; a pause shaded grey behind it.
fn time_panel(
    area: &Area<'_>,
    s: &Series,
    t_max: f64,
    pause: Option<(f64, f64)>,
) -> anyhow::Result<()> {
    let y_max = s.points.iter().map(|p| p.1).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(&s.caption, (FONT, 14))
        .margin(6)
        .x_label_area_size(22)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max * 1.05)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .max_light_lines(1)
        .x_labels(10)
        .y_labels(4)
        .x_label_formatter(&|t| format!("{t:.0} s"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    if let Some((from, to)) = pause {
        let top = y_max * 1.05;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(from, 0.0), (to, top)],
            RGBColor(0xdd, 0xdd, 0xdd).filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            "paused",
            (from, top * 0.95),
            (FONT, 11),
        )))?;
    }
    chart.draw_series(LineSeries::new(
        s.points.iter().copied(),
        s.color.stroke_width(2),
    ))?;
    Ok(())
}

/// The hold and confirm latency percentiles (p50, p95, p99, max), ms.
fn latency_panel(area: &Area<'_>, hold: Percentiles, confirm: Percentiles) -> anyhow::Result<()> {
    const NAMES: [&str; 4] = ["p50", "p95", "p99", "max"];
    let ms = |p: Percentiles| [p.p50, p.p95, p.p99, p.max].map(|us| us as f64 / 1000.0);
    let lines = [
        ("Hold", ms(hold), RGBColor(0xd6, 0x27, 0x28)),
        ("Confirm", ms(confirm), RGBColor(0x94, 0x67, 0xbd)),
    ];
    let y_max = lines
        .iter()
        .flat_map(|(_, v, _)| v.iter().copied())
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption("latency percentiles (ms)", (FONT, 14))
        .margin(6)
        .x_label_area_size(22)
        .y_label_area_size(60)
        // Headroom above the lines for the legend.
        .build_cartesian_2d((0u32..3).into_segmented(), 0.0..y_max * 1.5)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .max_light_lines(1)
        .y_labels(4)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => NAMES
                .get(*i as usize)
                .copied()
                .unwrap_or_default()
                .to_owned(),
            SegmentValue::Last => String::new(),
        })
        .draw()?;
    for (name, values, color) in lines {
        let points: Vec<_> = (0u32..)
            .zip(values)
            .map(|(i, v)| (SegmentValue::CenterOf(i), v))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(format!(
                "{name}: p50 {:.2}  p95 {:.2}  p99 {:.2}  max {:.2}",
                values[0], values[1], values[2], values[3]
            ))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .label_font((FONT, 12))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flash_sale::progress::peak_rate;

    #[test]
    fn the_plot_prints_the_reports_figures_and_its_lines_peak_at_them() {
        // Holds: 84 in the busiest 250 ms (336/s over 250 ms), 102 in all.
        let at = |t: f64, holds: u64, admitted: u64| Sample {
            t,
            calls: holds * 2,
            waitlist_checks: 0,
            arrived: admitted,
            admitted,
            holds,
            available: 102u32.saturating_sub(holds as u32),
            held: 0,
            sold: holds as u32,
        };
        let samples = [
            at(0.0, 0, 0),
            at(0.25, 2, 10),
            at(0.5, 4, 20),
            at(0.75, 88, 120),
            at(1.0, 90, 130),
            at(1.25, 96, 140),
            at(1.5, 100, 150),
            at(1.75, 102, 150),
            at(2.0, 102, 150),
        ];
        let mut r = Report {
            fans: 150,
            seats: 102,
            sold: 102,
            holds: 102,
            admitted: 150,
            peak_holds_per_second: peak_rate(&samples, |s| s.holds),
            peak_admissions_per_second: peak_rate(&samples, |s| s.admitted),
            ..Report::default()
        };
        assert!(
            r.peak_holds_per_second <= r.holds,
            "a second holds no more than all"
        );
        let [_, admissions, holds] = series(&samples, &r);
        let top = |s: &Series| s.points.iter().map(|p| p.1).fold(0.0, f64::max).round() as u64;
        assert_eq!(top(&holds), r.peak_holds_per_second);
        assert_eq!(top(&admissions), r.peak_admissions_per_second);
        let svg = plot_svg(&samples, &r).unwrap();
        let want = format!(
            "holds per second (busiest second {}; 102 holds in all)",
            r.peak_holds_per_second
        );
        assert!(svg.contains(&want), "{want:?} in the SVG");
        assert!(svg.contains("seats left (of 102; 102 sold)"));
        r.peak_holds_per_second += 1;
        assert!(!plot_svg(&samples, &r).unwrap().contains(&want));
    }
}
