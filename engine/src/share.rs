//! Gauges that several engines of one process add up to: a cluster node runs an engine per
//! Raft group it leads (`serve --groups`), and each must not overwrite the others' figure.
//! Each engine holds a [`Share`] of such a gauge: setting it moves the gauge by the change of
//! this engine's own value, and dropping it (the engine gone) takes that value back out. With
//! one engine the gauge shows exactly its value, as a plain `set` would.

use std::sync::atomic::{AtomicI64, Ordering};

/// One engine's part of a process-wide gauge.
pub(crate) struct Share {
    name: &'static str,
    mine: AtomicI64,
}

impl Share {
    /// A share of gauge `name`, starting at 0.
    pub(crate) fn new(name: &'static str) -> Share {
        Share {
            name,
            mine: AtomicI64::new(0),
        }
    }

    /// This engine's value is now `value`: the gauge moves by the difference.
    pub(crate) fn set(&self, value: i64) {
        let before = self.mine.swap(value, Ordering::SeqCst);
        let delta = value - before;
        if delta != 0 {
            metrics::gauge!(self.name).increment(delta as f64);
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mine = *self.mine.get_mut();
        if mine != 0 {
            metrics::gauge!(self.name).decrement(mine as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_leave_with_their_engine() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let value = || {
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .find_map(|(_key, _, _, v)| match v {
                    metrics_util::debugging::DebugValue::Gauge(g) => Some(g.into_inner()),
                    _ => None,
                })
                .unwrap_or(0.0)
        };
        // The debugging recorder hands out a gauge's change since the last snapshot.
        let mut total = 0.0;
        let mut now = || {
            total += value();
            total
        };
        metrics::with_local_recorder(&recorder, || {
            let a = Share::new("test_share");
            let b = Share::new("test_share");
            a.set(3);
            b.set(2);
            assert_eq!(now(), 5.0);
            a.set(0);
            assert_eq!(now(), 2.0, "one engine's figure does not erase another's");
            a.set(4);
            drop(b);
            assert_eq!(now(), 4.0, "a dropped engine's part leaves with it");
        });
    }
}
