//! Progress while the sale runs: a sample of the fans' counters and the server's seat counts
//! every 250 ms, shown as bars on a terminal or as a line a second otherwise (logs, CI), and
//! kept for the report's busiest second and the plot.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boxoffice_client::Authed;
use boxoffice_proto::v1 as pb;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use super::tally::Tally;

type Events = pb::event_service_client::EventServiceClient<Authed>;

/// One progress sample (every 250 ms).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    /// Seconds since the sale started.
    pub t: f64,
    /// Calls the fans made so far.
    pub calls: u64,
    /// Of those, waitlist checks.
    pub waitlist_checks: u64,
    pub arrived: u64,
    pub admitted: u64,
    pub holds: u64,
    pub available: u32,
    pub held: u32,
    pub sold: u32,
}

/// The sampler task and what it gathered.
pub(crate) struct Progress {
    task: tokio::task::JoinHandle<()>,
    samples: Arc<Mutex<Vec<Sample>>>,
}

impl Progress {
    /// Samples `event_id` (and the fans' `tally`) every 250 ms until stopped, through the first
    /// of `events` (one client per node) and the next one after a call fails. When it sees no
    /// place free and none held, it tells the fans the sale is sold out for good.
    pub fn start(
        events: Vec<Events>,
        event_id: String,
        started: Instant,
        (fans, seats): (usize, u32),
        tally: Arc<Tally>,
    ) -> Progress {
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let sampler = Sampler {
            events,
            at: 0,
            event_id,
            started,
            fans,
            tally,
            samples: samples.clone(),
            // Bars on a terminal; a plain line a second otherwise (logs, CI).
            bars: std::io::IsTerminal::is_terminal(&std::io::stderr())
                .then(|| Bars::new(fans, seats)),
        };
        Progress {
            task: tokio::spawn(sampler.run()),
            samples,
        }
    }

    /// Stops sampling; the samples taken.
    pub fn stop(self) -> Vec<Sample> {
        self.task.abort();
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

struct Sampler {
    events: Vec<Events>,
    /// The node sampled now.
    at: usize,
    event_id: String,
    started: Instant,
    fans: usize,
    tally: Arc<Tally>,
    samples: Arc<Mutex<Vec<Sample>>>,
    bars: Option<Bars>,
}

impl Sampler {
    async fn run(mut self) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut last_line = Instant::now();
        loop {
            tick.tick().await;
            let Some(sample) = self.sample().await else {
                continue;
            };
            match &self.bars {
                Some(b) => b.show(&sample),
                None if last_line.elapsed() >= Duration::from_secs(1) => {
                    last_line = Instant::now();
                    eprintln!(
                        "[{:>5.1}s] fans arrived {:>8}/{}  admitted {:>8}  available {:>6}  held {:>6}  sold {:>6}",
                        sample.t,
                        sample.arrived,
                        self.fans,
                        sample.admitted,
                        sample.available,
                        sample.held,
                        sample.sold,
                    );
                }
                None => {}
            }
            if let Ok(mut v) = self.samples.lock() {
                v.push(sample);
            }
        }
    }

    /// The event's counts now (`None` if the server did not answer: the next sample asks the
    /// next node), with the fans' counters.
    async fn sample(&mut self) -> Option<Sample> {
        let n = self.events.len().max(1);
        let e = self.events[self.at % n]
            .get_event(pb::GetEventRequest {
                event_id: self.event_id.clone(),
            })
            .await
            .inspect_err(|_| self.at = (self.at + 1) % n)
            .ok()?;
        let (a, h, s) = e.get_ref().sections.iter().fold((0, 0, 0), |t, s| {
            (t.0 + s.available, t.1 + s.held, t.2 + s.sold)
        });
        let tally = &self.tally;
        if a == 0 && h == 0 {
            tally.sold_out_for_good.store(true, Ordering::Release);
        }
        Some(Sample {
            t: self.started.elapsed().as_secs_f64(),
            calls: tally.calls.load(Ordering::Relaxed),
            waitlist_checks: tally.waitlist_checks.load(Ordering::Relaxed),
            arrived: tally.arrived.load(Ordering::Relaxed).min(self.fans) as u64,
            admitted: tally.admitted.load(Ordering::Relaxed),
            holds: tally.holds_ok.load(Ordering::Relaxed),
            available: a,
            held: h,
            sold: s,
        })
    }
}

/// Progress bars on a terminal.
struct Bars {
    _multi: MultiProgress,
    arrived: ProgressBar,
    admitted: ProgressBar,
    holding: ProgressBar,
    sold: ProgressBar,
    left: ProgressBar,
}

impl Bars {
    fn new(fans: usize, seats: u32) -> Bars {
        let multi = MultiProgress::new();
        let style = ProgressStyle::with_template("{prefix:>14} [{bar:40}] {pos:>7}/{len}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        let bar = |name: &'static str, len: u64| {
            let b = multi.add(ProgressBar::new(len));
            b.set_style(style.clone());
            b.set_prefix(name);
            b
        };
        Bars {
            arrived: bar("fans queued", fans as u64),
            admitted: bar("admitted", fans as u64),
            holding: bar("holding", u64::from(seats)),
            sold: bar("paid (sold)", u64::from(seats)),
            left: bar("seats left", u64::from(seats)),
            _multi: multi,
        }
    }

    fn show(&self, s: &Sample) {
        self.arrived.set_position(s.arrived);
        self.admitted.set_position(s.admitted);
        self.holding.set_position(u64::from(s.held));
        self.sold.set_position(u64::from(s.sold));
        self.left.set_position(u64::from(s.available));
    }
}

/// The rate of `count` over the last second at each sample: from the latest earlier sample at
/// least one second before it, per second (none for the samples of the first second). The
/// plot draws these; [`peak_rate`] is their maximum, so that the two agree.
pub(crate) fn per_second(samples: &[Sample], count: impl Fn(&Sample) -> u64) -> Vec<(f64, f64)> {
    let mut rates = Vec::new();
    let mut i = 0;
    for b in samples {
        // The latest sample at least a second before `b`.
        while samples.get(i + 1).is_some_and(|next| b.t - next.t >= 1.0) {
            i += 1;
        }
        let a = &samples[i];
        if b.t - a.t >= 1.0 {
            rates.push((b.t, count(b).saturating_sub(count(a)) as f64 / (b.t - a.t)));
        }
    }
    rates
}

/// The busiest second: the most of `count` in a window of at least one second between two
/// samples, per second (the maximum of [`per_second`]), rounded.
pub(crate) fn peak_rate(samples: &[Sample], count: impl Fn(&Sample) -> u64) -> u64 {
    per_second(samples, count)
        .into_iter()
        .map(|(_, r)| r)
        .fold(0.0, f64::max)
        .round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_second_is_found_between_samples() {
        let at = |t: f64, calls: u64| Sample {
            t,
            calls,
            waitlist_checks: calls / 10,
            arrived: 0,
            admitted: 0,
            holds: 0,
            available: 0,
            held: 0,
            sold: 0,
        };
        let all = |s: &Sample| s.calls;
        assert_eq!(peak_rate(&[], all), 0);
        assert_eq!(
            peak_rate(&[at(0.0, 5)], all),
            0,
            "one sample spans no second"
        );
        // 100/s, then 1,000 calls in the second from 1.0 s to 2.0 s, then quiet.
        let s = [
            at(0.0, 0),
            at(0.5, 50),
            at(1.0, 100),
            at(1.5, 600),
            at(2.0, 1_100),
            at(2.5, 1_100),
            at(3.0, 1_100),
        ];
        assert_eq!(peak_rate(&s, all), 1_000);
        assert_eq!(peak_rate(&s, |s| s.calls - s.waitlist_checks), 900);
    }
}
