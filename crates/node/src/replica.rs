//! The engine side of DiLoCo for one replica: θ₀ and the outer optimizer, the compressor, the
//! pseudo-gradient it sent, and the blobs that carry outer and optimizer state between peers.
//!
//! Error feedback lives in the parameters: after a round the replica restarts from
//! θ₀ − residual (the part of its Δ the compressed message did not carry), so that part is
//! sent exactly once, later. A new θ₀ is applied as a shift θ ← θ + (θ₀' − θ₀) + [sent]·ĉ,
//! where ĉ is the decoded message we sent: with no inner steps since the offer this is exactly
//! θ₀' − residual; inner steps taken meanwhile are kept on top.

use std::collections::BTreeMap;
use std::sync::Arc;

use neuroshard_aggregate::{Aggregator, Attack, clip_to_median_norm};
use neuroshard_model::{AdamW, AdamWConfig, ParamSet};
use neuroshard_proof::NodeId;
use neuroshard_train::{CompressSpec, Compressor, DilocoRound, OuterOptimizer};

mod codec;
mod error;
use codec::OfferCodec;
pub use error::ReplicaError;

const OUTER_MAGIC: &[u8; 8] = b"NSOUTER1";
const ADAMW_MAGIC: &[u8; 8] = b"NSADAMW1";

/// Largest AdamW step count taken from a peer. The bias correction raises β to the step as an
/// `i32`, so a count past `i32::MAX` wraps and turns every weight NaN; 2^30 leaves a billion
/// steps of headroom and is 34 years of one step a second, more than any real run.
pub const MAX_ADAMW_STEP: u64 = 1 << 30;
/// Largest outer round taken from a peer: a round a millisecond for 34 years, and far enough
/// from `u64::MAX` that no round arithmetic can wrap.
pub const MAX_ROUND: u64 = 1 << 40;
/// The norm bound of a round of two inputs, at least: with two, no robust rule runs and the
/// bound only caps a noisy or scaled liar, while clipping the longer honest offer to the
/// shorter one costs learning (2 replicas, Shakespeare, 983k tokens: 4.7471 at 1× against
/// 4.7325 at 3×), and a liar's noise clipped to the honest norm passes into θ₀ every round
/// (the simulator's 2 × 2 under Gaussian noise: +7.2% at 1× against +2.0% at 3×, 2 seeds).
/// From three inputs the configured multiple holds.
pub const PAIR_NORM_BOUND: f64 = 3.0;

/// DiLoCo settings of a node.
#[derive(Debug, Clone)]
pub struct DilocoConfig {
    pub me: NodeId,
    /// Aggregator spec (`trimmed-mean`, `median`, `krum`, …, see `neuroshard-aggregate`).
    pub aggregator: String,
    /// Declared Byzantine replicas per stage: at least this many are trimmed once a round has
    /// 3 inputs, and a round with fewer than 2·byzantine + 1 inputs is refused.
    pub byzantine: usize,
    pub compression: CompressSpec,
    pub outer_lr: f32,
    pub outer_momentum: f32,
    /// Shared seed of the random-k masks.
    pub seed: u64,
    /// For robustness experiments: the pseudo-gradient this replica sends instead of its own.
    pub attack: Attack,
    /// Per-input norm bound as a multiple of the round's median input norm, applied before
    /// the aggregator (0: off; at least [`PAIR_NORM_BOUND`] in a round of two; see
    /// `neuroshard_aggregate::clip_to_median_norm`).
    pub norm_bound: f64,
}

/// Our offer of a round.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub round: u64,
    pub blob: Arc<Vec<u8>>,
    pub dense_bytes: u64,
}

/// The result of aggregating a round.
#[derive(Debug, Clone)]
pub struct Applied {
    pub round: u64,
    pub theta: [u8; 32],
    pub outer: Arc<Vec<u8>>,
    pub contributors: Vec<NodeId>,
    pub rejected: Vec<(NodeId, String)>,
    /// Inputs shortened by the norm bound: (sender, norm before, bound).
    pub clipped: Vec<(NodeId, f64, f64)>,
    pub delta_norm: f64,
}

#[derive(Clone)]
struct Sent {
    round: u64,
    /// The outer-state hash the offer was made against, and the round's codec built from it
    /// (reused by `apply` while the state is unchanged).
    base: [u8; 32],
    codec: Arc<OfferCodec>,
    decoded: Vec<f32>,
    blob: Arc<Vec<u8>>,
    /// Whether our outer state includes this message.
    applied: bool,
}

/// What the last round we aggregated started from and used, to recompute it over another
/// contributor set.
#[derive(Clone)]
struct LastRound {
    round: u64,
    before: DilocoRound,
    /// The round's codec, built from `before`.
    codec: Arc<OfferCodec>,
    inputs: BTreeMap<NodeId, Vec<f32>>,
}

#[derive(Clone)]
pub struct Diloco {
    cfg: DilocoConfig,
    outer: DilocoRound,
    compressor: Compressor,
    sent: Option<Sent>,
    hash: [u8; 32],
    last: Option<LastRound>,
}

fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.reserve(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ReplicaError> {
        if self.0.len() < n {
            return Err(ReplicaError::Truncated {
                left: self.0.len(),
                needed: n,
            });
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, ReplicaError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn f32s(&mut self, n: usize, what: &'static str) -> Result<Vec<f32>, ReplicaError> {
        let bytes = self.take(n.checked_mul(4).ok_or(ReplicaError::LengthOverflow)?)?;
        let v: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(index) = v.iter().position(|x| !x.is_finite()) {
            return Err(ReplicaError::NonFinite { what, index });
        }
        Ok(v)
    }

    fn magic(&mut self, magic: &[u8; 8]) -> Result<(), ReplicaError> {
        if self.take(8)? != magic {
            return Err(ReplicaError::Magic);
        }
        Ok(())
    }

    fn end(&self) -> Result<(), ReplicaError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ReplicaError::Trailing(self.0.len()))
        }
    }
}

/// Encodes the outer state: round, θ₀, outer velocity and the previous aggregate.
pub fn encode_outer(outer: &DilocoRound) -> Vec<u8> {
    let n = outer.theta().len();
    let mut out = Vec::with_capacity(32 + n * 12);
    out.extend_from_slice(OUTER_MAGIC);
    out.extend_from_slice(&outer.round().to_le_bytes());
    out.extend_from_slice(&(n as u64).to_le_bytes());
    out.push(u8::from(outer.previous().is_some()));
    put_f32s(&mut out, outer.theta());
    put_f32s(&mut out, outer.optimizer().velocity());
    if let Some(p) = outer.previous() {
        put_f32s(&mut out, p);
    }
    out
}

/// Decodes and checks an outer state for a stage of `len` parameters.
pub fn decode_outer(
    bytes: &[u8],
    len: usize,
    cfg: &DilocoConfig,
    aggregator: Aggregator,
) -> Result<DilocoRound, ReplicaError> {
    let mut c = Cursor(bytes);
    let (round, has_prev, theta) = outer_head(&mut c, len)?;
    let velocity = c.f32s(len, "velocity")?;
    let previous = if has_prev {
        Some(c.f32s(len, "previous aggregate")?)
    } else {
        None
    };
    c.end()?;
    let opt = OuterOptimizer::with_velocity(cfg.outer_lr, cfg.outer_momentum, velocity);
    Ok(DilocoRound::from_state(
        theta, opt, aggregator, previous, round,
    )?)
}

/// θ₀ alone from an encoded outer state (e.g. to export the stage's consensus weights).
pub fn outer_theta(bytes: &[u8], len: usize) -> Result<(u64, Vec<f32>), ReplicaError> {
    let (round, _, theta) = outer_head(&mut Cursor(bytes), len)?;
    Ok((round, theta))
}

/// Magic, round, length, the previous-aggregate flag and θ₀.
fn outer_head(c: &mut Cursor<'_>, len: usize) -> Result<(u64, bool, Vec<f32>), ReplicaError> {
    c.magic(OUTER_MAGIC)?;
    let round = c.u64()?;
    if round > MAX_ROUND {
        return Err(ReplicaError::Round(round));
    }
    let n = c.u64()?;
    if n != len as u64 {
        return Err(ReplicaError::StateLength {
            what: "outer state",
            got: n,
            expected: len,
        });
    }
    let has_prev = match c.take(1)?[0] {
        0 => false,
        1 => true,
        other => return Err(ReplicaError::Flag(other)),
    };
    Ok((round, has_prev, c.f32s(len, "θ₀")?))
}

/// Encodes AdamW's step count and moments (what a joining replica borrows).
pub fn encode_adamw(opt: &AdamW) -> Vec<u8> {
    let (m, v) = opt.moments();
    let n: usize = m.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(24 + n * 8);
    out.extend_from_slice(ADAMW_MAGIC);
    out.extend_from_slice(&opt.step_count().to_le_bytes());
    out.extend_from_slice(&(n as u64).to_le_bytes());
    for t in m.iter().chain(v) {
        put_f32s(&mut out, t);
    }
    out
}

/// Decodes an optimizer blob (a peer's, for a joiner) into AdamW state for `params`, refusing
/// state no AdamW run can reach: an absurd step count, a negative second moment (√v is NaN and
/// so is every weight it touches), or a first moment too large for its second moment.
pub fn decode_adamw(
    bytes: &[u8],
    config: AdamWConfig,
    params: &ParamSet,
) -> Result<AdamW, ReplicaError> {
    let mut c = Cursor(bytes);
    c.magic(ADAMW_MAGIC)?;
    let step = c.u64()?;
    if step > MAX_ADAMW_STEP {
        return Err(ReplicaError::StepCount(step));
    }
    let n = c.u64()?;
    if n != params.numel() as u64 {
        return Err(ReplicaError::StateLength {
            what: "optimizer state",
            got: n,
            expected: params.numel(),
        });
    }
    let mut read = |what| -> Result<Vec<Vec<f32>>, ReplicaError> {
        params
            .values()
            .iter()
            .map(|p| c.f32s(p.len(), what))
            .collect()
    };
    let m = read("first moment")?;
    let v = read("second moment")?;
    c.end()?;
    check_moments(&config, m.iter().flatten(), v.iter().flatten())?;
    Ok(AdamW::from_state(config, params, step, m, v)?)
}

/// Both moments start at 0 and see the same gradients, m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g²,
/// so v ≥ 0 and, by Cauchy–Schwarz when β₁² < β₂, |m| ≤ K·√v with
/// K = (1−β₁) / √((1−β₂)(1−β₁²/β₂)) (1.17 for the defaults). Honest state passes with room
/// (2K, plus ε for values too small for f32); forged state that passes moves a weight by at
/// most a few learning rates a step.
fn check_moments<'a>(
    config: &AdamWConfig,
    m: impl Iterator<Item = &'a f32>,
    v: impl Iterator<Item = &'a f32>,
) -> Result<(), ReplicaError> {
    let (b1, b2) = (config.beta1, config.beta2);
    let bound = if (0.0..1.0).contains(&b1) && b2 > 0.0 && b2 < 1.0 && b1 * b1 < b2 {
        Some(2.0 * (1.0 - b1) / ((1.0 - b2) * (1.0 - b1 * b1 / b2)).sqrt())
    } else {
        None
    };
    for (index, (&m, &v)) in m.zip(v).enumerate() {
        if v < 0.0 {
            return Err(ReplicaError::NegativeSecondMoment { index });
        }
        if let Some(k) = bound
            && f64::from(m.abs()) > k * f64::from(v).sqrt() + config.eps
        {
            return Err(ReplicaError::FirstMoment { index, m, v });
        }
    }
    Ok(())
}

impl Diloco {
    /// Starts at θ₀ = the current parameters, round 0.
    pub fn new(cfg: DilocoConfig, params: &ParamSet) -> Result<Self, ReplicaError> {
        let theta = params.flatten();
        let outer = DilocoRound::new(
            theta,
            OuterOptimizer::with(params.numel(), cfg.outer_lr, cfg.outer_momentum),
            aggregator(&cfg, 1)?,
        );
        Ok(Self::from_round(cfg, outer))
    }

    /// Restores a saved or fetched outer state.
    pub fn restore(cfg: DilocoConfig, bytes: &[u8], len: usize) -> Result<Self, ReplicaError> {
        let outer = decode_outer(bytes, len, &cfg, aggregator(&cfg, 1)?)?;
        Ok(Self::from_round(cfg, outer))
    }

    fn from_round(cfg: DilocoConfig, outer: DilocoRound) -> Self {
        let len = outer.theta().len();
        let compressor = Compressor::with_seed(cfg.compression, len, cfg.seed);
        let hash = *blake3::hash(&encode_outer(&outer)).as_bytes();
        Self {
            cfg,
            outer,
            compressor,
            sent: None,
            hash,
            last: None,
        }
    }

    pub fn round(&self) -> u64 {
        self.outer.round()
    }

    pub fn config(&self) -> &DilocoConfig {
        &self.cfg
    }

    /// θ₀.
    pub fn theta(&self) -> &[f32] {
        self.outer.theta()
    }

    /// BLAKE3 of the encoded outer state: what replicas compare after a round.
    pub fn hash(&self) -> [u8; 32] {
        self.hash
    }

    pub fn outer_bytes(&self) -> Vec<u8> {
        encode_outer(&self.outer)
    }

    /// Δ = θ₀ − θ, compressed; the unsent residual stays in the parameters.
    pub fn prepare(&mut self, round: u64, params: &ParamSet) -> Result<Prepared, ReplicaError> {
        let delta = self.outer.pseudo_gradient(&params.flatten())?;
        let codec = self.codec(&self.outer, round, params)?;
        let (honest, decoded) = codec.encode(&mut self.compressor, round, &delta)?;
        let blob = if self.cfg.attack == Attack::None {
            honest
        } else {
            let (spec, seed) = (self.cfg.compression, self.cfg.seed);
            codec.forge(spec, seed, round, &self.cfg.attack, &decoded)?
        };
        let blob = Arc::new(blob);
        self.sent = Some(Sent {
            round,
            base: self.hash,
            codec,
            decoded,
            blob: blob.clone(),
            applied: false,
        });
        Ok(Prepared {
            round,
            blob,
            dense_bytes: delta.len() as u64 * 4,
        })
    }

    /// Aggregates `round` from the fetched messages (ours is taken from memory), applies the
    /// outer step and shifts the parameters. Malformed messages are left out with a reason.
    pub fn apply(
        &mut self,
        round: u64,
        messages: Vec<(NodeId, Vec<u8>)>,
        params: &mut ParamSet,
    ) -> Result<Applied, ReplicaError> {
        let ours = self.outer.round();
        if ours.checked_add(1) != Some(round) {
            return Err(ReplicaError::NotNext { round, ours });
        }
        let mut dense: BTreeMap<NodeId, Vec<f32>> = BTreeMap::new();
        let mut rejected = Vec::new();
        let ours = self.sent.as_ref().filter(|s| s.round == round);
        let codec = match ours.filter(|s| s.base == self.hash) {
            Some(s) => s.codec.clone(),
            None => self.codec(&self.outer, round, params)?,
        };
        if let Some(s) = ours {
            let own = vec![(self.cfg.me, s.blob.to_vec())];
            self.decode_into(&codec, own, &mut dense, &mut rejected, true);
        }
        self.decode_into(&codec, messages, &mut dense, &mut rejected, false);
        let before = self.outer.clone();
        let applied = self.aggregate(round, &before, &dense, rejected, params)?;
        self.last = Some(LastRound {
            round,
            before,
            codec,
            inputs: dense,
        });
        Ok(applied)
    }

    /// Recomputes `round` over the contributor set `set`, fetching only the messages we did
    /// not use (`extra`): how a replica checks another replica's larger outcome instead of
    /// taking its bytes on trust. The caller compares the resulting hash with the announced one.
    pub fn reapply(
        &mut self,
        round: u64,
        extra: Vec<(NodeId, Vec<u8>)>,
        set: &[NodeId],
        params: &mut ParamSet,
    ) -> Result<Applied, ReplicaError> {
        let Some(mut last) = self.last.take().filter(|l| l.round == round) else {
            return Err(ReplicaError::NotLast(round));
        };
        if self.outer.round() != round {
            self.last = Some(last);
            return Err(ReplicaError::MovedOn(round));
        }
        let mut rejected = Vec::new();
        let codec = last.codec.clone();
        self.decode_into(&codec, extra, &mut last.inputs, &mut rejected, false);
        let chosen: BTreeMap<NodeId, Vec<f32>> = set
            .iter()
            .filter_map(|n| last.inputs.get(n).map(|v| (*n, v.clone())))
            .collect();
        if chosen.len() != set.len() || !rejected.is_empty() {
            let missing = set.len() - chosen.len();
            self.last = Some(last);
            return Err(ReplicaError::CannotRebuild {
                missing,
                malformed: rejected.len(),
            });
        }
        let applied = self.aggregate(round, &last.before, &chosen, rejected, params);
        self.last = Some(last);
        applied
    }

    /// The offers' encoding of `round`, which starts from the outer state `before`.
    fn codec(
        &self,
        before: &DilocoRound,
        round: u64,
        params: &ParamSet,
    ) -> Result<Arc<OfferCodec>, ReplicaError> {
        let codec =
            OfferCodec::of_round(&self.cfg.compression, self.cfg.seed, before, round, params);
        Ok(Arc::new(codec?))
    }

    /// The next round and its offers' encoding.
    fn next_codec(&self, params: &ParamSet) -> Result<(u64, Arc<OfferCodec>), ReplicaError> {
        let round = self.outer.round().checked_add(1);
        let round = round.ok_or(ReplicaError::Round(u64::MAX))?;
        Ok((round, self.codec(&self.outer, round, params)?))
    }

    /// Decodes `bytes` as an offer of the next round (e.g. to measure what a message carries).
    pub fn decode_offer(&self, bytes: &[u8], params: &ParamSet) -> Result<Vec<f32>, ReplicaError> {
        Ok(self.next_codec(params)?.1.decode(bytes)?)
    }

    /// Encodes `delta` as an offer of the next round in the network's encoding, as a replica
    /// that sends `delta` instead of its own Δ would (for attack experiments).
    pub fn encode_offer(&self, delta: &[f32], params: &ParamSet) -> Result<Vec<u8>, ReplicaError> {
        let (round, codec) = self.next_codec(params)?;
        let mut c = Compressor::with_seed(self.cfg.compression, delta.len(), self.cfg.seed);
        Ok(codec.encode(&mut c, round, delta)?.0)
    }

    fn decode_into(
        &self,
        codec: &OfferCodec,
        messages: Vec<(NodeId, Vec<u8>)>,
        dense: &mut BTreeMap<NodeId, Vec<f32>>,
        rejected: &mut Vec<(NodeId, String)>,
        own: bool,
    ) {
        for (node, bytes) in messages {
            if node == self.cfg.me && !own {
                continue;
            }
            match codec.decode(&bytes) {
                Ok(v) if v.iter().all(|x| x.is_finite()) => {
                    dense.insert(node, v);
                }
                Ok(_) => rejected.push((node, "non-finite pseudo-gradient".into())),
                Err(e) => rejected.push((node, e.to_string())),
            }
        }
    }

    /// Applies the outer step of `round` from the state `from` over `dense` (in node-id
    /// order, each clipped to the norm bound first) and shifts the parameters from the current θ₀ to the result. Refused, with
    /// nothing changed, when the inputs are too few for the Byzantine count or the step would
    /// leave θ₀ non-finite: the caller keeps θ₀ and treats the round as failed.
    fn aggregate(
        &mut self,
        round: u64,
        from: &DilocoRound,
        dense: &BTreeMap<NodeId, Vec<f32>>,
        rejected: Vec<(NodeId, String)>,
        params: &mut ParamSet,
    ) -> Result<Applied, ReplicaError> {
        if dense.is_empty() {
            return Err(ReplicaError::NoInput);
        }
        let mut next = from.clone();
        next.set_aggregator(aggregator(&self.cfg, dense.len())?);
        let mut clipped = Vec::new();
        let only = dense.values().next().filter(|_| dense.len() == 1);
        let outcome = if let Some(only) = only {
            // Decided by the set alone, so every replica recomputing it agrees.
            next.apply_alone(only)?
        } else if self.cfg.norm_bound > 0.0 {
            let mut inputs: Vec<Vec<f32>> = dense.values().cloned().collect();
            let senders: Vec<NodeId> = dense.keys().copied().collect();
            let multiple = if inputs.len() == 2 {
                self.cfg.norm_bound.max(PAIR_NORM_BOUND)
            } else {
                self.cfg.norm_bound
            };
            for c in clip_to_median_norm(&mut inputs, multiple)? {
                clipped.push((senders[c.index], c.norm, c.bound));
            }
            next.apply(&inputs)?
        } else {
            let inputs: Vec<&Vec<f32>> = dense.values().collect();
            next.apply(&inputs)?
        };
        let included = dense.contains_key(&self.cfg.me);
        self.shift(&next, included, params)?;
        self.outer = next;
        let outer = Arc::new(encode_outer(&self.outer));
        self.hash = *blake3::hash(&outer).as_bytes();
        Ok(Applied {
            round,
            theta: self.hash,
            outer,
            contributors: dense.keys().copied().collect(),
            rejected,
            clipped,
            delta_norm: outcome.delta_norm,
        })
    }

    /// Takes a peer's outer state of `round` (already hash-checked by the transport).
    pub fn adopt(
        &mut self,
        round: u64,
        bytes: &[u8],
        included: bool,
        params: &mut ParamSet,
    ) -> Result<[u8; 32], ReplicaError> {
        let len = self.outer.theta().len();
        let agg = aggregator(&self.cfg, 1)?;
        let fresh = decode_outer(bytes, len, &self.cfg, agg)?;
        if fresh.round() != round || round < self.outer.round() {
            return Err(ReplicaError::WrongRound {
                got: fresh.round(),
                expected: round,
                ours: self.outer.round(),
            });
        }
        self.shift(&fresh, included, params)?;
        self.outer = fresh;
        self.hash = *blake3::hash(bytes).as_bytes();
        Ok(self.hash)
    }

    /// θ ← θ + (θ₀' − θ₀) + (now − before included)·ĉ for our message of this round, from
    /// our θ₀ to `next`'s, which the caller then takes. Two finite θ₀ far apart can still
    /// overflow the weights; then nothing changes and the caller keeps its θ₀.
    fn shift(
        &mut self,
        next: &DilocoRound,
        included: bool,
        params: &mut ParamSet,
    ) -> Result<(), ReplicaError> {
        let mut flat = params.flatten();
        for ((p, new), old) in flat.iter_mut().zip(next.theta()).zip(self.outer.theta()) {
            *p += new - old;
        }
        let sent = self.sent.as_mut().filter(|s| s.round == next.round());
        if let Some(s) = &sent {
            let sign = match (included, s.applied) {
                (true, false) => 1.0,
                (false, true) => -1.0,
                _ => 0.0,
            };
            if sign != 0.0 {
                for (p, c) in flat.iter_mut().zip(&s.decoded) {
                    *p += sign * c;
                }
            }
        }
        if let Some(index) = flat.iter().position(|x| !x.is_finite()) {
            return Err(ReplicaError::NonFinite {
                what: "shifted parameters",
                index,
            });
        }
        params.set_flat(&flat)?;
        if let Some(s) = sent {
            s.applied = included;
        }
        Ok(())
    }
}

/// The offer an honest replica makes of `round` from the weights `theta` when its outer state
/// before the round is `outer` (encoded): θ₀ − θ in the round's encoding, as
/// [`Diloco::prepare`] makes it. An auditor re-encodes a replica's offer with it; `params`
/// gives the stage's matrix shapes (the low-rank codec's layout), not values.
pub fn recompute_offer(
    cfg: &DilocoConfig,
    outer: &[u8],
    theta: &[f32],
    params: &ParamSet,
    round: u64,
) -> Result<Vec<u8>, ReplicaError> {
    let before = decode_outer(outer, theta.len(), cfg, aggregator(cfg, 1)?)?;
    let delta = before.pseudo_gradient(theta)?;
    let codec = OfferCodec::of_round(&cfg.compression, cfg.seed, &before, round, params)?;
    let mut compressor = Compressor::with_seed(cfg.compression, theta.len(), cfg.seed);
    Ok(codec.encode(&mut compressor, round, &delta)?.0)
}

/// The configured rule fitted to `n` inputs: its Byzantine count is a fraction of them, never
/// 0 from 3 inputs on, at least the declared one; refused when n < 2f + 1 (see
/// `neuroshard_aggregate::byzantine_count`; with 1 or 2 inputs nothing robust is possible).
fn aggregator(cfg: &DilocoConfig, n: usize) -> Result<Aggregator, ReplicaError> {
    Ok(Aggregator::parse(&cfg.aggregator, cfg.byzantine)?.fitted(n, cfg.byzantine)?)
}

#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod attack_tests;

#[cfg(test)]
mod lowrank_tests;
