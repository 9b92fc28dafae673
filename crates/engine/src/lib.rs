//! The engine layer of DESIGN.md: simulated time, the event queue, seeded
//! random streams and statistics. It knows nothing about TLBs or pages.

pub mod hint;
pub mod queue;
pub mod rng;
pub mod stats;
pub mod time;

pub use hint::{prefetch, prefetch_ptr};
pub use queue::{EventQueue, SmallQueue};
pub use rng::{SimRng, UniformInclusive};
pub use stats::{Counters, Histogram, LinearFit, Summary, mean_ci95};
pub use time::{Clock, Cycles};
