//! A driver that can drive no more: its registration lapsed (slashed or unstaked below the
//! minimum), so every stage refuses its micro-batches (`core/requests.rs`). Left alone it
//! would re-send them forever and never report its end, and a swarm would wait for it.

use std::time::Instant;

use super::*;

impl Pipeline {
    /// Driver: stops for good. Its micro-batches in progress are given up (a gradient that
    /// still comes for one is declined unpenalised, as a slow answer is), no batch is asked
    /// for again, and it reports [`NodeEvent::Finished`] with `reason` at the steps it took.
    /// Nothing on other stages, nor on a driver that finished already.
    pub fn stop_driving(&mut self, reason: String, now: Instant) -> Vec<Action> {
        if !self.is_first() || self.finished {
            return Vec::new();
        }
        self.finished = true;
        self.drain();
        let own: BTreeSet<MicroBatchId> = self
            .stash
            .keys()
            .chain(self.outstanding.keys())
            .filter(|mb| mb.origin == self.node)
            .copied()
            .collect();
        for mb in &own {
            // A job the engine runs for it now finds nothing to send on.
            self.stash.remove(mb);
            if let Some(out) = self.outstanding.remove(mb)
                && let (Some(to), SendState::Sending | SendState::Accepted) = (out.to, out.state)
            {
                self.release(&to);
            }
            self.slots.unassign(mb);
        }
        self.driver_steps.clear();
        vec![
            self.warning(now, format!("the driver stops: {reason}")),
            Action::Event(NodeEvent::Finished {
                steps: self.steps_done,
                reason: Some(reason),
                time_ms: self.cfg.clock.unix_ms(now),
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{World, batch, driver, replica};
    use super::*;

    #[test]
    fn a_stopped_driver_gives_up_its_micro_batches_and_asks_for_nothing_more() {
        let mut w = World::new(driver(2));
        let next = NodeId([7; 32]);
        w.beat(next);
        let start = w.p.start();
        w.handle(start);
        let first = w.p.on_batch(0, batch(0), Vec::new(), w.now);
        w.handle(first);
        assert_eq!(w.sent.len(), 2, "both micro-batches went downstream");
        let stopped = w.p.stop_driving("deregistered".into(), w.now);
        let finished: Vec<_> = stopped
            .iter()
            .filter_map(|a| match a {
                Action::Event(NodeEvent::Finished { steps, reason, .. }) => {
                    Some((*steps, reason.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(finished, [(0, Some("deregistered".to_string()))]);
        assert!(w.p.finished());
        assert!(w.p.idle(), "nothing is left in progress");
        // A second stop says nothing more.
        assert!(w.p.stop_driving("again".into(), w.now).is_empty());
        // A batch asked for before the stop starts nothing; nothing is re-sent once the
        // gradient wait (1 s) has passed.
        assert!(w.p.on_batch(1, batch(1), Vec::new(), w.now).is_empty());
        let sent_before = w.sent.len();
        w.beat(next);
        w.tick(Duration::from_secs(2));
        assert_eq!(
            w.sent.len(),
            sent_before,
            "a given-up micro-batch was re-sent"
        );
        // The downstream replica's late gradient is declined, and costs it nothing (as any
        // slow answer within three gradient waits of its send).
        let late = w.answer(0);
        assert!(matches!(late, Ack::Rejected(_)), "{late:?}");
        assert!(w.penalties.is_empty(), "{:?}", w.penalties);
        assert_eq!(w.p.steps_done(), 0);
    }

    #[test]
    fn only_a_driver_stops_driving() {
        let mut p = replica(1, 2, 2);
        assert!(
            p.stop_driving("deregistered".into(), Instant::now())
                .is_empty()
        );
        assert!(!p.finished());
    }
}
