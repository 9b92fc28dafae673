//! The event queue.
//!
//! Tie-break (documented and relied on for determinism): events are ordered
//! by `(time, sequence)`, where `sequence` is a counter incremented on every
//! `push`. Two events at the same cycle therefore fire in the order they were
//! scheduled (FIFO). Nothing else (no hash, no address) takes part in the
//! order, so the same pushes give the same pops on every host.

use crate::time::Cycles;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Debug)]
struct Entry<E> {
    key: (Cycles, u64),
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

/// A min-queue of events keyed by simulated time, FIFO among equal times.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Reverse<Entry<E>>>,
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
            heap: BinaryHeap::new(),
            next_seq: 0,
            now: Cycles::ZERO,
        }
    }

    /// Schedules `event` at `time`. Scheduling in the past is a bug in the
    /// caller: time only moves forward.
    pub fn push(&mut self, time: Cycles, event: E) {
        assert!(
            time >= self.now,
            "event scheduled in the past: {time} < now {}",
            self.now
        );
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Reverse(Entry {
            key: (time, seq),
            event,
        }));
    }

    /// Removes and returns the earliest event, advancing `now` to its time.
    pub fn pop(&mut self) -> Option<(Cycles, E)> {
        let Reverse(entry) = self.heap.pop()?;
        debug_assert!(entry.key.0 >= self.now);
        self.now = entry.key.0;
        Some((entry.key.0, entry.event))
    }

    pub fn peek_time(&self) -> Option<Cycles> {
        self.heap.peek().map(|Reverse(e)| e.key.0)
    }

    /// The time of the last popped event.
    pub fn now(&self) -> Cycles {
        self.now
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
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
