//! black89 §9's hardware features as `mach` protocol options, on Fig. 2's
//! tester with the Encore Multimax preset: the multicast and broadcast
//! interrupts (`protocol_options.interrupt_send`) and remotely invalidated
//! TLBs (`protocol_options.remote_invalidate`).
//!
//! Fig. 1 sends one interrupt per responder in a loop; §9's multicast
//! "replaces a for loop in the initiator's code with a small number of
//! instructions", and a broadcast interrupts every other processor,
//! "too many processors", at the same price. So the initiator saves every
//! send but one, exactly, and a broadcast costs the initiator what a
//! multicast does while the processors outside the shootdown take an
//! interrupt for nothing.

use mmulab_experiment::Spec;
use mmulab_experiment::run::run_seed;

/// Fig. 2's tester with `children` responders on `cpus` CPUs, mach
/// sending its interrupts as `send`.
fn tester(cpus: u64, children: u64, send: &str) -> Spec {
    tester_with(cpus, children, &format!("interrupt_send = \"{send}\""))
}

/// The tester with `options` in its `[protocol_options]`.
fn tester_with(cpus: u64, children: u64, options: &str) -> Spec {
    let text = format!(
        r#"
protocol = "mach"
preset = "encore-multimax-1989"
seed = 1
[machine]
cpus = {cpus}
[workload]
kind = "tester"
children = {children}
[protocol_options]
{options}
"#
    );
    Spec::parse(&text, &[], "test").expect("valid spec")
}

/// (mean initiator cycles, shootdown interrupts taken, extra broadcast
/// interrupts) of one seed, which must stay clean.
fn run(s: &Spec) -> (f64, u64, u64) {
    let r = run_seed(s, 1);
    assert_eq!(r.sim.oracle.violations, 0, "the oracle found a stale use");
    assert!(r.sim.liveness.is_none(), "{:?}", r.sim.liveness);
    let h = r
        .sim
        .hists
        .get("shootdown.user.initiator_cycles")
        .expect("the tester shot down");
    (
        h.summary().mean,
        r.sim.counters.get("interrupts.shootdown"),
        r.sim.counters.get("mach.broadcast_extra_interrupts"),
    )
}

#[test]
fn a_multicast_saves_every_send_but_one() {
    let send = tester(16, 15, "each").costs.ipi_send_cycles as f64;
    assert!(send > 0.0, "the preset prices a send");
    for children in [2u64, 8, 15] {
        let (each, each_irqs, _) = run(&tester(16, children, "each"));
        let (multi, multi_irqs, _) = run(&tester(16, children, "multicast"));
        let saved = each - multi;
        let expected = (children - 1) as f64 * send;
        assert!(
            (saved - expected).abs() <= 0.01 * expected,
            "{children} responders: each {each:.0} cycles, multicast {multi:.0}: \
             saved {saved:.0}, expected {expected:.0}"
        );
        assert_eq!(each_irqs, multi_irqs, "the same processors are interrupted");
    }
}

#[test]
fn a_broadcast_interrupts_every_other_processor_for_the_multicast_price() {
    // 3 responders on a 16-CPU machine: 12 processors outside the shootdown.
    let (multi, multi_irqs, none) = run(&tester(16, 3, "multicast"));
    let (broad, broad_irqs, extra) = run(&tester(16, 3, "broadcast"));
    assert_eq!(none, 0);
    assert!(
        extra > 0,
        "the broadcast reached processors outside the shootdown"
    );
    assert_eq!(
        broad_irqs,
        multi_irqs + extra,
        "every extra interrupt is taken"
    );
    assert!(
        (broad - multi).abs() <= 0.02 * multi,
        "the initiator waits for the responders only: multicast {multi:.0}, broadcast {broad:.0}"
    );
}

#[test]
fn remotely_invalidated_tlbs_need_no_interrupt_and_no_responder() {
    let send = tester(16, 15, "each").costs.ipi_send_cycles as f64;
    for children in [2u64, 15] {
        let remote = tester_with(16, children, "remote_invalidate = true");
        let r = run_seed(&remote, 1);
        assert_eq!(r.sim.oracle.violations, 0, "the oracle found a stale use");
        assert!(r.sim.liveness.is_none(), "{:?}", r.sim.liveness);
        let c = |n: &str| r.sim.counters.get(n);
        assert_eq!(c("interrupts.shootdown"), 0, "no shootdown interrupt");
        assert!(
            !r.sim.hists.contains_key("shootdown.user.responder_cycles"),
            "no responder"
        );
        let events = c("shootdown.user.events");
        assert!(events > 0, "the tester shot down");
        assert_eq!(
            c("tlb.remote_invalidations"),
            events * children,
            "every other TLB in use is invalidated once per shootdown"
        );
        // The initiator no longer queues, sends or waits: against Fig. 1's
        // loop it saves at least every send.
        let (each, _, _) = run(&tester(16, children, "each"));
        let (mine, _, _) = run(&remote);
        assert!(
            mine + (children as f64) * send <= each,
            "{children} responders: remote {mine:.0} cycles against Fig. 1's {each:.0}"
        );
    }
}

#[test]
fn an_unknown_send_is_refused_by_name() {
    let e = Spec::parse(
        "protocol = \"mach\"\n[workload]\nkind = \"tester\"\nchildren = 1\n[protocol_options]\ninterrupt_send = \"all\"\n",
        &[],
        "test",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("protocol_options.interrupt_send"), "{e}");
}
