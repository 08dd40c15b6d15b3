//! What a node's state machine applies, shown to the deterministic simulation (feature
//! `test-support`): every committed op of records, as it is applied, with its place in the log
//! (not the ops the state machine skips: a stale batch's, or one whose claims were refused).
//! The simulation checks each refusal against the states the committed log went through while
//! the refusal ran (`boxoffice-sim`'s `refusals`).
//!
//! The observer is per thread: a simulation runs every node of one run on one thread (turmoil),
//! and several runs side by side on their own threads. Without `test-support` nothing is
//! observed and [`applied`] is empty.

/// Records of one stream, applied by a node: its `op`th op of the entry at log `index`.
pub struct Applied<'a> {
    /// The entry's log index.
    pub index: u64,
    /// The op's place in the entry's batch.
    pub op: usize,
    /// The stream (see [`crate::store::names`]).
    pub stream: &'a str,
    /// `(seq, encoded record)`, in order.
    pub entries: &'a [(u64, Vec<u8>)],
}

#[cfg(feature = "test-support")]
type Observer = Box<dyn FnMut(&Applied<'_>)>;

#[cfg(feature = "test-support")]
thread_local! {
    static OBSERVER: std::cell::RefCell<Option<Observer>> = const { std::cell::RefCell::new(None) };
}

/// Shows every op of records applied on this thread to `observer` until the guard is dropped.
#[cfg(feature = "test-support")]
pub fn observe(observer: impl FnMut(&Applied<'_>) + 'static) -> Observing {
    OBSERVER.with(|o| *o.borrow_mut() = Some(Box::new(observer)));
    Observing(())
}

/// Observing until dropped (see [`observe`]).
#[cfg(feature = "test-support")]
pub struct Observing(());

#[cfg(feature = "test-support")]
impl Drop for Observing {
    fn drop(&mut self) {
        OBSERVER.with(|o| *o.borrow_mut() = None);
    }
}

/// A node applied `a`.
#[cfg_attr(not(feature = "test-support"), allow(unused_variables))]
pub(crate) fn applied(a: &Applied<'_>) {
    #[cfg(feature = "test-support")]
    OBSERVER.with(|o| {
        if let Ok(mut o) = o.try_borrow_mut()
            && let Some(f) = o.as_mut()
        {
            f(a);
        }
    });
}
