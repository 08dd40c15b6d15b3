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

/// A map decoded with room for every entry its encoding counts, made once: serde's own
/// decoding sizes a map for at most about a thousand entries and grows it from there,
/// hashing every key again at each growth (a quarter of decoding a section's checkpoint of
/// 166,667 holds). For `#[serde(deserialize_with = "crate::hash::presized")]`; decodes what the
/// default decoding decodes (a later duplicate key wins).
pub(crate) fn presized<'de, D, K, V>(decoder: D) -> Result<HashMap<K, V>, D::Error>
where
    D: serde::Deserializer<'de>,
    K: serde::Deserialize<'de> + std::hash::Hash + Eq,
    V: serde::Deserialize<'de>,
{
    /// At most this many entries are made room for up front, whatever a length says.
    const ROOM_MAX: usize = 1 << 24;
    struct Entries<K, V>(std::marker::PhantomData<(K, V)>);
    impl<'de, K, V> serde::de::Visitor<'de> for Entries<K, V>
    where
        K: serde::Deserialize<'de> + std::hash::Hash + Eq,
        V: serde::Deserialize<'de>,
    {
        type Value = HashMap<K, V>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a map")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut access: A,
        ) -> Result<Self::Value, A::Error> {
            let room = access.size_hint().unwrap_or(0).min(ROOM_MAX);
            let mut map = HashMap::with_capacity_and_hasher(room, State::default());
            while let Some((key, value)) = access.next_entry()? {
                map.insert(key, value);
            }
            Ok(map)
        }
    }
    decoder.deserialize_map(Entries(std::marker::PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order<S: BuildHasher>(map: &std::collections::HashMap<u32, (), S>) -> Vec<u32> {
        map.keys().copied().collect()
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Presized(#[serde(deserialize_with = "presized")] HashMap<String, u64>);

    #[test]
    fn a_presized_map_decodes_as_the_default_decoding_does() {
        let map: HashMap<String, u64> = (0..5_000).map(|i| (format!("k{i}"), i * 3)).collect();
        let bytes = crate::codec::encode(&map);
        let Presized(decoded) = crate::codec::decode(&bytes).expect("decodes");
        let default: HashMap<String, u64> = crate::codec::decode(&bytes).expect("decodes");
        assert_eq!(decoded, map);
        assert_eq!(decoded, default);
        // Damage past the entries is refused as the default decoding refuses it.
        let cut = &bytes[..bytes.len() - 3];
        assert!(crate::codec::decode::<Presized>(cut).is_err());
        assert!(crate::codec::decode::<HashMap<String, u64>>(cut).is_err());
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
