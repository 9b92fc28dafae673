//! 2D mesh of the directory system (Table 1: "2D mesh (directory)").
//!
//! Core `c` sits on tile `c` (row-major); the home of a block is tile
//! `block mod tiles` (block-interleaved L2 banks, each with its slice of the
//! directory). Distance is dimension-ordered (XY) routing: Manhattan hops.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mesh {
    pub cols: u64,
    pub rows: u64,
    /// Precomputed for the hot path (every miss prices its transaction):
    /// `log2 cols` when `cols` is a power of two (the usual square meshes:
    /// no division), and `cols × rows - 1` when the tile count is one.
    col_shift: Option<u32>,
    tile_mask: Option<u64>,
}

impl Mesh {
    pub fn new(cols: u64, rows: u64) -> Mesh {
        assert!(cols > 0 && rows > 0);
        let tiles = cols * rows;
        Mesh {
            cols,
            rows,
            col_shift: cols.is_power_of_two().then(|| cols.trailing_zeros()),
            tile_mask: tiles.is_power_of_two().then(|| tiles - 1),
        }
    }

    pub fn tiles(&self) -> u64 {
        self.cols * self.rows
    }

    /// Home tile of a block address.
    #[inline]
    pub fn home(&self, block: u64) -> u64 {
        match self.tile_mask {
            Some(m) => block & m,
            None => block % self.tiles(),
        }
    }

    /// XY-routing hops between two tiles.
    #[inline]
    pub fn hops(&self, a: u64, b: u64) -> u64 {
        let ((ax, ay), (bx, by)) = match self.col_shift {
            Some(s) => {
                let m = self.cols - 1;
                ((a & m, a >> s), (b & m, b >> s))
            }
            None => (
                (a % self.cols, a / self.cols),
                (b % self.cols, b / self.cols),
            ),
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
