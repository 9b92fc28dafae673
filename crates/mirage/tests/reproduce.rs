//! The reproduction: it runs, it is deterministic, and its specs reject
//! unknown keys and impossible values by name.

use std::collections::BTreeMap;

use mmulab_mirage::reproduce::Fig8Points;
use mmulab_mirage::sim::Preset;
use mmulab_mirage::spec::{self, Fig7Spec, NSiteSpec, ReadWritersRun, Table3Spec};
use mmulab_mirage::{Error, reproduce};
use mmulab_report::{Basis, Experiments, Provenance, ReproReport, RowKind};

/// Fig. 8's points over `deltas` and seed 0, run here (`mmulab reproduce
/// fleisch89` runs experiments/fleisch89/fig8.sweep.toml through the sweep
/// engine instead; tests/sweep.rs checks that file).
fn fig8_here(deltas: &[u32]) -> Result<Fig8Points, Error> {
    let base = Experiments::Embedded
        .read("fleisch89/paper-data/fig8.toml")
        .unwrap();
    let rates = deltas
        .iter()
        .map(|&d| {
            let values = BTreeMap::from([("delta_ticks".to_string(), toml::Value::from(d))]);
            let run = ReadWritersRun::of("fig8.toml", &base, &values)?;
            Ok(vec![run.run(0).map_err(Error::Liveness)?.instr_per_s])
        })
        .collect::<Result<_, Error>>()?;
    Ok(Fig8Points {
        deltas: deltas.to_vec(),
        first_seed: 0,
        rates,
    })
}

#[test]
fn quick_reproduction_writes_json_and_svgs_and_is_deterministic() {
    let dir = std::env::temp_dir().join(format!("mirage-repro-{}", std::process::id()));
    let mut lines = Vec::new();
    let src = Experiments::Embedded;
    let deltas = [1, 10, 60, 120, 600, 1200];
    let table = reproduce(
        &src,
        true,
        Some(&dir),
        &mut |l| lines.push(l.to_string()),
        &mut || fig8_here(&deltas),
    )
    .expect("reproduce");
    assert!(!lines.is_empty());
    assert!(dir.join("fleisch89-fig7.svg").exists() && dir.join("fleisch89-fig8.svg").exists());
    // Each figure draws the paper's points as a series of their own.
    for fig in ["fleisch89-fig7.csv", "fleisch89-fig8.csv"] {
        let csv = std::fs::read_to_string(dir.join(fig)).expect("a CSV beside the SVG");
        assert!(csv.lines().any(|l| l.contains(",paper,")), "{fig}: {csv}");
    }
    let again = reproduce(&src, true, Some(&dir), &mut |_| {}, &mut || {
        fig8_here(&deltas)
    })
    .expect("reproduce again");
    assert_eq!(
        serde_json::to_string(&table).unwrap(),
        serde_json::to_string(&again).unwrap(),
        "same specs, same rows"
    );
    if std::env::var_os("MIRAGE_PRINT").is_some() {
        for r in &table.rows {
            eprintln!("{r:?}");
        }
        eprintln!("{}", mmulab_mirage::reproduce::pingpong_timeline(0));
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The contract: every row has a basis, the calibration is the preset's
    // table, and no row of a fitted artefact is emergent.
    assert_eq!(table.calibration, Preset::vax_locus_1989().calibration());
    let prov = Provenance {
        mmulab_version: "test".into(),
        git_commit: "test".into(),
    };
    let report = ReproReport::new("fleisch89", table, true, &prov).expect("the row contract");
    let basis = |artefact: &str, quantity: &str| {
        report
            .rows
            .iter()
            .find(|r| r.artefact == artefact && r.quantity == quantity)
            .unwrap_or_else(|| panic!("no row {artefact} / {quantity}"))
            .basis
    };
    assert_eq!(basis("Table 3", "using site total"), Basis::Input);
    assert_eq!(basis("§7.2 single site", "cycle rate"), Basis::Emergent);
    assert_eq!(
        basis("§7.2 single site", "cycle rate with yield()"),
        Basis::Calibrated
    );
    assert_eq!(basis("§7.3", "length of a Δ sleep"), Basis::Calibrated);
    assert_eq!(basis("§7.3", "library Δ sleeps per cycle"), Basis::Emergent);
    assert_eq!(basis("Fig. 8", "Δ of the peak"), Basis::Emergent);
    assert_eq!(basis("Fig. 7", "Δ where the curves cross"), Basis::Input);
    assert_eq!(basis("Fig. 8", "peak throughput"), Basis::Calibrated);
    assert_eq!(basis("§7.2", "messages per cycle"), Basis::Emergent);
    assert!(
        report
            .rows
            .iter()
            .filter(|r| r.kind != RowKind::PlotOnly)
            .all(|r| !r.unit.is_empty()),
        "every judged row has a unit"
    );
    assert!(!report.not_reproduced.is_empty());
}

#[test]
fn a_read_writers_run_takes_its_base_and_names_bad_keys() {
    let base = Experiments::Embedded
        .read("fleisch89/paper-data/fig8.toml")
        .unwrap();
    let of = |pairs: &[(&str, toml::Value)]| {
        let values: BTreeMap<String, toml::Value> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        ReadWritersRun::of("fig8.toml", &base, &values)
    };
    let r = of(&[("delta_ticks", 600.into())]).unwrap();
    assert_eq!(
        (r.delta_ticks, r.loop_s, r.stagger_s, r.third_site_library),
        (600, 10.0, 0.5, false),
        "the base's setup"
    );
    let r = of(&[("delta_ticks", 6.into()), ("loop_s", 2.5.into())]).unwrap();
    assert_eq!((r.delta_ticks, r.loop_s), (6, 2.5));
    for (pairs, key, want) in [
        (vec![], "delta_ticks", "missing"),
        (
            vec![("delta_ticks", (-1).into())],
            "delta_ticks",
            "0..=5184000",
        ),
        (vec![("delta_ticks", "a".into())], "delta_ticks", "expected"),
        (
            vec![("delta_ticks", 1.into()), ("deltas", 1.into())],
            "deltas",
            "not a key of a read-writers run",
        ),
        (
            vec![("delta_ticks", 1.into()), ("loop_s", 4000.into())],
            "loop_s",
            "at most 3600",
        ),
        (
            vec![("delta_ticks", 1.into()), ("preset", "vax".into())],
            "preset",
            "unknown preset",
        ),
        (
            vec![("delta_ticks", 1.into()), ("third_site_library", 1.into())],
            "third_site_library",
            "true or false",
        ),
    ] {
        let err = of(&pairs).unwrap_err();
        assert!(
            matches!(&err, Error::Invalid { key: k, .. } if k == key)
                && err.to_string().contains(want),
            "{pairs:?}: {err}"
        );
    }
    // The run is the reproduction's: the same seed, the same throughput.
    let r = of(&[("delta_ticks", 600.into())]).unwrap();
    let p = Preset::vax_locus_1989();
    let setup = mmulab_mirage::runs::ReadWritersSetup {
        third_site_library: false,
        stagger_s: 0.5,
    };
    assert_eq!(
        r.run(1).unwrap().instr_per_s,
        mmulab_mirage::runs::read_writers(&p, 600, 10.0, &setup, 1).unwrap()
    );
}

#[test]
fn unknown_key_is_named() {
    let text = Experiments::Embedded
        .read("fleisch89/paper-data/table3.toml")
        .unwrap();
    let err =
        spec::parse::<Table3Spec>("table3.toml", &format!("{text}\nbogus_knob = 3\n")).unwrap_err();
    assert!(err.to_string().contains("bogus_knob"), "{err}");
}

#[test]
fn impossible_values_are_named() {
    let text = Experiments::Embedded
        .read("fleisch89/paper-data/fig7.toml")
        .unwrap();
    let s: Fig7Spec = spec::parse("fig7.toml", &text.replace("trials = 60", "trials = 2")).unwrap();
    let err = s.validate("fig7.toml").unwrap_err();
    assert!(
        matches!(&err, Error::Invalid { key, .. } if key == "trials"),
        "{err}"
    );
    let text = Experiments::Embedded
        .read("fleisch89/paper-data/nsite.toml")
        .unwrap();
    let s: NSiteSpec = spec::parse(
        "nsite.toml",
        &text.replace("delta_ticks = 12", "delta_ticks = 0"),
    )
    .unwrap();
    let err = s.validate("nsite.toml").unwrap_err();
    assert!(err.to_string().contains("delta_ticks"), "{err}");
    let bad_type = spec::parse::<Table3Spec>("table3.toml", "artefact = 3").unwrap_err();
    assert!(bad_type.to_string().contains("artefact"), "{bad_type}");
}

/// §7.2's counts against every reading of Table 1 in a family of
/// ambiguities the text leaves open (docs/papers/fleisch89.md, "Why the
/// §7.2 counts fail"). An abstract trace of Fig. 4's two-site cycle: P1 and
/// P2 each read the other's word and write their own; a process faults only
/// when its site lacks the access. Exactly one family of readings gives the
/// paper's 3 page and 6 short messages with two faults at the library's
/// site: optimization 2 only for a writer beside the library (a remote
/// writer recalled for a reader drops its copy, and its polling process
/// faults again) with reader invalidations not acknowledged. Both depart
/// from the paper's protocol, so the model does not take them.
mod readings {
    use std::collections::BTreeSet;

    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum Opt1 {
        /// A reader in the old read set gets a notification (Table 1).
        Any,
        /// Only a downgraded writer is upgraded without a page.
        Downgraded,
        /// Only the site beside the library.
        LibrarySite,
        /// Only a site away from the library.
        Remote,
        /// Every write grant carries a page.
        Never,
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum Opt2 {
        /// Table 1 and optimization 2: every downgraded writer keeps read
        /// access.
        Any,
        /// Only a writer at the library's site keeps it (the library
        /// downgrades it in place); a remote clock site that accepts the
        /// library's invalidation drops its copy (§6.1's "1) invalidates the
        /// local page").
        LibrarySiteWriter,
        /// No writer keeps read access.
        Never,
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum Race {
        None,
        /// P2's read request is served before P1 runs its write.
        ReadBeforeP1Writes,
        /// P1's read recall reaches P2 before P2 runs its write.
        ReadBeforeP2Writes,
    }

    #[derive(Clone, Copy, Debug)]
    pub struct Reading {
        pub library: u8,
        pub opt1: Opt1,
        /// Optimization 2: which downgraded writers keep read access.
        pub opt2: Opt2,
        /// The clock site of a read set made by a downgrade: the new reader
        /// (else the downgraded writer).
        pub clock_new_reader: bool,
        pub acks: bool,
        /// The clock site reports completion to a library it sent nothing to.
        pub done: bool,
        /// The clock check is a query and reply of its own.
        pub check_query: bool,
        pub race: Race,
    }

    #[derive(Default, Debug, PartialEq)]
    pub struct Counts {
        pub pages: u32,
        pub shorts: u32,
        pub library_site_faults: u32,
        pub other_faults: u32,
        /// Arrivals that install, invalidate (a recall or an invalidation)
        /// or upgrade a page: §7.2's "input interrupts".
        pub inputs: u32,
    }

    #[derive(Clone, Copy, PartialEq)]
    enum H {
        N,
        R,
        W,
    }

    struct St {
        held: [H; 3],
        clock: u8,
        readers: BTreeSet<u8>,
        downgraded: u8,
        c: Counts,
    }

    /// A message; `input` when its arrival installs, invalidates or
    /// upgrades (a page, a recall, an invalidation, a notification), not
    /// when it is a request, an acknowledgement or a report.
    fn msg(st: &mut St, from: u8, to: u8, page: bool) {
        send(st, from, to, page, page);
    }

    fn send(st: &mut St, from: u8, to: u8, page: bool, input: bool) {
        if from != to {
            if page {
                st.c.pages += 1;
            } else {
                st.c.shorts += 1;
            }
            if input {
                st.c.inputs += 1;
            }
        }
    }

    fn fault(v: &Reading, st: &mut St, s: u8, write: bool) {
        let lib = v.library;
        if s == lib {
            st.c.library_site_faults += 1;
        } else {
            st.c.other_faults += 1;
            send(st, s, lib, false, false); // the request
        }
        let cs = st.clock;
        let writer = (1..=2).find(|&x| st.held[x as usize] == H::W);
        if !write && writer.is_none() {
            // Readers + reader: no clock check; the clock site, told of the
            // new reader, sends the page.
            send(st, lib, cs, false, true);
            msg(st, cs, s, true);
            st.held[s as usize] = H::R;
            st.readers.insert(s);
            return;
        }
        if cs != lib {
            send(st, lib, cs, false, true); // the invalidation (clock check)
            if v.check_query {
                send(st, cs, lib, false, false);
            }
        }
        if write {
            let others: Vec<u8> = st
                .readers
                .iter()
                .copied()
                .filter(|&r| r != s && r != cs)
                .collect();
            for r in others {
                send(st, cs, r, false, true);
                if v.acks {
                    send(st, r, cs, false, false);
                }
                st.held[r as usize] = H::N;
            }
            if cs != s {
                let opt1 = match v.opt1 {
                    Opt1::Any => true,
                    Opt1::Downgraded => s == st.downgraded,
                    Opt1::LibrarySite => s == lib,
                    Opt1::Remote => s != lib,
                    Opt1::Never => false,
                };
                let upgrade = st.readers.contains(&s) && opt1;
                st.held[cs as usize] = H::N;
                send(st, cs, s, !upgrade, true);
            }
            if v.done && cs != lib && s != lib {
                send(st, cs, lib, false, false);
            }
            st.held[s as usize] = H::W;
            st.clock = s;
            st.readers.clear();
        } else {
            let w = writer.expect("a reader faults on a written page");
            let keeps = match v.opt2 {
                Opt2::Any => true,
                Opt2::LibrarySiteWriter => w == lib,
                Opt2::Never => false,
            };
            st.held[w as usize] = if keeps { H::R } else { H::N };
            msg(st, w, s, true);
            st.held[s as usize] = H::R;
            st.readers = if keeps { [w, s].into() } else { [s].into() };
            st.downgraded = w;
            st.clock = if keeps && !v.clock_new_reader { w } else { s };
            if v.done && w != lib && s != lib {
                send(st, w, lib, false, false);
            }
        }
    }

    fn need(v: &Reading, st: &mut St, s: u8, write: bool) {
        let h = st.held[s as usize];
        if !(h == H::W || (!write && h == H::R)) {
            fault(v, st, s, write);
        }
    }

    /// The counts of the fourth cycle (the first ones warm up).
    pub fn cycle(v: &Reading) -> Counts {
        let mut st = St {
            held: [H::N, H::W, H::N],
            clock: 1,
            readers: BTreeSet::new(),
            downgraded: 0,
            c: Counts::default(),
        };
        for _ in 0..3 {
            one(v, &mut st);
        }
        st.c = Counts::default();
        one(v, &mut st);
        st.c
    }

    fn one(v: &Reading, st: &mut St) {
        need(v, st, 1, true); // P1 writes its word
        if v.race == Race::ReadBeforeP1Writes && st.held[2] == H::N {
            need(v, st, 2, false);
            need(v, st, 1, true);
        }
        need(v, st, 1, false); // P1 polls
        need(v, st, 2, false); // P2 reads CHECKVAL
        need(v, st, 1, false);
        need(v, st, 2, true); // P2 writes its word
        if v.race == Race::ReadBeforeP2Writes && st.held[1] == H::N {
            need(v, st, 1, false);
            need(v, st, 2, true);
        }
        need(v, st, 2, false); // P2 reads on
        need(v, st, 1, false); // P1 reads CHECKVAL+1
        need(v, st, 2, false);
    }

    pub fn all() -> Vec<Reading> {
        let mut v = Vec::new();
        for library in [1, 2] {
            for opt1 in [
                Opt1::Any,
                Opt1::Downgraded,
                Opt1::LibrarySite,
                Opt1::Remote,
                Opt1::Never,
            ] {
                for opt2 in [Opt2::Any, Opt2::LibrarySiteWriter, Opt2::Never] {
                    for bits in 0..16u32 {
                        for race in [
                            Race::None,
                            Race::ReadBeforeP1Writes,
                            Race::ReadBeforeP2Writes,
                        ] {
                            v.push(Reading {
                                library,
                                opt1,
                                opt2,
                                clock_new_reader: bits & 1 != 0,
                                acks: bits & 2 != 0,
                                done: bits & 4 != 0,
                                check_query: bits & 8 != 0,
                                race,
                            });
                        }
                    }
                }
            }
        }
        v
    }
}

#[test]
fn section_7_2s_counts_need_two_departures_from_table_1() {
    use readings::*;
    // The simulator's reading gives its own counts.
    let model = Reading {
        library: 1,
        opt1: Opt1::Any,
        opt2: Opt2::Any,
        clock_new_reader: false,
        acks: true,
        done: true,
        check_query: false,
        race: Race::None,
    };
    assert_eq!(
        cycle(&model),
        Counts {
            pages: 2,
            shorts: 6,
            library_site_faults: 2,
            other_faults: 2,
            inputs: 6,
        }
    );
    let p = Preset::vax_locus_1989();
    let r =
        mmulab_mirage::runs::ping_pong(&p, mmulab_mirage::runs::Layout::TwoSites, 0, true, 40, 0)
            .expect("runs");
    assert_eq!(
        (
            r.mean_per_cycle("messages_page"),
            r.mean_per_cycle("messages_short"),
            r.mean_per_cycle("local_faults"),
            r.mean_per_cycle("request_faults"),
            r.mean_per_cycle("input_interrupts")
        ),
        (2.0, 6.0, 2.0, 2.0, 6.0),
        "the simulated core agrees with the abstract trace"
    );
    // §7.2: "9 messages ... Three of these message are large responses ...
    // the other 6 are short messages"; "two faults are generated locally".
    let all = all();
    assert_eq!(all.len(), 1440);
    let paper = |c: &Counts| (c.pages, c.shorts, c.library_site_faults) == (3, 6, 2);
    let hits: Vec<&Reading> = all.iter().filter(|v| paper(&cycle(v))).collect();
    // Every reading that gives them applies optimization 2 only to a writer
    // beside the library, acknowledges no invalidation, has no race, and
    // needs neither a separate clock-check query nor completion reports.
    assert!(!hits.is_empty());
    for v in &hits {
        assert_eq!(
            (v.opt2, v.acks, v.race, v.check_query),
            (Opt2::LibrarySiteWriter, false, Race::None, false),
            "{v:?}"
        );
        // With them come §7.2's other counts: 6 input interrupts (3
        // installs, 2 invalidations, 1 upgrade) and five faults, the three
        // of process 2's site each a request to the remote library; the
        // paper's "5 interrupts that request remote pages" are then all
        // five faults, the two local ones charged again for their service.
        let c = cycle(v);
        assert_eq!((c.inputs, c.other_faults), (6, 3), "{v:?}");
    }
    // Under Table 1 with both optimizations, a third page comes only with
    // a race, and a race makes a third fault at the library's site.
    for v in all
        .iter()
        .filter(|v| v.opt2 == Opt2::Any && v.opt1 == Opt1::Any)
    {
        let c = cycle(v);
        assert_eq!(c.pages == 3, v.race != Race::None, "{v:?}");
        assert!(c.pages == 2 || c.library_site_faults == 3, "{v:?} {c:?}");
    }
    // Without the unacknowledged invalidations, the same readings send a
    // tenth message.
    for v in &hits {
        let acked = Reading { acks: true, ..**v };
        let c = cycle(&acked);
        assert_eq!((c.pages, c.shorts), (3, 7), "{acked:?}");
    }
    if std::env::var_os("MIRAGE_PRINT").is_some() {
        let mut tally = std::collections::BTreeMap::new();
        for v in &all {
            let c = cycle(v);
            let k = (c.pages + c.shorts, c.pages, c.shorts, c.library_site_faults);
            *tally.entry(k).or_insert(0) += 1;
        }
        for (k, n) in tally {
            eprintln!("(messages, pages, shorts, library-site faults) {k:?}: {n} readings");
        }
        for v in all.iter().filter(|v| {
            let c = cycle(v);
            c.pages == 3 && c.library_site_faults == 2
        }) {
            eprintln!("{v:?} {:?}", cycle(v));
        }
    }
}
