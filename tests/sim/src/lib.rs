//! # boxoffice-sim
//!
//! A deterministic simulation of whole boxoffice nodes.
//!
//! Layout:
//! - [`node`]: a node is the real server stack as a turmoil host, over a simulated disk
//!   ([`boxoffice_engine::store::SimKv`]) and clock ([`clock`]), on turmoil's network ([`net`]).

pub mod clock;
pub mod net;
pub mod node;
