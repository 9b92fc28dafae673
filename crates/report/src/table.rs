//! Plain-text tables with aligned columns.

pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(
            cells.len(),
            self.header.len(),
            "row width differs from header"
        );
        self.rows.push(cells);
    }

    /// The table with every line at most `max` characters where it can
    /// be: the widest columns are narrowed (to 12 characters at least)
    /// until the row fits, and their text wraps at spaces onto further
    /// lines of the row (`mmulab list` was 378 characters wide).
    pub fn render_width(&self, max: usize) -> String {
        const MIN: usize = 12;
        let n = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let total = |w: &[usize]| w.iter().sum::<usize>() + 2 * (n - 1);
        while total(&widths) > max {
            let (i, &w) = widths
                .iter()
                .enumerate()
                .max_by_key(|(_, w)| **w)
                .expect("columns");
            if w <= MIN {
                break;
            }
            widths[i] = w.saturating_sub(total(&widths) - max).max(MIN);
        }
        let mut wrapped = Table::new(&self.header.iter().map(|h| h.as_str()).collect::<Vec<_>>());
        for r in &self.rows {
            let cells: Vec<Vec<String>> = r.iter().zip(&widths).map(|(c, &w)| wrap(c, w)).collect();
            let height = cells.iter().map(|c| c.len()).max().unwrap_or(1);
            for line in 0..height {
                wrapped.rows.push(
                    cells
                        .iter()
                        .map(|c| c.get(line).cloned().unwrap_or_default())
                        .collect(),
                );
            }
        }
        wrapped.render()
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |cells: &[String], out: &mut String| {
            let mut s = String::new();
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                s.push_str(c);
                if i + 1 < cells.len() {
                    s.push_str(&" ".repeat(w - c.chars().count()));
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(&self.header, &mut out);
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(&rule, &mut out);
        for r in &self.rows {
            line(r, &mut out);
        }
        out
    }
}

/// `text` in lines of at most `width` characters, broken at spaces (a word
/// longer than `width` is cut).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let mut word: Vec<char> = word.chars().collect();
        loop {
            let used = cur.chars().count();
            let sep = usize::from(used > 0);
            if used + sep + word.len() <= width {
                if sep == 1 {
                    cur.push(' ');
                }
                cur.extend(word.iter());
                break;
            }
            if used > 0 {
                lines.push(std::mem::take(&mut cur));
                continue;
            }
            // A word longer than the line: cut it.
            let rest = word.split_off(width);
            lines.push(word.into_iter().collect());
            word = rest;
        }
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn columns_align() {
        let mut t = Table::new(&["a", "bbb"]);
        t.row(vec!["xx".into(), "y".into()]);
        assert_eq!(t.render(), "a   bbb\n--  ---\nxx  y\n");
    }

    #[test]
    fn render_width_wraps_long_columns_and_keeps_every_word() {
        let mut t = Table::new(&["name", "about", "from"]);
        let about = "one two three four five six seven eight nine ten eleven twelve thirteen";
        let from = "Table 1 of the paper, section 5, and the appendix";
        t.row(vec!["x".into(), about.into(), from.into()]);
        t.row(vec!["longer-name".into(), "short".into(), "here".into()]);
        let out = t.render_width(50);
        assert!(out.lines().all(|l| l.chars().count() <= 50), "{out}");
        let all: Vec<&str> = out
            .lines()
            .skip(2)
            .flat_map(|l| l.split_whitespace())
            .collect();
        for w in about.split(' ').chain(from.split(' ')) {
            assert!(all.contains(&w), "{w} lost: {out}");
        }
        // A table that fits is left as it is.
        assert_eq!(t.render_width(1000), t.render());
    }
}
