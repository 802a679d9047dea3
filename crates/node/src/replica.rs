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

use neuroshard_aggregate::{Aggregator, Attack};
use neuroshard_model::{AdamW, AdamWConfig, ParamSet};
use neuroshard_proof::NodeId;
use neuroshard_train::{CompressSpec, Compressor, DilocoRound, OuterOptimizer, decode};

const OUTER_MAGIC: &[u8; 8] = b"NSOUTER1";
const ADAMW_MAGIC: &[u8; 8] = b"NSADAMW1";

/// DiLoCo settings of a node.
#[derive(Debug, Clone)]
pub struct DilocoConfig {
    pub me: NodeId,
    /// Aggregator spec (`trimmed-mean`, `median`, `krum`, …, see `neuroshard-aggregate`).
    pub aggregator: String,
    /// Declared Byzantine replicas per stage, capped per round at what the inputs allow.
    pub byzantine: usize,
    pub compression: CompressSpec,
    pub outer_lr: f32,
    pub outer_momentum: f32,
    /// Shared seed of the random-k masks.
    pub seed: u64,
    /// For robustness experiments: the pseudo-gradient this replica sends instead of its own.
    pub attack: Attack,
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
    pub delta_norm: f64,
}

#[derive(Clone)]
struct Sent {
    round: u64,
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
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "truncated: {} bytes left, {n} needed",
                self.0.len()
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().map_err(|_| "bad u64")?))
    }

    fn f32s(&mut self, n: usize, what: &str) -> Result<Vec<f32>, String> {
        let bytes = self.take(n.checked_mul(4).ok_or("length overflow")?)?;
        let v: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(format!("{what}: non-finite value at {i}"));
        }
        Ok(v)
    }

    fn magic(&mut self, magic: &[u8; 8]) -> Result<(), String> {
        if self.take(8)? != magic {
            return Err("not a NeuroShard state blob of this kind".into());
        }
        Ok(())
    }

    fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{} trailing bytes", self.0.len()))
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
) -> Result<DilocoRound, String> {
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
    DilocoRound::from_state(theta, opt, aggregator, previous, round).map_err(|e| e.to_string())
}

/// θ₀ alone from an encoded outer state (e.g. to export the stage's consensus weights).
pub fn outer_theta(bytes: &[u8], len: usize) -> Result<(u64, Vec<f32>), String> {
    let (round, _, theta) = outer_head(&mut Cursor(bytes), len)?;
    Ok((round, theta))
}

/// Magic, round, length, the previous-aggregate flag and θ₀.
fn outer_head(c: &mut Cursor<'_>, len: usize) -> Result<(u64, bool, Vec<f32>), String> {
    c.magic(OUTER_MAGIC)?;
    let round = c.u64()?;
    let n = c.u64()?;
    if n != len as u64 {
        return Err(format!("outer state has {n} values, this stage has {len}"));
    }
    let has_prev = match c.take(1)?[0] {
        0 => false,
        1 => true,
        other => return Err(format!("bad flag {other}")),
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

/// Decodes an optimizer blob into AdamW state for `params`.
pub fn decode_adamw(bytes: &[u8], config: AdamWConfig, params: &ParamSet) -> Result<AdamW, String> {
    let mut c = Cursor(bytes);
    c.magic(ADAMW_MAGIC)?;
    let step = c.u64()?;
    let n = c.u64()?;
    if n != params.numel() as u64 {
        return Err(format!(
            "optimizer state has {n} values, this stage has {}",
            params.numel()
        ));
    }
    let mut read = |what| -> Result<Vec<Vec<f32>>, String> {
        params
            .values()
            .iter()
            .map(|p| c.f32s(p.len(), what))
            .collect()
    };
    let m = read("first moment")?;
    let v = read("second moment")?;
    c.end()?;
    AdamW::from_state(config, params, step, m, v).map_err(|e| e.to_string())
}

impl Diloco {
    /// Starts at θ₀ = the current parameters, round 0.
    pub fn new(cfg: DilocoConfig, params: &ParamSet) -> Result<Self, String> {
        let theta = params.flatten();
        let outer = DilocoRound::new(
            theta,
            OuterOptimizer::with(params.numel(), cfg.outer_lr, cfg.outer_momentum),
            aggregator(&cfg, 1)?,
        );
        Ok(Self::from_round(cfg, outer))
    }

    /// Restores a saved or fetched outer state.
    pub fn restore(cfg: DilocoConfig, bytes: &[u8], len: usize) -> Result<Self, String> {
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
    pub fn prepare(&mut self, round: u64, params: &ParamSet) -> Result<Prepared, String> {
        let delta = self
            .outer
            .pseudo_gradient(&params.flatten())
            .map_err(|e| e.to_string())?;
        self.compressor.set_round(round);
        let honest = self
            .compressor
            .compress(&delta)
            .map_err(|e| e.to_string())?;
        let _ = self.compressor.take_residual();
        let decoded = decode(&honest, delta.len()).map_err(|e| e.to_string())?;
        let blob = if self.cfg.attack == Attack::None {
            honest
        } else {
            let forged = self
                .cfg
                .attack
                .forge(&[&decoded], 1, &mut rand::rng())
                .pop()
                .ok_or("attack produced nothing")?;
            let mut c = Compressor::with_seed(self.cfg.compression, delta.len(), self.cfg.seed);
            c.set_round(round);
            c.compress(&forged).map_err(|e| e.to_string())?
        };
        let blob = Arc::new(blob);
        self.sent = Some(Sent {
            round,
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
    ) -> Result<Applied, String> {
        if round != self.outer.round() + 1 {
            return Err(format!(
                "round {round} does not follow our round {}",
                self.outer.round()
            ));
        }
        let mut dense: BTreeMap<NodeId, Vec<f32>> = BTreeMap::new();
        let mut rejected = Vec::new();
        if let Some(s) = self.sent.as_ref().filter(|s| s.round == round) {
            let own = vec![(self.cfg.me, s.blob.to_vec())];
            self.decode_into(own, &mut dense, &mut rejected, true);
        }
        self.decode_into(messages, &mut dense, &mut rejected, false);
        let before = self.outer.clone();
        let applied = self.aggregate(round, &before, &dense, rejected, params)?;
        self.last = Some(LastRound {
            round,
            before,
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
    ) -> Result<Applied, String> {
        let Some(mut last) = self.last.take().filter(|l| l.round == round) else {
            return Err(format!("round {round} is not the round we aggregated last"));
        };
        if self.outer.round() != round {
            self.last = Some(last);
            return Err(format!("we moved on from round {round}"));
        }
        let mut rejected = Vec::new();
        self.decode_into(extra, &mut last.inputs, &mut rejected, false);
        let chosen: BTreeMap<NodeId, Vec<f32>> = set
            .iter()
            .filter_map(|n| last.inputs.get(n).map(|v| (*n, v.clone())))
            .collect();
        if chosen.len() != set.len() || !rejected.is_empty() {
            let missing = set.len() - chosen.len();
            self.last = Some(last);
            return Err(format!(
                "cannot rebuild the set: {missing} messages missing, {} malformed",
                rejected.len()
            ));
        }
        let applied = self.aggregate(round, &last.before, &chosen, rejected, params);
        self.last = Some(last);
        applied
    }

    fn decode_into(
        &self,
        messages: Vec<(NodeId, Vec<u8>)>,
        dense: &mut BTreeMap<NodeId, Vec<f32>>,
        rejected: &mut Vec<(NodeId, String)>,
        own: bool,
    ) {
        let len = self.outer.theta().len();
        for (node, bytes) in messages {
            if node == self.cfg.me && !own {
                continue;
            }
            match decode(&bytes, len) {
                Ok(v) if v.iter().all(|x| x.is_finite()) => {
                    dense.insert(node, v);
                }
                Ok(_) => rejected.push((node, "non-finite pseudo-gradient".into())),
                Err(e) => rejected.push((node, e.to_string())),
            }
        }
    }

    /// Applies the outer step of `round` from the state `from` over `dense` (in node-id
    /// order) and shifts the parameters from the current θ₀ to the result.
    fn aggregate(
        &mut self,
        round: u64,
        from: &DilocoRound,
        dense: &BTreeMap<NodeId, Vec<f32>>,
        rejected: Vec<(NodeId, String)>,
        params: &mut ParamSet,
    ) -> Result<Applied, String> {
        if dense.is_empty() {
            return Err("no usable pseudo-gradient".into());
        }
        let mut next = from.clone();
        next.set_aggregator(aggregator(&self.cfg, dense.len())?);
        let inputs: Vec<&Vec<f32>> = dense.values().collect();
        let outcome = next.apply(&inputs).map_err(|e| e.to_string())?;
        let current = std::mem::replace(&mut self.outer, next);
        let included = dense.contains_key(&self.cfg.me);
        self.shift(current.theta(), included, params)?;
        let outer = Arc::new(encode_outer(&self.outer));
        self.hash = *blake3::hash(&outer).as_bytes();
        Ok(Applied {
            round,
            theta: self.hash,
            outer,
            contributors: dense.keys().copied().collect(),
            rejected,
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
    ) -> Result<[u8; 32], String> {
        let len = self.outer.theta().len();
        let agg = aggregator(&self.cfg, 1)?;
        let fresh = decode_outer(bytes, len, &self.cfg, agg)?;
        if fresh.round() != round || round < self.outer.round() {
            return Err(format!(
                "outer state is round {}, expected {round} (we are at {})",
                fresh.round(),
                self.outer.round()
            ));
        }
        let before = std::mem::replace(&mut self.outer, fresh);
        self.shift(before.theta(), included, params)?;
        self.hash = *blake3::hash(bytes).as_bytes();
        Ok(self.hash)
    }

    /// θ ← θ + (θ₀' − θ₀) + (now − before included)·ĉ for our message of this round.
    fn shift(
        &mut self,
        before: &[f32],
        included: bool,
        params: &mut ParamSet,
    ) -> Result<(), String> {
        let round = self.outer.round();
        let mut flat = params.flatten();
        for ((p, new), old) in flat.iter_mut().zip(self.outer.theta()).zip(before) {
            *p += new - old;
        }
        if let Some(s) = self.sent.as_mut().filter(|s| s.round == round) {
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
            s.applied = included;
        }
        params.set_flat(&flat).map_err(|e| e.to_string())
    }
}

/// The configured rule with its Byzantine count capped at what `n` inputs can tolerate.
fn aggregator(cfg: &DilocoConfig, n: usize) -> Result<Aggregator, String> {
    let f = cfg.byzantine.min(n.saturating_sub(1) / 2);
    Aggregator::parse(&cfg.aggregator, f).map_err(|e| format!("aggregator: {e}"))
}

#[cfg(test)]
pub(crate) mod tests;
