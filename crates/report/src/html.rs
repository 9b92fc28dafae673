//! `DIR/index.html` of `mmulab reproduce all`: one static page, openable
//! offline, with each paper's headline, its rows, its figures (the SVGs
//! beside the page) and its not-reproduced list. A small inline script
//! checks that every figure loaded and marks the page, so that a headless
//! browser can tell a broken page from a good one.

use crate::repro::ReproReport;

/// One paper's section: its report and the figure files beside the page.
pub struct PaperPage<'a> {
    pub report: &'a ReproReport,
    pub figures: Vec<String>,
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:1400px}\
table{border-collapse:collapse;font-size:13px;margin:1em 0}\
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}\
th{background:#eee}td.num{text-align:right;font-variant-numeric:tabular-nums}\
tr.no td{background:#fde0e0}tr.plot td{color:#666}\
.headline{font-weight:bold;font-family:monospace;background:#f4f4f4;padding:.5em}\
figure{display:inline-block;margin:.5em}figure img{width:560px;border:1px solid #ddd}";

const CHECK: &str = "window.addEventListener('load',function(){\
var bad=[];document.querySelectorAll('img').forEach(function(i){\
if(!i.complete||i.naturalWidth===0){bad.push(i.getAttribute('src'));}});\
document.body.setAttribute('data-figures',bad.length?'missing: '+bad.join(' '):'ok');\
if(bad.length){console.error('missing figures: '+bad.join(' '));}});";

/// The whole page.
pub fn index_page(pages: &[PaperPage<'_>], title: &str) -> String {
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    h.push_str(&format!("<title>{}</title>", esc(title)));
    h.push_str(&format!(
        "<style>{STYLE}</style><script>{CHECK}</script></head>\n<body data-figures=\"pending\">\n"
    ));
    h.push_str(&format!("<h1>{}</h1>\n", esc(title)));
    if let Some(p) = pages.first() {
        h.push_str(&format!(
            "<p>mmulab {} (commit {}), {} run. Only <em>emergent</em> rows (simulated from inputs that do not include the number) are counted; calibrated, arithmetic and input rows are shown for the record.</p>\n",
            esc(&p.report.mmulab_version),
            esc(&p.report.git_commit),
            if p.report.quick { "a --quick" } else { "a full" }
        ));
    }
    h.push_str("<table><tr><th>paper</th><th>emergent within</th><th>emergent judged</th><th>calibrated</th><th>arithmetic</th><th>input</th><th>plot only</th><th>artefacts reproduced</th></tr>\n");
    for p in pages {
        let hl = &p.report.headline;
        h.push_str(&format!(
            "<tr><td><a href=\"#{0}\">{0}</a></td><td class=num>{1}{9}</td><td class=num>{2}</td><td class=num>{3}</td><td class=num>{4}</td><td class=num>{5}</td><td class=num>{6}</td><td class=num>{7} of {8}</td></tr>\n",
            esc(&p.report.paper),
            hl.emergent_within,
            hl.emergent_judged,
            hl.calibrated,
            hl.arithmetic,
            hl.input,
            hl.plot_only,
            hl.artefacts_reproduced,
            hl.artefacts,
            hl.consistent_text()
                .map_or(String::new(), |c| format!("<br><small>({})</small>", esc(&c)))
        ));
    }
    h.push_str("</table>\n");
    for p in pages {
        section(&mut h, p);
    }
    h.push_str("</body></html>\n");
    h
}

fn section(h: &mut String, p: &PaperPage<'_>) {
    let r = p.report;
    h.push_str(&format!("<h2 id=\"{0}\">{0}</h2>\n", esc(&r.paper)));
    h.push_str(&format!(
        "<p class=headline>{}</p>\n",
        esc(&r.headline_line())
    ));
    if !p.figures.is_empty() {
        h.push_str("<div>");
        for f in &p.figures {
            let csv = f.strip_suffix(".svg").map(|s| format!("{s}.csv"));
            h.push_str(&format!(
                "<figure><img src=\"{0}\" alt=\"{0}\"><figcaption>{0}{1}</figcaption></figure>",
                esc(f),
                csv.map_or(String::new(), |c| format!(
                    " (<a href=\"{0}\">data</a>)",
                    esc(&c)
                ))
            ));
        }
        h.push_str("</div>\n");
    }
    h.push_str("<table><tr><th>artefact</th><th>quantity</th><th>conditions</th><th>paper</th><th>mmulab</th><th>95% CI</th><th>unit</th><th>dev %</th><th>tol %</th><th>ok</th><th>kind</th><th>basis</th><th>note</th></tr>\n");
    for row in &r.rows {
        let class = match row.within {
            None => "plot",
            Some(true) => "yes",
            Some(false) => "no",
        };
        let c = row.cells();
        h.push_str(&format!(
            "<tr class={class}><td>{}</td><td>{}</td><td>{}</td><td class=num>{}</td><td class=num>{}</td><td class=num>{}</td><td>{}</td><td class=num>{}</td><td class=num>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            esc(&row.artefact),
            esc(&row.quantity),
            esc(&row.conditions_text()),
            c.paper,
            c.mmulab,
            c.ci,
            esc(&row.unit),
            c.deviation,
            c.tolerance,
            c.ok,
            row.kind.as_str(),
            row.basis.as_str(),
            esc(&row.note)
        ));
    }
    h.push_str("</table>\n");
    if !r.not_reproduced.is_empty() {
        h.push_str("<h3>Not reproduced</h3><ul>\n");
        for n in &r.not_reproduced {
            h.push_str(&format!(
                "<li><b>{}</b>: {}</li>\n",
                esc(&n.artefact),
                esc(&n.reason)
            ));
        }
        h.push_str("</ul>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repro::{Provenance, ReproRow, ReproTable};

    #[test]
    fn page_escapes_and_lists_every_part() {
        let mut t = ReproTable::default();
        t.push(ReproRow::claim("Table <1>", "a&b", None, true, "x < y").emergent());
        t.not_reproduced("Table 9", "needs Camelot's workload");
        let prov = Provenance {
            mmulab_version: "0".into(),
            git_commit: "c".into(),
        };
        let r = ReproReport::new("p", t, true, &prov).unwrap();
        let page = index_page(
            &[PaperPage {
                report: &r,
                figures: vec!["p-fig1.svg".into()],
            }],
            "t",
        );
        assert!(page.contains("Table &lt;1&gt;") && page.contains("a&amp;b"));
        assert!(page.contains("<img src=\"p-fig1.svg\""));
        assert!(page.contains("p-fig1.csv"));
        assert!(page.contains("needs Camelot&#39;s workload"));
        assert!(page.contains("p: emergent 1 of 1 within tolerance"));
    }
}
