//! Real host measurements. Work in progress.
