//! Where a hold's places go: best available in a reserved section (see the module docs of
//! [`super`]), exact seats, and the seat map's bookkeeping.

use crate::error::Rejection;
use crate::hash::HashSet;
use crate::limits::PLACES_PER_HOLD_MAX;
use crate::types::{Layout, SeatId, SeatStatus};

use super::{RowMeta, SectionCore};

impl SectionCore {
    pub(super) fn is_reserved(&self) -> bool {
        matches!(self.spec.layout, Layout::Reserved { .. })
    }

    /// The places a best-available hold of `q` would take (seat indexes; none in GA).
    pub(super) fn pick_best(&self, q: u32) -> Result<(Vec<u32>, u32), Rejection> {
        if q == 0 || q > PLACES_PER_HOLD_MAX {
            return Err(Rejection::invalid(
                "quantity",
                format!("must be 1 to {PLACES_PER_HOLD_MAX}"),
            ));
        }
        if self.available < q {
            return Err(Rejection::SoldOut);
        }
        if self.is_reserved() {
            let seats = self.best_available(q).ok_or(Rejection::SoldOut)?;
            Ok((seats, q))
        } else {
            Ok((Vec::new(), q))
        }
    }

    /// The seat indexes of exactly the seats named, if every one exists once and is free.
    pub(super) fn pick_seats(&self, ids: &[SeatId]) -> Result<(Vec<u32>, u32), Rejection> {
        if !self.is_reserved() {
            return Err(Rejection::invalid(
                "seat_ids",
                "a general admission section has no seat ids: use best_available",
            ));
        }
        let count = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        if count == 0 || count > PLACES_PER_HOLD_MAX {
            return Err(Rejection::invalid(
                "seat_ids",
                format!("must name 1 to {PLACES_PER_HOLD_MAX} seats"),
            ));
        }
        let mut seen = HashSet::default();
        let mut seats = Vec::with_capacity(ids.len());
        for id in ids {
            let idx = self
                .seat_index(id)
                .ok_or_else(|| Rejection::SeatNotFound(id.clone()))?;
            if !seen.insert(idx) {
                return Err(Rejection::invalid(
                    "seat_ids",
                    format!("seat {id} is named twice"),
                ));
            }
            seats.push(idx);
        }
        for (id, &idx) in ids.iter().zip(&seats) {
            if self.seats[idx as usize] != SeatStatus::Available {
                return Err(Rejection::SeatUnavailable(id.clone()));
            }
        }
        Ok((seats, count))
    }

    pub(super) fn set_seat(&mut self, seat: u32, status: SeatStatus) {
        let row = self.row_of(seat);
        let old = std::mem::replace(&mut self.seats[seat as usize], status);
        let r = &mut self.rows[row];
        if old == SeatStatus::Available {
            r.available -= 1;
        }
        if status == SeatStatus::Available {
            r.available += 1;
        }
    }

    pub(super) fn row_of(&self, seat: u32) -> usize {
        // Rows are sorted by start; the row is the last one starting at or before the seat.
        self.rows.partition_point(|r| r.start <= seat) - 1
    }

    pub(super) fn seat_index(&self, id: &SeatId) -> Option<u32> {
        let (section, row, number) = id.parse()?;
        if section != self.spec.section_id.as_str() {
            return None;
        }
        let r = &self.rows[*self.row_index.get(row)? as usize];
        if number == 0 || number > r.len {
            return None;
        }
        Some(r.start + number - 1)
    }

    /// The id of the seat at `index` in layout order.
    pub fn seat_id(&self, index: u32) -> SeatId {
        let r = &self.rows[self.row_of(index)];
        SeatId::new(&self.spec.section_id, &r.label, index - r.start + 1)
    }

    pub(super) fn best_available(&self, n: u32) -> Option<Vec<u32>> {
        // Pass 1: n adjacent seats in the first row that has them, nearest the centre.
        for r in &self.rows {
            if r.available < n {
                continue;
            }
            if let Some(start) = self.best_window(r, n) {
                return Some((start..start + n).collect());
            }
        }
        // Pass 2: as few rows as possible, most free seats first, centre seats first.
        if self.available < n {
            return None;
        }
        let mut order: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.rows[i].available > 0)
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.rows[i].available));
        let mut picked = Vec::with_capacity(n as usize);
        for i in order {
            let r = &self.rows[i];
            let mut free: Vec<u32> = (r.start..r.start + r.len)
                .filter(|&s| self.seats[s as usize] == SeatStatus::Available)
                .collect();
            free.sort_by_key(|&s| (centre_distance(s - r.start, 1, r.len), s));
            let need = n as usize - picked.len();
            picked.extend(free.into_iter().take(need));
            if picked.len() == n as usize {
                picked.sort_unstable();
                return Some(picked);
            }
        }
        None
    }

    pub(super) fn best_window(&self, r: &RowMeta, n: u32) -> Option<u32> {
        let mut best: Option<(u32, u32)> = None; // (distance, start)
        let mut run = 0u32;
        for off in 0..r.len {
            if self.seats[(r.start + off) as usize] == SeatStatus::Available {
                run += 1;
            } else {
                run = 0;
            }
            if run >= n {
                let start = off + 1 - n;
                let d = centre_distance(start, n, r.len);
                if best.is_none_or(|(bd, _)| d < bd) {
                    best = Some((d, start));
                }
            }
        }
        best.map(|(_, start)| r.start + start)
    }
}

/// Twice the distance between the centre of seats `start..start+n` and the centre of a row of
/// `len` seats (doubled so it stays an integer).
fn centre_distance(start: u32, n: u32, len: u32) -> u32 {
    (2 * start + n - 1).abs_diff(len - 1)
}
