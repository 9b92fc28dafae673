//! Simulated time. Time is counted in cycles of the simulated machine; a
//! preset's clock rate turns cycles into microseconds for printing only.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// A point in, or a span of, simulated time in processor cycles.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Cycles(pub u64);

impl Cycles {
    pub const ZERO: Cycles = Cycles(0);
    pub const MAX: Cycles = Cycles(u64::MAX);

    pub fn saturating_sub(self, other: Cycles) -> Cycles {
        Cycles(self.0.saturating_sub(other.0))
    }
}

impl Add for Cycles {
    type Output = Cycles;
    fn add(self, rhs: Cycles) -> Cycles {
        Cycles(self.0 + rhs.0)
    }
}

impl AddAssign for Cycles {
    fn add_assign(&mut self, rhs: Cycles) {
        self.0 += rhs.0;
    }
}

impl Sub for Cycles {
    type Output = Cycles;
    fn sub(self, rhs: Cycles) -> Cycles {
        debug_assert!(
            self.0 >= rhs.0,
            "time went backwards: {} - {}",
            self.0,
            rhs.0
        );
        Cycles(self.0 - rhs.0)
    }
}

impl fmt::Display for Cycles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}cy", self.0)
    }
}

/// The clock rate of a preset, used to print cycles as microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Clock {
    pub hz: f64,
}

impl Clock {
    pub fn new(hz: f64) -> Clock {
        assert!(
            hz > 0.0 && hz.is_finite(),
            "clock rate must be positive, got {hz}"
        );
        Clock { hz }
    }

    pub fn to_us(&self, c: Cycles) -> f64 {
        c.0 as f64 * 1e6 / self.hz
    }

    pub fn us_f64(&self, cycles: f64) -> f64 {
        cycles * 1e6 / self.hz
    }

    /// Microseconds to whole cycles (rounded to nearest), for cost inputs
    /// that papers state in µs.
    pub fn from_us(&self, us: f64) -> Cycles {
        Cycles((us * self.hz / 1e6).round() as u64)
    }
}
