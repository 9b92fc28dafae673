//! Newtypes for the identifiers that are easy to mix up.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id {
    ($(#[$m:meta])* $name:ident, $t:ty, $fmt:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub $t);
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $fmt, self.0)
            }
        }
    };
}

id!(
    /// A processor number, 0-based.
    CpuId, u16, "cpu{}"
);
id!(
    /// A virtual page number (virtual address >> page shift).
    Vpn, u64, "vpn {:#x}"
);
id!(
    /// A physical frame number.
    Pfn, u64, "pfn {:#x}"
);
id!(
    /// An address-space identifier held in tagged TLB entries.
    Asid, u16, "asid {}"
);

impl CpuId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}
