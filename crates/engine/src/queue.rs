//! The event queue.
//!
//! Tie-break (documented and relied on for determinism): events are ordered
//! by `(time, sequence)`, where `sequence` is a counter incremented on every
//! `push`. Two events at the same cycle therefore fire in the order they were
//! scheduled (FIFO). Nothing else (no hash, no address) takes part in the
//! order, so the same pushes give the same pops on every host.

use crate::time::Cycles;
use std::collections::VecDeque;

/// A min-queue of events keyed by simulated time, FIFO among equal times.
///
/// A radix heap (Ahuja, Mehlhorn, Orlin and Tarjan 1990), which relies on
/// what a simulation guarantees anyway: no event is scheduled before the
/// last one popped. Bucket 0 holds the events at `last`, the time of the
/// last pop; bucket `i > 0` those whose
/// time first differs from `last` in bit `i - 1`. Every bucket below
/// the first non-empty one is empty, so its smallest time is the queue's.
/// A push appends to one bucket (no sift); a pop takes bucket 0's front,
/// and when bucket 0 is empty first moves the first non-empty bucket's
/// events down, each event moving down at most 64 times in its life. A
/// binary heap of a thousand events (one per CPU of a 1,024-CPU machine)
/// spent most of a run's time sifting.
///
/// The tie-break is the binary heap's `(time, sequence)` exactly: all
/// events of one time are always in one bucket (the bucket depends on the
/// time alone), appended in push order, and a move keeps their order, so
/// bucket 0 pops them first in, first out.
///
/// Beside the heap, a FIFO lane (`push_periodic`) takes events pushed in
/// time order, such as an idle CPU's next poll, always the same period
/// ahead: a thousand idle CPUs of a 1,024-CPU machine made most of its
/// events, and each crossed the heap's buckets. A pop takes the smaller
/// `(time, sequence)` of the two fronts, so the order is the same as if
/// every event went into the heap.
#[derive(Debug)]
pub struct EventQueue<E> {
    /// Bucket 0: the events at `last`, `(sequence, event)` in push order.
    at_last: VecDeque<(u64, E)>,
    /// Buckets 1..=64 (index `i - 1`): `(time, sequence, event)` in push
    /// order.
    buckets: Vec<Vec<(u64, u64, E)>>,
    /// The lane: `(time, sequence, event)`, ascending.
    lane: VecDeque<(u64, u64, E)>,
    /// Bit `i - 1` set: bucket `i` (1..=64) is not empty.
    occupied: u64,
    /// The time of the last pop from the heap (at most `now`: pops from
    /// the lane leave it).
    last: u64,
    /// The smallest time in the heap.
    min: Option<Cycles>,
    /// The smallest time queued (heap and lane), kept so that `peek_time`,
    /// read at every turn of the event loop, is a load.
    next: Option<Cycles>,
    len: usize,
    next_seq: u64,
    now: Cycles,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> EventQueue<E> {
    pub fn new() -> Self {
        EventQueue {
            at_last: VecDeque::new(),
            buckets: (0..64).map(|_| Vec::new()).collect(),
            lane: VecDeque::new(),
            occupied: 0,
            last: 0,
            min: None,
            next: None,
            len: 0,
            next_seq: 0,
            now: Cycles::ZERO,
        }
    }

    /// The bucket (1..=64) of a time after `last`.
    #[inline]
    fn bucket_of(last: u64, time: u64) -> usize {
        debug_assert!(time > last);
        64 - (time ^ last).leading_zeros() as usize
    }

    /// Schedules `event` at `time`. Scheduling in the past is a bug in the
    /// caller: time only moves forward.
    pub fn push(&mut self, time: Cycles, event: E) {
        assert!(
            time >= self.now,
            "event scheduled in the past: {time} < now {}",
            self.now
        );
        debug_assert!(self.last <= self.now.0);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.len += 1;
        if time.0 == self.last {
            self.at_last.push_back((seq, event));
        } else {
            let b = Self::bucket_of(self.last, time.0);
            self.buckets[b - 1].push((time.0, seq, event));
            self.occupied |= 1 << (b - 1);
        }
        if self.min.is_none_or(|m| time < m) {
            self.min = Some(time);
        }
        if self.next.is_none_or(|m| time < m) {
            self.next = Some(time);
        }
    }

    /// As `push`, for an event no earlier than any pushed here before
    /// (an idle CPU's next poll, a fixed period ahead of `now`): it goes
    /// into the FIFO lane. One that is earlier goes into the heap, so the
    /// order never depends on which way an event went.
    pub fn push_periodic(&mut self, time: Cycles, event: E) {
        if self.lane.back().is_some_and(|&(t, _, _)| t > time.0) {
            return self.push(time, event);
        }
        assert!(
            time >= self.now,
            "event scheduled in the past: {time} < now {}",
            self.now
        );
        // (An empty lane's first entry may be the earliest queued; later
        // ones are no earlier than the lane's front.)
        if self.lane.is_empty() && self.next.is_none_or(|m| time < m) {
            self.next = Some(time);
        }
        self.lane.push_back((time.0, self.next_seq, event));
        self.next_seq += 1;
        self.len += 1;
    }

    /// Removes and returns the earliest event, advancing `now` to its time.
    /// Inlined: returned through memory, the event was read back by the
    /// event loop in pieces that the host could not forward from the
    /// store, a stall on every event.
    #[inline]
    pub fn pop(&mut self) -> Option<(Cycles, E)> {
        if let Some(&(lane_time, lane_seq, _)) = self.lane.front() {
            let from_lane = match self.min {
                None => true,
                Some(m) if lane_time != m.0 => lane_time < m.0,
                // One time at both fronts: the earlier push first.
                Some(_) => {
                    if self.at_last.is_empty() {
                        self.refill();
                    }
                    lane_seq < self.at_last.front().expect("refilled").0
                }
            };
            if from_lane {
                let (t, _, event) = self.lane.pop_front().expect("front");
                self.len -= 1;
                debug_assert!(Cycles(t) >= self.now);
                self.now = Cycles(t);
                self.next = self.fronts_min();
                return Some((self.now, event));
            }
        }
        self.pop_heap()
    }

    /// Fills bucket 0 from the first non-empty bucket when it is empty
    /// and the heap is not: then `last` is the heap's smallest time.
    #[inline(never)]
    fn refill(&mut self) {
        if self.at_last.is_empty() && self.occupied != 0 {
            let b = self.occupied.trailing_zeros() as usize;
            let new_last = self.min.expect("not empty").0;
            let mut moving = std::mem::take(&mut self.buckets[b]);
            self.occupied &= !(1 << b);
            self.last = new_last;
            for (t, seq, e) in moving.drain(..) {
                if t == new_last {
                    self.at_last.push_back((seq, e));
                } else {
                    let nb = Self::bucket_of(new_last, t);
                    debug_assert!(nb - 1 < b);
                    self.buckets[nb - 1].push((t, seq, e));
                    self.occupied |= 1 << (nb - 1);
                }
            }
            // keep the allocation
            self.buckets[b] = moving;
        }
    }

    /// Pops the heap's earliest event.
    #[inline]
    fn pop_heap(&mut self) -> Option<(Cycles, E)> {
        if self.at_last.is_empty() && self.occupied == 0 {
            return None;
        }
        if self.at_last.is_empty() {
            self.refill();
        }
        let (_, event) = self.at_last.pop_front().expect("bucket 0 refilled");
        self.len -= 1;
        let time = Cycles(self.last);
        debug_assert!(time >= self.now);
        self.now = time;
        self.min = if !self.at_last.is_empty() {
            Some(time)
        } else if self.occupied == 0 {
            None
        } else {
            let b = self.occupied.trailing_zeros() as usize;
            self.buckets[b].iter().map(|&(t, _, _)| Cycles(t)).min()
        };
        self.next = self.fronts_min();
        Some((time, event))
    }

    /// The smaller of the heap's smallest time and the lane's front.
    #[inline]
    fn fronts_min(&self) -> Option<Cycles> {
        match (self.min, self.lane.front()) {
            (Some(m), Some(&(t, _, _))) => Some(m.min(Cycles(t))),
            (m, l) => m.or(l.map(|&(t, _, _)| Cycles(t))),
        }
    }

    #[inline]
    pub fn peek_time(&self) -> Option<Cycles> {
        debug_assert_eq!(self.next, self.fronts_min());
        self.next
    }

    /// The time of the last popped event.
    pub fn now(&self) -> Cycles {
        self.now
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of events ever scheduled (a cheap fingerprint of a run).
    pub fn scheduled(&self) -> u64 {
        self.next_seq
    }
}

/// A min-queue with `EventQueue`'s contract (pops by `(time, sequence)`,
/// the sequence counting pushes), for queues of a few entries such as one
/// user slice per CPU. Keys `(time, sequence)` are unique, so any correct
/// min-queue pops the same order. This one keeps its entries sorted: a pop
/// takes the front (advancing a head index), a push walks back from the
/// end to its place, which is near the end when (as in a simulation) a push
/// usually lands among the latest. That beats a heap's sift-down, a chain
/// of unpredictable branches, at a few dozen entries; a push is O(n), so
/// not for queues that grow large.
#[derive(Debug)]
pub struct SmallQueue<E> {
    /// `entries[head..]`, ascending by key: `time << 64 | sequence`
    /// compared as one integer. `entries[..head]` were popped.
    entries: Vec<(u128, E)>,
    head: usize,
    next_seq: u64,
    now: Cycles,
}

impl<E: Copy> Default for SmallQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: Copy> SmallQueue<E> {
    pub fn new() -> Self {
        SmallQueue {
            entries: Vec::new(),
            head: 0,
            next_seq: 0,
            now: Cycles::ZERO,
        }
    }

    /// As `EventQueue::push`. Always inlined: once per simulated
    /// reference, and a call costs as much as the usual zero-to-few swaps.
    #[inline(always)]
    pub fn push(&mut self, time: Cycles, event: E) {
        assert!(
            time >= self.now,
            "event scheduled in the past: {time} < now {}",
            self.now
        );
        let key = (time.0 as u128) << 64 | self.next_seq as u128;
        self.next_seq += 1;
        // The sequence is the largest yet: only later times go after it.
        // An insertion-sort step from the end (usually zero to a few
        // swaps) rather than `Vec::insert`'s call to memmove.
        let mut at = self.entries.len();
        self.entries.push((key, event));
        while at > self.head && self.entries[at - 1].0 > key {
            self.entries.swap(at - 1, at);
            at -= 1;
        }
    }

    /// As `EventQueue::pop`.
    #[inline]
    pub fn pop(&mut self) -> Option<(Cycles, E)> {
        let &(key, event) = self.entries.get(self.head)?;
        self.head += 1;
        if self.head == self.entries.len() {
            self.entries.clear();
            self.head = 0;
        } else if self.head >= 32 && self.head * 2 >= self.entries.len() {
            // reclaim the popped prefix now and then (amortised O(1))
            self.entries.drain(..self.head);
            self.head = 0;
        }
        let time = Cycles((key >> 64) as u64);
        debug_assert!(time >= self.now);
        debug_assert!(self.entries.get(self.head).is_none_or(|&(k, _)| k > key));
        self.now = time;
        Some((time, event))
    }

    #[inline]
    pub fn peek_time(&self) -> Option<Cycles> {
        self.entries
            .get(self.head)
            .map(|&(k, _)| Cycles((k >> 64) as u64))
    }

    /// The event `n` pops from now would return (0: the next), if no push
    /// comes first; left in place.
    #[inline]
    pub fn peek_nth(&self, n: usize) -> Option<&E> {
        self.entries.get(self.head + n).map(|(_, e)| e)
    }

    pub fn now(&self) -> Cycles {
        self.now
    }

    pub fn len(&self) -> usize {
        self.entries.len() - self.head
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn scheduled(&self) -> u64 {
        self.next_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_times_pop_in_push_order() {
        let mut q = EventQueue::new();
        q.push(Cycles(5), "a");
        q.push(Cycles(3), "b");
        q.push(Cycles(5), "c");
        q.push(Cycles(3), "d");
        let order: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, vec!["b", "d", "a", "c"]);
    }

    #[test]
    #[should_panic(expected = "in the past")]
    fn scheduling_in_the_past_is_refused() {
        let mut q = EventQueue::new();
        q.push(Cycles(10), ());
        q.pop();
        q.push(Cycles(9), ());
    }

    /// The binary heap `EventQueue` was until the radix heap replaced it:
    /// the reference order, `(time, sequence)`.
    struct HeapQueue<E> {
        heap: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64, usize)>>,
        events: Vec<Option<E>>,
        next_seq: u64,
    }
    impl<E> HeapQueue<E> {
        fn push(&mut self, t: Cycles, e: E) {
            self.events.push(Some(e));
            self.heap.push(std::cmp::Reverse((
                t.0,
                self.next_seq,
                self.events.len() - 1,
            )));
            self.next_seq += 1;
        }
        fn pop(&mut self) -> Option<(Cycles, E)> {
            let std::cmp::Reverse((t, _, i)) = self.heap.pop()?;
            Some((Cycles(t), self.events[i].take().unwrap()))
        }
        fn peek_time(&self) -> Option<Cycles> {
            self.heap.peek().map(|r| Cycles(r.0.0))
        }
    }

    /// The reference queue and the radix queue, both empty.
    fn empty_pair() -> (HeapQueue<u64>, EventQueue<u64>) {
        let a = HeapQueue {
            heap: Default::default(),
            events: Vec::new(),
            next_seq: 0,
        };
        (a, EventQueue::new())
    }

    /// One pop from each, which must agree (time, event, `now`, length);
    /// returns the time popped.
    fn pop_both(a: &mut HeapQueue<u64>, b: &mut EventQueue<u64>, seed: u64) -> Option<u64> {
        assert_eq!(a.peek_time(), b.peek_time(), "seed {seed}");
        let (x, y) = (a.pop(), b.pop());
        assert_eq!(x, y, "seed {seed}");
        if let Some((t, _)) = x {
            assert_eq!(b.now(), t);
        }
        assert_eq!(a.heap.len(), b.len());
        x.map(|(t, _)| t.0)
    }

    /// Pops both to the end, in the same order, and leaves both empty.
    fn drain_both(a: &mut HeapQueue<u64>, b: &mut EventQueue<u64>, seed: u64) {
        while pop_both(a, b, seed).is_some() {}
        assert!(b.is_empty());
        assert_eq!(b.peek_time(), None);
    }

    /// The radix heap pops what the binary heap popped, ties included, on
    /// random simulations: near and far times, bursts at one time, pushes
    /// between `now` and the queue's smallest time, the queue running dry.
    #[test]
    fn radix_queue_matches_binary_heap() {
        for seed in 0..40 {
            let mut rng = crate::SimRng::new(seed, "radix");
            let (mut a, mut b) = empty_pair();
            let mut now = 0u64;
            let mut id = 0u64;
            let span = [2, 16, 1000, 1 << 20, 1 << 40][seed as usize % 5];
            for _ in 0..5000 {
                for _ in 0..rng.below(4) {
                    let t = match rng.below(4) {
                        0 => now,
                        1 => now + rng.below(3),
                        _ => now + rng.below(span),
                    };
                    a.push(Cycles(t), id);
                    b.push(Cycles(t), id);
                    id += 1;
                }
                if let Some(t) = pop_both(&mut a, &mut b, seed) {
                    now = t;
                }
            }
            drain_both(&mut a, &mut b, seed);
        }
    }

    /// Events through the lane pop where the binary heap pops them, ties
    /// with the heap's events included: periodic pushes a fixed period
    /// after `now` (small periods, so that they meet other events at one
    /// time), now and then one out of order, which goes to the heap.
    #[test]
    fn lane_and_heap_pop_in_binary_heap_order() {
        for seed in 0..40 {
            let mut rng = crate::SimRng::new(seed, "lane");
            let (mut a, mut b) = empty_pair();
            let period = [1, 3, 8, 1500][seed as usize % 4];
            let (mut now, mut id, mut through_lane) = (0u64, 0u64, 0usize);
            for _ in 0..5000 {
                for _ in 0..rng.below(4) {
                    let t = now + rng.below(2 * period);
                    if rng.below(3) == 0 {
                        a.push(Cycles(t), id);
                        b.push(Cycles(t), id);
                    } else {
                        // Mostly `now + period`; one in ten earlier.
                        let t = if rng.below(10) == 0 {
                            t.min(now + period)
                        } else {
                            now + period
                        };
                        let before = b.lane.len();
                        a.push(Cycles(t), id);
                        b.push_periodic(Cycles(t), id);
                        through_lane += b.lane.len() - before;
                    }
                    id += 1;
                }
                if let Some(t) = pop_both(&mut a, &mut b, seed) {
                    now = t;
                }
            }
            drain_both(&mut a, &mut b, seed);
            assert!(
                through_lane > 1000,
                "seed {seed}: {through_lane} through the lane"
            );
        }
    }

    /// Same pushes, same pops as `EventQueue`, interleaved as a simulation
    /// does (pop one, push a later one).
    #[test]
    fn small_queue_matches_event_queue() {
        let mut rng = crate::SimRng::new(3, "queue");
        let mut a = EventQueue::new();
        let mut b = SmallQueue::new();
        for i in 0..20u64 {
            let t = Cycles(rng.below(8));
            a.push(t, i);
            b.push(t, i);
        }
        for i in 20..2000u64 {
            assert_eq!(a.peek_time(), b.peek_time());
            let (x, y) = (a.pop(), b.pop());
            assert_eq!(x, y);
            let now = x.unwrap().0;
            for j in 0..rng.below(3) {
                let t = now + Cycles(rng.below(5));
                a.push(t, i * 10 + j);
                b.push(t, i * 10 + j);
            }
            if b.is_empty() {
                break;
            }
        }
        while let Some(x) = a.pop() {
            assert_eq!(Some(x), b.pop());
        }
        assert_eq!(b.pop(), None);
        assert_eq!(a.scheduled(), b.scheduled());
    }
}
