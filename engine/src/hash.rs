//! Hash maps and sets whose order is the same in every process of a simulation.
//!
//! std's maps draw their hash keys from the OS for each process, so the order in which a map is
//! walked (the section actors a closing engine stops, the holds a sweep finds) differs from one
//! process to the next. That is right when serving (an attacker must not be able to choose keys
//! that collide), but a simulation's seed must replay the same run in any process: two traces of
//! one seed in fresh processes differed in 2 seeds of 300 before these maps. So the engine, the
//! gateway and the sweeper build their maps with [`State`]: the OS's random keys when serving,
//! fixed keys on a thread that runs a simulation ([`crate::rt::simulated`]).

use std::hash::{BuildHasher, DefaultHasher, RandomState};

/// A `HashMap` with [`State`]'s hash keys (`HashMap::default()` makes one).
pub type HashMap<K, V> = std::collections::HashMap<K, V, State>;
/// A `HashSet` with [`State`]'s hash keys.
pub type HashSet<T> = std::collections::HashSet<T, State>;
/// A `DashMap` with [`State`]'s hash keys.
pub type DashMap<K, V> = dashmap::DashMap<K, V, State>;

/// Hash keys: random per process (std's [`RandomState`]), or fixed when made on a simulation's
/// thread.
#[derive(Clone, Debug)]
pub struct State(Option<RandomState>);

impl Default for State {
    fn default() -> Self {
        if crate::rt::simulated() {
            State(None)
        } else {
            State(Some(RandomState::new()))
        }
    }
}

impl BuildHasher for State {
    type Hasher = DefaultHasher;

    fn build_hasher(&self) -> DefaultHasher {
        match &self.0 {
            Some(random) => random.build_hasher(),
            // SipHash with zero keys: the same in every process.
            None => DefaultHasher::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order<S: BuildHasher>(map: &std::collections::HashMap<u32, (), S>) -> Vec<u32> {
        map.keys().copied().collect()
    }

    #[test]
    fn a_simulation_walks_a_map_in_one_order_and_serving_does_not() {
        let fill = || -> HashMap<u32, ()> { (0..64).map(|k| (k, ())).collect() };
        let serving: Vec<Vec<u32>> = (0..8).map(|_| order(&fill())).collect();
        assert!(
            serving.windows(2).any(|w| w[0] != w[1]),
            "eight maps made while serving walked in one order: their keys are not random"
        );
        let _sim = crate::rt::simulate(1, || 0);
        let simulated: Vec<Vec<u32>> = (0..8).map(|_| order(&fill())).collect();
        assert!(
            simulated.windows(2).all(|w| w[0] == w[1]),
            "maps made in a simulation walked in different orders"
        );
        // Fixed keys, the same in any process: SipHash's with zero keys.
        let zero_keys: std::collections::HashMap<
            u32,
            (),
            std::hash::BuildHasherDefault<DefaultHasher>,
        > = (0..64).map(|k| (k, ())).collect();
        assert_eq!(simulated[0], order(&zero_keys));
    }
}
