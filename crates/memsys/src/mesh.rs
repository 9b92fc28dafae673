//! 2D mesh of the directory system (Table 1: "2D mesh (directory)").
//!
//! Core `c` sits on tile `c` (row-major); the home of a block is tile
//! `block mod tiles` (block-interleaved L2 banks, each with its slice of the
//! directory). Distance is dimension-ordered (XY) routing: Manhattan hops.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mesh {
    pub cols: u64,
    pub rows: u64,
}

impl Mesh {
    pub fn new(cols: u64, rows: u64) -> Mesh {
        assert!(cols > 0 && rows > 0);
        Mesh { cols, rows }
    }

    pub fn tiles(&self) -> u64 {
        self.cols * self.rows
    }

    /// Home tile of a block address.
    #[inline]
    pub fn home(&self, block: u64) -> u64 {
        let t = self.tiles();
        if t.is_power_of_two() {
            block & (t - 1)
        } else {
            block % t
        }
    }

    /// XY-routing hops between two tiles.
    #[inline]
    pub fn hops(&self, a: u64, b: u64) -> u64 {
        let ((ax, ay), (bx, by)) = if self.cols.is_power_of_two() {
            // the usual square meshes: no division
            let (s, m) = (self.cols.trailing_zeros(), self.cols - 1);
            ((a & m, a >> s), (b & m, b >> s))
        } else {
            (
                (a % self.cols, a / self.cols),
                (b % self.cols, b / self.cols),
            )
        };
        ax.abs_diff(bx) + ay.abs_diff(by)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manhattan_on_4x4() {
        let m = Mesh::new(4, 4);
        assert_eq!(m.hops(0, 0), 0);
        assert_eq!(m.hops(0, 15), 6);
        assert_eq!(m.hops(5, 6), 1);
        assert_eq!(m.hops(3, 12), 6);
        assert_eq!(m.hops(12, 3), m.hops(3, 12));
        assert_eq!(m.home(17), 1);
    }

    #[test]
    fn non_square() {
        let m = Mesh::new(3, 2);
        assert_eq!(m.tiles(), 6);
        assert_eq!(m.hops(0, 5), 3);
        assert_eq!(m.home(7), 1);
    }
}
