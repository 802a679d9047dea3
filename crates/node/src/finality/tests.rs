//! Ledger finality between a few nodes wired directly (no core): what a lying proposer, a
//! forged history and forged evidence achieve.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use neuroshard_finality::ConsensusWire;
use neuroshard_ledger::{
    AccountOp, Action, EpochItem, LedgerGenesis, LedgerState, Rules, verify_op,
};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, Hash32, Identity, NodeId};

use super::*;

const T0_MS: u64 = 1_800_000_000_000;

fn genesis(ids: &[Identity]) -> LedgerState {
    let rules = Rules::default();
    let stakes = ids
        .iter()
        .map(|i| (i.public_key(), 3 * rules.min_stake))
        .collect();
    let g = LedgerGenesis::new(rules, stakes).expect("genesis");
    LedgerState::from_genesis(&g).expect("state").0
}

fn config() -> FinalityConfig {
    FinalityConfig {
        network: Rules::default().network,
        epoch: Duration::from_millis(500),
        max_members: 31,
        timeouts: Timeouts::default(),
    }
}

/// `id` registering for `stage`: an item whose effect the finalized state shows.
fn register(id: &Identity, stage: u16) -> (EpochItem, ItemWire) {
    let signed = AccountOp {
        network: Rules::default().network,
        account: id.node_id(),
        nonce: 0,
        timestamp_ms: T0_MS,
        action: Action::Register { stage },
    }
    .sign(id);
    let op = verify_op(&signed).expect("fixture op");
    (EpochItem::Op(op), ItemWire::Op(signed.to_bytes()))
}

/// Nodes wired directly: gossip reaches every other node at once, a request is answered by
/// the node asked (or the next one).
struct Net {
    ids: Vec<Identity>,
    nodes: Vec<LedgerFinality>,
    now: Instant,
    /// Items node i's admission refuses.
    refused: Vec<BTreeSet<Hash32>>,
    penalties: Vec<(usize, NodeId, String)>,
    /// Every consensus message sent (for forgeries).
    sent: Vec<Vec<u8>>,
    queue: VecDeque<(usize, Option<usize>, FinalityOut)>,
}

impl Net {
    fn new(n: usize) -> Self {
        let ids: Vec<Identity> = (0..n as u64).map(|i| test_identity(i + 1)).collect();
        let now = Instant::now();
        let g = genesis(&ids);
        // Every validator runs from the start (the first epoch waits for two thirds).
        let nodes = ids
            .iter()
            .map(|id| {
                let mut f = LedgerFinality::new(config(), id.clone(), g.clone(), now);
                f.set_live(ids.iter().map(Identity::node_id));
                f
            })
            .collect();
        Self {
            refused: vec![BTreeSet::new(); n],
            ids,
            nodes,
            now,
            penalties: Vec::new(),
            sent: Vec::new(),
            queue: VecDeque::new(),
        }
    }

    fn add_everywhere(&mut self, item: &(EpochItem, ItemWire)) {
        for n in &mut self.nodes {
            n.add_item(item.0.clone(), item.1.clone());
        }
    }

    fn admit(refused: &BTreeSet<Hash32>) -> impl Fn(&LedgerState, &EpochItem) -> Admit + '_ {
        move |_, item| {
            if refused.contains(&item.id()) {
                Admit::No("refused by this node's rules".into())
            } else {
                Admit::Yes
            }
        }
    }

    fn collect(&mut self) {
        for (i, n) in self.nodes.iter_mut().enumerate() {
            while let Some(out) = n.poll_out() {
                self.queue.push_back((i, None, out));
            }
        }
    }

    fn deliver(&mut self) {
        self.collect();
        while let Some((i, _, out)) = self.queue.pop_front() {
            let from = self.ids[i].node_id();
            let now = self.now;
            match out {
                FinalityOut::Publish(data) => {
                    if let Ok(FinalityGossip::Consensus(b)) =
                        FinalityGossip::from_canonical_bytes(&data)
                    {
                        self.sent.push(b);
                    }
                    for j in (0..self.nodes.len()).filter(|j| *j != i) {
                        self.nodes[j].handle_gossip(from, &data, now);
                        let admit = Self::admit(&self.refused[j]);
                        self.nodes[j].judge_waiting(&admit, now);
                    }
                }
                FinalityOut::Ask { to, request } => {
                    let j = to
                        .and_then(|t| self.ids.iter().position(|x| x.node_id() == t))
                        .unwrap_or((i + 1) % self.nodes.len());
                    let answer = self.nodes[j].answer(&request, 1 << 24);
                    let peer = self.ids[j].node_id();
                    match answer {
                        FinalityAnswer::Body(Some(b)) => self.nodes[i].on_body(peer, b, now),
                        FinalityAnswer::Chain(links) => self.nodes[i].on_chain(peer, links, now),
                        FinalityAnswer::Body(None) => {}
                    }
                }
                FinalityOut::Penalize { peer, reason } => self.penalties.push((i, peer, reason)),
                _ => {}
            }
            self.collect();
        }
    }

    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        loop {
            self.deliver();
            let Some(next) = self
                .nodes
                .iter()
                .filter_map(LedgerFinality::poll_timeout)
                .min()
            else {
                break;
            };
            if next > end {
                break;
            }
            self.now = self.now.max(next);
            let now = self.now;
            for (j, n) in self.nodes.iter_mut().enumerate() {
                if n.poll_timeout().is_some_and(|t| t <= now) {
                    let admit = Self::admit(&self.refused[j]);
                    n.handle_timeout(&admit, now);
                }
            }
        }
        self.now = end;
    }
}

#[test]
fn an_item_the_committee_refuses_stays_out_while_the_rest_finalizes() {
    let mut net = Net::new(4);
    let good = register(&net.ids[1], 0);
    let bad = register(&net.ids[2], 1);
    net.add_everywhere(&good);
    net.add_everywhere(&bad);
    // Every node but 0 refuses `bad` (as an honest economy refuses a proof whose receipts do
    // not count): 0's bodies hold it and get no vote; the others' finalize without it.
    for i in 1..4 {
        net.refused[i].insert(bad.0.id());
    }
    net.run_for(Duration::from_secs(30));
    let head = net.nodes[1].head().clone();
    assert!(head.epoch >= 3, "finalized {} epochs", head.epoch);
    for (i, n) in net.nodes.iter().enumerate() {
        // Node 0 may trail by the epoch in flight; at a common epoch all agree.
        let fin = n.finalized_state();
        assert!(fin.is_registered(&net.ids[1].node_id(), 0), "node {i}");
        assert!(!fin.is_registered(&net.ids[2].node_id(), 1), "node {i}");
        if n.head().epoch == head.epoch {
            assert_eq!(n.head().state, head.state, "node {i}");
        }
    }
}

#[test]
fn a_forged_history_is_refused_and_its_server_penalised() {
    let mut net = Net::new(4);
    net.add_everywhere(&register(&net.ids[1], 0));
    net.run_for(Duration::from_secs(8));
    let FinalityAnswer::Chain(chain) = net.nodes[0].answer(
        &FinalityRequest::Chain {
            network: config().network,
            from: 1,
            max: 64,
        },
        1 << 24,
    ) else {
        panic!("a chain answer");
    };
    assert!(chain.len() >= 3, "{} epochs", chain.len());
    let with_item = chain
        .iter()
        .position(|l| !l.body.items.is_empty())
        .expect("an epoch holds the registration");
    let server = test_identity(77).node_id();
    let fresh = || LedgerFinality::new(config(), test_identity(50), genesis(&net.ids), net.now);
    let penalties = |f: &mut LedgerFinality| {
        let mut n = 0;
        while let Some(out) = f.poll_out() {
            n += usize::from(matches!(out, FinalityOut::Penalize { peer, .. } if peer == server));
        }
        n
    };
    // The body emptied: the value names other contents.
    let mut emptied = chain.clone();
    emptied[with_item].body.items.clear();
    // A certificate moved to another epoch.
    let mut moved = chain.clone();
    moved[1].certified.certificate = chain[0].certified.certificate.clone();
    // The next committee swapped for one of the server's choosing.
    let mut seated = chain.clone();
    seated[0].certified.next_committee = committee_of(&genesis(&[test_identity(77)]), 31);
    for (name, forged) in [("emptied", emptied), ("moved", moved), ("seated", seated)] {
        let mut f = fresh();
        f.on_chain(server, forged, net.now);
        assert_eq!(penalties(&mut f), 1, "{name}: the server is not penalised");
        let applied = f.head().epoch;
        // Epochs before the forged one may apply (they are genuine); none after it.
        assert!(
            applied < chain.len() as u64,
            "{name}: the whole forged chain applied"
        );
        assert!(
            !f.finalized_state().is_registered(&net.ids[1].node_id(), 0) || name != "emptied",
            "{name}: the emptied epoch's item applied"
        );
    }
    let mut honest = fresh();
    honest.on_chain(server, chain.clone(), net.now);
    assert_eq!(penalties(&mut honest), 0);
    assert_eq!(honest.head().epoch, chain.len() as u64);
    assert_eq!(
        honest.head().state,
        chain.last().unwrap().certified.value.state
    );
}

#[test]
fn evidence_pairing_two_validators_votes_frames_neither() {
    let mut net = Net::new(4);
    net.run_for(Duration::from_secs(3));
    let votes: Vec<ConsensusWire> = net
        .sent
        .iter()
        .filter_map(|b| ConsensusWire::from_canonical_bytes(b).ok())
        .filter(|m| matches!(m, ConsensusWire::Vote(_)))
        .collect();
    let a = votes[0].clone();
    let b = votes
        .iter()
        .find(|v| v.signer() != a.signer() && v.epoch() == a.epoch())
        .expect("another validator's vote")
        .clone();
    let relay = net.ids[3].node_id();
    let before = net.nodes[0].pending_len();
    for (first, second) in [
        (a.to_canonical_bytes(), b.to_canonical_bytes()),
        (a.to_canonical_bytes(), a.to_canonical_bytes()),
        (vec![1, 2, 3], a.to_canonical_bytes()),
    ] {
        let msg = FinalityGossip::Evidence { first, second }.to_canonical_bytes();
        net.nodes[0].handle_gossip(relay, &msg, net.now);
    }
    let mut penalised = 0;
    while let Some(out) = net.nodes[0].poll_out() {
        penalised +=
            usize::from(matches!(out, FinalityOut::Penalize { peer, .. } if peer == relay));
    }
    assert_eq!(penalised, 3);
    assert_eq!(
        net.nodes[0].pending_len(),
        before,
        "a slash waits on forged evidence"
    );
}

#[test]
fn far_epochs_bodies_and_undecodable_gossip_are_dropped() {
    let mut net = Net::new(4);
    let peer = net.ids[2].node_id();
    let far = EpochBody {
        epoch: 40,
        items: vec![register(&net.ids[1], 0).1],
    };
    // Whether node 0 holds a body of that one registration.
    let held = |n: &LedgerFinality| {
        let contents = neuroshard_ledger::epoch_contents(&[register(&net.ids[1], 0).0]);
        let network = config().network;
        n.answer(&FinalityRequest::Body { network, contents }, 1 << 20)
            != FinalityAnswer::Body(None)
    };
    net.nodes[0].on_body(peer, far.clone(), net.now);
    assert!(!held(&net.nodes[0]), "a far epoch's body is held");
    net.nodes[0].handle_gossip(peer, b"not finality gossip", net.now);
    // A body gossiped by a node outside the committee: checking its items would cost every
    // node a signature each.
    let outsider = test_identity(66).node_id();
    let body = FinalityGossip::Body(EpochBody {
        epoch: 1,
        items: vec![register(&net.ids[1], 0).1],
    });
    net.nodes[0].handle_gossip(outsider, &body.to_canonical_bytes(), net.now);
    let mut penalised = Vec::new();
    while let Some(out) = net.nodes[0].poll_out() {
        if let FinalityOut::Penalize { peer, .. } = out {
            penalised.push(peer);
        }
    }
    assert_eq!(penalised, vec![peer, outsider]);
    assert!(!held(&net.nodes[0]), "an outsider's body is held");
    // The same body from a committee member is held (the check above can tell).
    net.nodes[0].handle_gossip(peer, &body.to_canonical_bytes(), net.now);
    assert!(
        held(&net.nodes[0]),
        "a member's body of the next epoch is not held"
    );
}

#[test]
fn only_a_members_signed_vote_of_a_later_epoch_makes_a_node_ask_for_the_history() {
    let mut net = Net::new(4);
    net.run_for(Duration::from_secs(8));
    assert!(net.nodes[0].head().epoch >= 3);
    let late = net
        .sent
        .iter()
        .find(|b| {
            ConsensusWire::from_canonical_bytes(b)
                .is_ok_and(|m| matches!(m, ConsensusWire::Vote(_)) && m.epoch() >= 3)
        })
        .expect("a vote of epoch 3 or later")
        .clone();
    // The same vote with its signature broken: anyone can claim a later epoch.
    let mut forged = late.clone();
    let last = forged.len() - 1;
    forged[last] ^= 0x01;
    assert!(ConsensusWire::from_canonical_bytes(&forged).is_ok());
    let stranger = test_identity(66).node_id();
    let mut fresh = LedgerFinality::new(config(), test_identity(50), genesis(&net.ids), net.now);
    let asks = |f: &mut LedgerFinality| {
        let mut to = Vec::new();
        while let Some(out) = f.poll_out() {
            if let FinalityOut::Ask {
                to: Some(peer),
                request: FinalityRequest::Chain { .. },
            } = out
            {
                to.push(peer);
            }
        }
        to
    };
    let msg = |b: &[u8]| FinalityGossip::Consensus(b.to_vec()).to_canonical_bytes();
    fresh.handle_gossip(stranger, &msg(&forged), net.now);
    assert!(
        asks(&mut fresh).is_empty(),
        "a forged claim made the node ask"
    );
    // A member's genuine vote, relayed by anyone: the node asks the relay.
    fresh.handle_gossip(stranger, &msg(&late), net.now);
    assert_eq!(asks(&mut fresh), vec![stranger]);
}

/// A network's first epoch waits until more than two thirds of the committee's power is heard
/// on the finality topic: keys outside the committee do not count however many, members do,
/// and the waiting node says it runs.
#[test]
fn the_first_epoch_waits_for_two_thirds_of_the_committee_and_strangers_do_not_count() {
    let ids: Vec<Identity> = (0..4u64).map(|i| test_identity(i + 1)).collect();
    let start = Instant::now();
    let mut f = LedgerFinality::new(config(), ids[0].clone(), genesis(&ids), start);
    let admit = |_: &LedgerState, _: &EpochItem| Admit::Yes;
    let mut t = start + config().epoch;
    let mut tick = |f: &mut LedgerFinality| {
        f.handle_timeout(&admit, t);
        t += Duration::from_millis(250);
        std::iter::from_fn(|| f.poll_out())
            .filter(|o| {
                matches!(o, FinalityOut::Publish(b)
                    if matches!(FinalityGossip::from_canonical_bytes(b), Ok(FinalityGossip::Present { .. })))
            })
            .count()
    };
    assert_eq!(tick(&mut f), 1, "the waiting validator says it runs");
    assert!(f.started_at.is_none());
    let present = FinalityGossip::Present { count: 1 }.to_canonical_bytes();
    for stranger in 50..80 {
        f.handle_gossip(test_identity(stranger).node_id(), &present, start);
    }
    tick(&mut f);
    assert!(f.started_at.is_none(), "strangers counted");
    f.handle_gossip(ids[1].node_id(), &present, start);
    tick(&mut f);
    assert!(
        f.started_at.is_none(),
        "half the committee started the epoch"
    );
    f.handle_gossip(ids[2].node_id(), &present, start);
    tick(&mut f);
    assert_eq!(f.started_at.map(|(e, _)| e), Some(1));
}
