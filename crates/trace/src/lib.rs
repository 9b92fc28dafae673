//! Memory traces and fast TLB simulation. Work in progress.
