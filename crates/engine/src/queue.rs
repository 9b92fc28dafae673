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
}
