//! The network genesis: one signed document that names a network. It fixes the dataset, the
//! model, the protocol parameters every node must share and the stakes the ledger starts from;
//! the network id is the BLAKE3 hash of its signed bytes.
//!
//! Because the id is the hash of the document, a record under the DHT's network key that is
//! not this document is simply another network: nobody can veto or replace ours by writing
//! one. A node that joins with `--bootstrap` and no genesis file learns the document from the
//! DHT (pinned by `--network` when given) and takes its model and protocol from it, so users
//! no longer repeat the first node's model flags.

use neuroshard_growth::{Architecture, GrowthError, NetworkGrowth, Shape};
use neuroshard_ledger::{LedgerGenesis, Rules, UNITS_PER_NEURO};
use neuroshard_model::ModelConfig;
use neuroshard_proof::{
    Canonical, CodecError, Hash32, Identity, PublicKey, Reader, Signed, Writer,
};
use serde::{Deserialize, Serialize};

use crate::settings::NodeSettings;

/// File in a node's data directory that holds the signed genesis of its network.
pub const GENESIS_FILE: &str = "network.genesis";
/// Largest encoded protocol section.
const MAX_PROTOCOL_JSON: usize = 16 * 1024;
/// Largest description.
const MAX_DESCRIPTION: usize = 1024;
/// A founder's stake when a node founds a network on its own (100 NEURO).
pub const FOUNDER_STAKE: u64 = 100 * UNITS_PER_NEURO;

/// The largest weight lag a pipeline runs (the engine keeps one older copy of the weights).
pub const MAX_WEIGHT_LAG: u64 = 1;

/// What every node of a network must agree on, besides the dataset and the stakes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Protocol {
    pub model: ModelConfig,
    pub stages: usize,
    /// Rows per driver step and their split into micro-batches: the shapes stages accept.
    pub batch: usize,
    pub micro_batches: usize,
    pub seq: usize,
    /// How activations and gradients cross stage boundaries; geneses written before the field
    /// existed ran uncompressed.
    #[serde(default = "crate::act_codec::ActSpec::uncompressed")]
    pub activations: crate::act_codec::ActSpec,
    /// Optimizer steps a micro-batch's weights lag behind the step it counts toward (0: the
    /// pipeline flushes between driver steps; 1: it overlaps them, see
    /// `pipeline/schedule.rs`). Geneses written before the field existed flushed.
    #[serde(default)]
    pub weight_lag: u64,
    /// DiLoCo: inner steps per round, aggregator, Byzantine replicas tolerated, compression,
    /// outer step, norm bound.
    pub sync_every: u64,
    pub aggregator: String,
    pub byzantine: usize,
    pub compression: String,
    pub outer_lr: f32,
    pub outer_momentum: f32,
    /// Offers longer than this multiple of the round's lower-median norm are clipped.
    pub norm_bound: f64,
    /// Economy: stake to register, reward per (node, stage, round), shortest round, and the
    /// distinct registered co-replicas whose receipts a training proof needs.
    pub min_stake: u64,
    pub round_reward: u64,
    pub min_round_ms: u64,
    pub min_receipts: usize,
    /// Rounds a training proof may claim past its stage's certified round
    /// (`LedgerState::certified_round`). Geneses written before the field set no bound; a
    /// genesis without one leaves it out, so its bytes and network id stay what they were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub round_lead: u64,
    /// How long unstaked funds stay slashable before a withdrawal (`Rules::unbonding_ms`).
    /// Geneses written before the field unbond in a day; a genesis with that default leaves
    /// it out, so its bytes and network id stay what they were.
    #[serde(
        default = "default_unbonding_ms",
        skip_serializing_if = "is_default_unbonding"
    )]
    pub unbonding_ms: u64,
    /// Jobs audited, in parts per million (`neuroshard_audit::AuditRate`): which jobs are
    /// challenged, so which validator fees and demands every node takes. Geneses written
    /// before the field audited at the default rate.
    #[serde(default = "default_audit_per_million")]
    pub audit_per_million: u32,
    /// How the network grows (`neuroshard_growth`): its architecture then lives in the
    /// finalized ledger state, starting from `model` split into `stages`. Geneses written
    /// before the field trained one fixed model; a fixed model's genesis leaves it out, so its
    /// bytes, and the network id, are what they were before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<neuroshard_growth::GrowthPolicy>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn default_unbonding_ms() -> u64 {
    neuroshard_ledger::rules::DEFAULT_UNBONDING_MS
}

fn is_default_unbonding(v: &u64) -> bool {
    *v == default_unbonding_ms()
}

fn default_audit_per_million() -> u32 {
    neuroshard_audit::AuditRate::default().per_million
}

impl Protocol {
    /// The protocol a founder's settings describe.
    pub fn from_settings(s: &NodeSettings) -> Self {
        Self {
            model: s.model.clone(),
            stages: s.stages,
            batch: s.batch,
            micro_batches: s.micro_batches,
            seq: s.seq,
            activations: s.activations,
            weight_lag: s.weight_lag,
            sync_every: s.sync.every,
            aggregator: s.sync.aggregator.clone(),
            byzantine: s.sync.byzantine,
            compression: s.sync.compression.clone(),
            outer_lr: s.sync.outer_lr,
            outer_momentum: s.sync.outer_momentum,
            norm_bound: s.sync.norm_bound,
            min_stake: neuroshard_ledger::rules::DEFAULT_MIN_STAKE,
            round_reward: neuroshard_ledger::rules::DEFAULT_ROUND_REWARD,
            min_round_ms: neuroshard_ledger::rules::DEFAULT_MIN_ROUND_MS,
            min_receipts: 1,
            round_lead: neuroshard_ledger::rules::DEFAULT_ROUND_LEAD,
            unbonding_ms: default_unbonding_ms(),
            audit_per_million: s.audit.per_million,
            growth: s.growth.clone(),
        }
    }

    /// The network's audit rate.
    pub fn audit_rate(&self) -> neuroshard_audit::AuditRate {
        neuroshard_audit::AuditRate {
            per_million: self.audit_per_million,
        }
    }

    /// Makes `s` follow this protocol (a joiner's own flags for these are overridden).
    pub fn apply_to(&self, s: &mut NodeSettings) {
        s.model = self.model.clone();
        s.stages = self.stages;
        s.batch = self.batch;
        s.micro_batches = self.micro_batches;
        s.seq = self.seq;
        s.activations = self.activations;
        s.weight_lag = self.weight_lag;
        s.sync.every = self.sync_every;
        s.sync.aggregator = self.aggregator.clone();
        s.sync.byzantine = self.byzantine;
        s.sync.compression = self.compression.clone();
        s.sync.outer_lr = self.outer_lr;
        s.sync.outer_momentum = self.outer_momentum;
        s.sync.norm_bound = self.norm_bound;
        s.audit.per_million = self.audit_per_million;
        s.growth = self.growth.clone();
    }

    /// The network's architecture at version 0, for a network that grows: the model's shape
    /// split into the protocol's stages.
    pub fn genesis_growth(&self) -> Result<Option<NetworkGrowth>, NetworkError> {
        let Some(policy) = &self.growth else {
            return Ok(None);
        };
        let m = &self.model;
        if m.tie_embeddings {
            return Err(NetworkError::Growth(GrowthError::Config(
                "a growing network needs untied embeddings (the scaler counts both)".into(),
            )));
        }
        if self.stages < 2 {
            return Err(NetworkError::Growth(GrowthError::Config(
                "a growing network needs at least two stages (new blocks form a stage between \
                 the embedding's and the head's)"
                    .into(),
            )));
        }
        let shape = shape_of(m);
        let split = neuroshard_model::StageSpec::split(m, self.stages)?;
        let layers: Vec<u64> = split
            .iter()
            .map(|s| (s.end_layer - s.first_layer) as u64)
            .collect();
        let arch = Architecture::genesis(shape, &layers)?;
        Ok(Some(NetworkGrowth::new(policy.clone(), arch)?))
    }
}

/// The scaler's view of a model's shape.
pub fn shape_of(m: &ModelConfig) -> Shape {
    Shape {
        layers: m.layers as u64,
        d_model: m.d_model as u64,
        heads: m.heads as u64,
        kv_heads: m.kv_heads as u64,
        ffn: m.ffn as u64,
        vocab: m.vocab as u64,
    }
}

/// The network genesis document.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkGenesis {
    /// Root of the genesis dataset's signed manifest.
    pub dataset_root: Hash32,
    pub founded_ms: u64,
    pub protocol: Protocol,
    /// (founder's key, stake) the ledger starts with, sorted by node id: the keys make the
    /// first finality committee.
    pub stakes: Vec<(PublicKey, u64)>,
    pub description: String,
}

/// Why a genesis document cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("genesis: {0}")]
    Codec(#[from] CodecError),
    #[error("genesis envelope: {0}")]
    Envelope(#[from] neuroshard_proof::EnvelopeError),
    #[error("genesis stakes: {0}")]
    Stakes(#[from] neuroshard_ledger::GenesisError),
    #[error("genesis model: {0}")]
    Model(#[from] neuroshard_model::ModelError),
    #[error("genesis names {got} stages for a {layers}-layer model")]
    Stages { got: usize, layers: usize },
    #[error("genesis growth: {0}")]
    Growth(#[from] GrowthError),
    #[error("genesis names a weight lag of {0} (0 or 1)")]
    WeightLag(u64),
    /// A step of fewer rows than micro-batches would never count as complete: every node
    /// would wait forever.
    #[error(
        "genesis splits a batch of {batch} rows into {micro_batches} micro-batches (1 to {batch})"
    )]
    MicroBatches { batch: usize, micro_batches: usize },
    #[error("no bootstrap peer or DHT record offered a genesis of network {0}")]
    NotFound(String),
    #[error(
        "{0} different network geneses were offered; pass --network with the id of the one \
         to join"
    )]
    Ambiguous(usize),
    #[error("genesis file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl Canonical for NetworkGenesis {
    const DOMAIN: &'static str = "neuroshard/network-genesis/v2";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.dataset_root);
        w.u64(self.founded_ms);
        w.bytes(&serde_json::to_vec(&self.protocol).unwrap_or_default());
        w.len(self.stakes.len());
        for (key, stake) in &self.stakes {
            w.fixed(key.as_bytes());
            w.u64(*stake);
        }
        w.bytes(self.description.as_bytes());
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let dataset_root = r.array()?;
        let founded_ms = r.u64()?;
        let protocol = serde_json::from_slice(r.bytes(MAX_PROTOCOL_JSON)?).map_err(|e| {
            CodecError::Invalid {
                field: "protocol",
                reason: e.to_string(),
            }
        })?;
        let n = r.len(neuroshard_ledger::rules::MAX_GENESIS_STAKES)?;
        let stakes = (0..n)
            .map(|_| {
                let key: [u8; 33] = r.array()?;
                let key = PublicKey::from_bytes(&key).map_err(|e| CodecError::Invalid {
                    field: "genesis stake key",
                    reason: e.to_string(),
                })?;
                Ok((key, r.u64()?))
            })
            .collect::<Result<_, CodecError>>()?;
        let description = String::from_utf8(r.bytes(MAX_DESCRIPTION)?.to_vec()).map_err(|e| {
            CodecError::Invalid {
                field: "description",
                reason: e.to_string(),
            }
        })?;
        Ok(Self {
            dataset_root,
            founded_ms,
            protocol,
            stakes,
            description,
        })
    }
}

/// A genesis with its signed bytes and id, checked for use.
#[derive(Debug, Clone)]
pub struct Network {
    pub genesis: NetworkGenesis,
    /// The signed document as published.
    pub signed: Vec<u8>,
    pub id: Hash32,
}

impl Network {
    /// The seed every replica of this network draws its `randk` masks and low-rank bases
    /// from: the network id's first eight bytes. It must be one value network-wide (a node
    /// refuses offers on another mask), so it comes from the genesis, never from a node's own
    /// `--seed`.
    pub fn sync_seed(&self) -> u64 {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.id[..8]);
        u64::from_le_bytes(first)
    }

    /// Signs `genesis` as its founder.
    pub fn found(founder: &Identity, genesis: NetworkGenesis) -> Result<Self, NetworkError> {
        Self::open(&Signed::sign(founder, &genesis).to_bytes())
    }

    /// Reads and checks a signed genesis: signature, model, stage count, stakes.
    pub fn open(signed: &[u8]) -> Result<Self, NetworkError> {
        let envelope = Signed::<NetworkGenesis>::from_bytes(signed)?;
        let genesis = envelope.verify()?;
        genesis.protocol.model.validate()?;
        let p = &genesis.protocol;
        if p.stages == 0 || p.stages > p.model.layers {
            return Err(NetworkError::Stages {
                got: p.stages,
                layers: p.model.layers,
            });
        }
        if p.weight_lag > MAX_WEIGHT_LAG {
            return Err(NetworkError::WeightLag(p.weight_lag));
        }
        if p.micro_batches == 0 || p.micro_batches > p.batch {
            return Err(NetworkError::MicroBatches {
                batch: p.batch,
                micro_batches: p.micro_batches,
            });
        }
        neuroshard_ledger::LedgerGenesis::new(Rules::default(), genesis.stakes.clone())?;
        p.genesis_growth()?;
        Ok(Self {
            id: envelope.payload_hash(),
            genesis,
            signed: signed.to_vec(),
        })
    }

    /// What the ledger starts from.
    pub fn ledger_genesis(&self) -> Result<LedgerGenesis, NetworkError> {
        let p = &self.genesis.protocol;
        let rules = Rules {
            network: self.id,
            founded_ms: self.genesis.founded_ms,
            min_stake: p.min_stake,
            round_reward: p.round_reward,
            min_round_ms: p.min_round_ms,
            round_lead: p.round_lead,
            unbonding_ms: p.unbonding_ms,
        };
        let genesis = LedgerGenesis::new(rules, self.genesis.stakes.clone())?;
        Ok(match p.genesis_growth()? {
            Some(growth) => genesis.with_growth(growth),
            None => genesis,
        })
    }

    /// Reads the genesis file.
    pub fn load(path: &std::path::Path) -> Result<Self, NetworkError> {
        let bytes = std::fs::read(path).map_err(|source| NetworkError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::open(&bytes)
    }

    /// Writes the genesis file.
    pub fn save(&self, path: &std::path::Path) -> Result<(), NetworkError> {
        std::fs::write(path, &self.signed).map_err(|source| NetworkError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

/// A request for the signed genesis of the network the asked node belongs to: how a joiner
/// that names no network learns the one its bootstrap peer is in. The answer is the genesis
/// file's bytes, which prove themselves (their hash is the network id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenesisRequest;

impl Canonical for GenesisRequest {
    const DOMAIN: &'static str = "neuroshard/genesis-request/v1";

    fn encode_body(&self, _: &mut Writer) {}

    fn decode_body(_: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self)
    }
}

/// The genesis a joiner takes from what its bootstrap peers served or the DHT's values under
/// the network key: the one whose id is `pin` when given; otherwise the only valid one
/// (several different ones are refused, as joining a stranger's network by accident would
/// be worse than asking).
pub fn choose(values: &[Vec<u8>], pin: Option<&Hash32>) -> Result<Network, NetworkError> {
    let mut found: Vec<Network> = Vec::new();
    for v in values {
        if let Ok(n) = Network::open(v)
            && !found.iter().any(|f| f.id == n.id)
        {
            found.push(n);
        }
    }
    if let Some(pin) = pin {
        return found
            .into_iter()
            .find(|n| n.id == *pin)
            .ok_or_else(|| NetworkError::NotFound(hex::encode(pin)));
    }
    match found.len() {
        0 => Err(NetworkError::NotFound("(any)".into())),
        1 => Ok(found.remove(0)),
        n => Err(NetworkError::Ambiguous(n)),
    }
}

/// The genesis a joiner takes from the geneses its bootstrap peers `served` and the DHT
/// `records` under its pinned id's key. With `pin`, the genesis of that id from either.
/// Without, only what the bootstrap peers served: the user chose them, while any stranger can
/// write a DHT record, so a joiner that read the DHT's network key joined whatever genesis
/// the look-up found first; bootstrap peers of different networks are refused, not guessed
/// between.
pub fn choose_to_join(
    served: &[Vec<u8>],
    records: &[Vec<u8>],
    pin: Option<&Hash32>,
) -> Result<Network, NetworkError> {
    match pin {
        None => choose(served, None),
        Some(pin) => {
            let all: Vec<Vec<u8>> = served.iter().chain(records).cloned().collect();
            choose(&all, Some(pin))
        }
    }
}

#[cfg(test)]
mod tests;
