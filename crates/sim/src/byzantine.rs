//! Omniscient Byzantine replicas, as ByzFL models them: the attackers of a stage see every
//! honest pseudo-gradient of a round before they send theirs, and collude.
//!
//! An attacker's own offers and round announcements are withheld (its tamper drops them).
//! Honest replicas of its stage wait for every live co-replica's offer, so the attackers can
//! wait too: once all honest replicas of the stage offered against one θ₀ (or `patience`
//! passed since the first did), each attacker offers the vector its attack forges from the
//! honest ones, against that same θ₀, signed with its own key. Everything is a function of
//! what the simulator carried, so a seed still gives one trace.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use neuroshard_aggregate::{Attack, l2_norm};
use neuroshard_node::core::Transmit;
use neuroshard_node::records::Topic;
use neuroshard_node::sync::{SyncMsg, SyncOffer, SyncPullAnswer};
use neuroshard_proof::{Canonical, Hash32, NodeId, Signed};
use neuroshard_train::{CompressSpec, Compressor, decode};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::Sim;

/// A round of a stage against one θ₀.
type RoundKey = (u16, u64, Hash32);

#[derive(Default)]
struct Board {
    /// Honest offers heard, by round, by sender.
    offers: BTreeMap<RoundKey, BTreeMap<NodeId, SyncOffer>>,
    blobs: HashMap<Hash32, Arc<Vec<u8>>>,
}

/// The attackers of a simulated network and what they have done.
pub struct Adversary {
    board: Rc<RefCell<Board>>,
    attack: Attack,
    /// Attacker indices by stage.
    attackers: BTreeMap<u16, Vec<usize>>,
    /// Honest replicas per stage.
    honest: BTreeMap<u16, usize>,
    spec: CompressSpec,
    seed: u64,
    /// How long after the first honest offer of a round the attackers offer anyway.
    pub patience: Duration,
    /// Virtual time of the first honest offer of each round seen.
    first_seen: BTreeMap<RoundKey, Duration>,
    answered: BTreeSet<RoundKey>,
    /// Rounds the attackers offered in.
    pub rounds_attacked: usize,
    /// Largest honest norm over the median honest norm, per round: how far apart
    /// honest pseudo-gradients are (what the norm bound must leave room for).
    pub honest_norm_ratios: Vec<f64>,
}

impl Adversary {
    /// Makes `attackers` Byzantine with `attack` and taps every other node's offers. Call
    /// before the nodes start.
    pub fn install(
        sim: &mut Sim,
        attackers: &[usize],
        attack: Attack,
        spec: CompressSpec,
        seed: u64,
    ) -> Self {
        let board: Rc<RefCell<Board>> = Rc::default();
        let mut by_stage: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        let mut honest: BTreeMap<u16, usize> = BTreeMap::new();
        for i in 0..sim.len() {
            let stage = sim.stage_of(i) as u16;
            if attackers.contains(&i) {
                by_stage.entry(stage).or_default().push(i);
                sim.set_tamper(i, Box::new(withhold_rounds));
            } else {
                *honest.entry(stage).or_default() += 1;
                sim.set_tamper(i, tap(board.clone(), sim.node_id(i)));
            }
        }
        Self {
            board,
            attack,
            attackers: by_stage,
            honest,
            spec,
            seed,
            patience: Duration::from_secs(1),
            first_seen: BTreeMap::new(),
            answered: BTreeSet::new(),
            rounds_attacked: 0,
            honest_norm_ratios: Vec::new(),
        }
    }

    /// Runs the simulation to `until` in slices of `slice`, answering every round whose
    /// honest offers are in.
    pub fn run_until(&mut self, sim: &mut Sim, until: Duration, slice: Duration) {
        let mut t = sim.elapsed();
        while t < until {
            t = (t + slice).min(until);
            sim.run_until(t);
            self.answer(sim);
        }
    }

    fn answer(&mut self, sim: &mut Sim) {
        let now = sim.elapsed();
        let board = self.board.clone();
        let mut ready: Vec<(RoundKey, Vec<SyncOffer>)> = Vec::new();
        for (key, offers) in &board.borrow().offers {
            if self.answered.contains(key) {
                continue;
            }
            let first = *self.first_seen.entry(*key).or_insert(now);
            let all_in = offers.len() >= self.honest.get(&key.0).copied().unwrap_or(0);
            if all_in || now >= first + self.patience {
                ready.push((*key, offers.values().cloned().collect()));
            }
        }
        for (key, offers) in ready {
            self.answered.insert(key);
            self.forge_round(sim, key, &offers);
            // Answered rounds are never forged again: their blobs can go.
            let mut board = self.board.borrow_mut();
            for o in &offers {
                board.blobs.remove(&o.blob);
            }
        }
    }

    fn forge_round(&mut self, sim: &mut Sim, key: RoundKey, offers: &[SyncOffer]) {
        let (stage, round, _) = key;
        let Some(len) = offers.first().map(|o| o.dense_bytes as usize / 4) else {
            return;
        };
        // An honest replica still before this round decodes and encodes as the round's
        // receivers do (the low-rank codec's basis is part of its state).
        let attackers = self.attackers.get(&stage).cloned().unwrap_or_default();
        let codec = (0..sim.len())
            .filter(|&i| sim.stage_of(i) as u16 == stage && !attackers.contains(&i))
            .filter_map(|i| sim.engine(i))
            .find(|e| e.sync_state().0.checked_add(1) == Some(round));
        if codec.is_none() && self.spec.low_rank.is_some() {
            return;
        }
        let honest: Vec<Vec<f32>> = {
            let board = self.board.borrow();
            offers
                .iter()
                .filter_map(|o| board.blobs.get(&o.blob))
                .filter_map(|b| match codec {
                    Some(e) => e.decode_offer(b),
                    None => decode(b, len).ok(),
                })
                .collect()
        };
        if honest.is_empty() {
            return;
        }
        let mut norms: Vec<f64> = honest.iter().map(|h| l2_norm(h)).collect();
        norms.sort_by(f64::total_cmp);
        let median = norms[(norms.len() - 1) / 2];
        if median > 0.0 {
            self.honest_norm_ratios
                .push(norms[norms.len() - 1] / median);
        }
        if attackers.is_empty() {
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ round.rotate_left(16) ^ stage as u64);
        let forged = self.attack.forge(&honest, attackers.len(), &mut rng);
        let blobs: Vec<Option<Vec<u8>>> = forged
            .iter()
            .map(|vector| match codec {
                Some(e) => e.encode_offer(vector),
                None => {
                    let mut c = Compressor::with_seed(self.spec, len, self.seed);
                    c.set_round(round);
                    c.compress(vector).ok()
                }
            })
            .collect();
        for (i, blob) in attackers.into_iter().zip(blobs) {
            let Some(blob) = blob else {
                continue;
            };
            let hash = *blake3::hash(&blob).as_bytes();
            // A liar signs a commitment naming its forged offer (only an audit tells).
            let offer = offers[0].recommitted(sim.identity(i), hash, blob.len() as u64);
            let data = Signed::sign(sim.identity(i), &SyncMsg::Offer(offer)).to_bytes();
            sim.transmit_as(
                i,
                Transmit::OfferBlob {
                    hash,
                    data: Arc::new(blob),
                },
            );
            sim.transmit_as(
                i,
                Transmit::Publish {
                    topic: Topic::Sync(stage),
                    data,
                },
            );
        }
        self.rounds_attacked += 1;
    }
}

/// An attacker's tamper: its own offers and outcomes never leave (the adversary speaks for
/// it), neither by gossip nor in answers to co-replicas' pulls (answered empty: the forged
/// offer reaches them by gossip); everything else, pipeline work included, goes out as its
/// core wrote it.
fn withhold_rounds(t: Transmit) -> Option<Transmit> {
    match t {
        Transmit::Publish {
            topic: Topic::Sync(_),
            ..
        } => None,
        Transmit::Respond { token, data }
            if SyncPullAnswer::from_canonical_bytes(&data).is_ok() =>
        {
            let data = SyncPullAnswer::default().to_canonical_bytes();
            Some(Transmit::Respond { token, data })
        }
        other => Some(other),
    }
}

/// An honest node's tamper: passes everything on and records its offers and their blobs.
fn tap(board: Rc<RefCell<Board>>, me: NodeId) -> crate::Tamper {
    Box::new(move |t| {
        match &t {
            Transmit::OfferBlob { hash, data } => {
                board.borrow_mut().blobs.insert(*hash, data.clone());
            }
            Transmit::Publish {
                topic: Topic::Sync(stage),
                data,
            } => {
                if let Ok(SyncMsg::Offer(o)) =
                    Signed::<SyncMsg>::from_bytes(data).and_then(|s| s.verify())
                {
                    board
                        .borrow_mut()
                        .offers
                        .entry((*stage, o.round, o.base))
                        .or_default()
                        .insert(me, o);
                }
            }
            _ => {}
        }
        Some(t)
    })
}
