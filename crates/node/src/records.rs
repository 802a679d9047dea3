//! Signed announcements: heartbeats on gossip, node and network records in the DHT.
//!
//! Every one is a `Signed<T>` whose signer must be the author/publisher the transport names
//! (one identity: the node id is the hash of the key the transport authenticated), so a peer
//! cannot speak for another.

use neuroshard_net::Validation;
use neuroshard_proof::{Canonical, CodecError, Hash32, NodeId, Reader, Signed, Writer};

/// A gossip topic. Every topic is scoped to one stage: a node hears its own stage and its two
/// neighbours, never the whole network, so what each node receives stays bounded as the
/// network grows by adding stages. Proofs reach the neighbourhood by gossip and the rest of
/// the network by ledger anti-entropy, many per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Topic {
    /// Liveness and load of the replicas of a stage.
    Heartbeat(u16),
    /// DiLoCo offers and round outcomes of a stage.
    Sync(u16),
    /// Proofs of the replicas of a stage, each published by its prover.
    Proof(u16),
    /// Signed account ops (registrations, stakes, transfers): the one network-wide topic.
    /// Every node needs every registration to judge proofs, and ops are rare (a few per node
    /// lifetime), so they cost little to send to all.
    Ops,
    /// Ledger finality: consensus messages, epoch bodies and equivocation evidence
    /// (network-wide: every node follows the finalized ledger).
    Finality,
}

const HEARTBEAT_PREFIX: &str = "neuroshard/heartbeat/3/";
const SYNC_PREFIX: &str = "neuroshard/sync/2/";
const PROOF_PREFIX: &str = "neuroshard/proof/2/";
const OPS_TOPIC: &str = "neuroshard/ops/2";
const FINALITY_TOPIC: &str = "neuroshard/finality/1";

impl Topic {
    /// The name the transport subscribes to.
    pub fn name(&self) -> String {
        match self {
            Topic::Heartbeat(s) => format!("{HEARTBEAT_PREFIX}{s}"),
            Topic::Sync(s) => format!("{SYNC_PREFIX}{s}"),
            Topic::Proof(s) => format!("{PROOF_PREFIX}{s}"),
            Topic::Ops => OPS_TOPIC.into(),
            Topic::Finality => FINALITY_TOPIC.into(),
        }
    }

    /// The topic named `name`, only in its one canonical spelling (no "01" for "1").
    pub fn parse(name: &str) -> Option<Topic> {
        let topic = if let Some(s) = name.strip_prefix(HEARTBEAT_PREFIX) {
            Topic::Heartbeat(s.parse().ok()?)
        } else if let Some(s) = name.strip_prefix(SYNC_PREFIX) {
            Topic::Sync(s.parse().ok()?)
        } else if let Some(s) = name.strip_prefix(PROOF_PREFIX) {
            Topic::Proof(s.parse().ok()?)
        } else if name == OPS_TOPIC {
            Topic::Ops
        } else if name == FINALITY_TOPIC {
            Topic::Finality
        } else {
            return None;
        };
        (topic.name() == name).then_some(topic)
    }

    /// The kind of messages a topic carries, whatever its stage.
    pub fn kind(&self) -> &'static str {
        match self {
            Topic::Heartbeat(_) => "heartbeat",
            Topic::Sync(_) => "sync",
            Topic::Proof(_) => "proof",
            Topic::Ops => "ops",
            Topic::Finality => "finality",
        }
    }

    /// The stage a topic belongs to (none for the network-wide one).
    pub fn stage(&self) -> Option<usize> {
        match self {
            Topic::Heartbeat(s) | Topic::Sync(s) | Topic::Proof(s) => Some(usize::from(*s)),
            Topic::Ops | Topic::Finality => None,
        }
    }

    /// What a node of `stage` hears: heartbeats and proofs of the stages in `near` (its own,
    /// those it sends to and receives from), and its own stage's rounds.
    pub fn subscriptions(stage: usize, near: &std::collections::BTreeSet<usize>) -> Vec<Topic> {
        let near: Vec<u16> = near.iter().filter_map(|s| u16::try_from(*s).ok()).collect();
        let mut topics: Vec<Topic> = near.iter().copied().map(Topic::Heartbeat).collect();
        topics.extend(near.iter().copied().map(Topic::Proof));
        if let Ok(s) = u16::try_from(stage) {
            topics.push(Topic::Sync(s));
        }
        topics.push(Topic::Ops);
        topics.push(Topic::Finality);
        topics
    }

    /// Every heartbeat topic of a network: what a starting node listens to before it knows
    /// its stage.
    pub fn all_heartbeats(stages: usize) -> Vec<Topic> {
        (0..stages)
            .filter_map(|s| u16::try_from(s).ok())
            .map(Topic::Heartbeat)
            .collect()
    }
}

impl std::fmt::Display for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

pub const NETWORK_KEY: &[u8] = b"neuroshard/network";
/// Longest a DHT record may claim to live (records are re-published every 20 s, live 60 s).
pub const MAX_RECORD_LIFETIME_MS: u64 = 10 * 60_000;
const MAX_ADDRS: usize = 16;
const MAX_ADDR_LEN: usize = 256;

/// The role a stage index implies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Data, embedding and the first layers.
    Driver,
    /// Middle layers.
    Worker,
    /// Last layers, final norm, LM head and the loss.
    Validator,
    /// The whole model on one node (a one-stage network).
    Solo,
}

impl Role {
    pub fn of(stage: usize, stages: usize) -> Role {
        Self::from_ends(stage == 0, stage + 1 == stages)
    }

    /// The role of a stage that is (or is not) the first and the last of its pipeline.
    pub fn from_ends(first: bool, last: bool) -> Role {
        match (first, last) {
            (true, true) => Role::Solo,
            (true, false) => Role::Driver,
            (false, true) => Role::Validator,
            (false, false) => Role::Worker,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Driver => "driver",
            Role::Worker => "worker",
            Role::Validator => "validator",
            Role::Solo => "solo",
        }
    }
}

/// Liveness and load, every `every_ms` (2 s in small stages, longer in large ones:
/// `peers::heartbeat_every`); `leaving` marks the deathrattle of a clean shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub node: NodeId,
    pub network: Hash32,
    pub stage: u16,
    pub step: u64,
    pub queue: u32,
    pub time_ms: u64,
    /// The sender's heartbeat period: it counts as gone after three silent ones.
    pub every_ms: u32,
    pub leaving: bool,
    /// The newest architecture the sender's finalized ledger holds, for nodes that are
    /// choosing a stage (they have no ledger yet). Version 0 carries no stages.
    pub arch: ArchView,
}

/// An architecture version as heartbeats carry it: its stages in pipeline order, each as
/// (id, blocks).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ArchView {
    pub version: u32,
    pub stages: Vec<(u16, u32)>,
}

/// Most stages a heartbeat's architecture may list.
pub const MAX_VIEW_STAGES: usize = 256;

impl ArchView {
    pub fn of(arch: &neuroshard_growth::Architecture) -> Self {
        Self {
            version: arch.version,
            stages: arch
                .stages
                .iter()
                .take(MAX_VIEW_STAGES)
                .map(|s| (s.id, u32::try_from(s.layers).unwrap_or(u32::MAX)))
                .collect(),
        }
    }

    /// The architecture it names, for a network founded with `base`.
    pub fn architecture(
        &self,
        base: &neuroshard_model::ModelConfig,
    ) -> neuroshard_growth::Architecture {
        let mut shape = crate::network::shape_of(base);
        shape.layers = self.stages.iter().map(|s| u64::from(s.1)).sum();
        neuroshard_growth::Architecture {
            version: self.version,
            shape,
            stages: self
                .stages
                .iter()
                .map(|&(id, layers)| neuroshard_growth::StageLayout {
                    id,
                    layers: u64::from(layers),
                })
                .collect(),
        }
    }
}

impl Canonical for Heartbeat {
    const DOMAIN: &'static str = "neuroshard/heartbeat/v3";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.node.0);
        w.fixed(&self.network);
        w.u16(self.stage);
        w.u64(self.step);
        w.u32(self.queue);
        w.u64(self.time_ms);
        w.u32(self.every_ms);
        w.u8(u8::from(self.leaving));
        w.u32(self.arch.version);
        w.u32(self.arch.stages.len() as u32);
        for (id, layers) in &self.arch.stages {
            w.u16(*id);
            w.u32(*layers);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            node: NodeId(r.array()?),
            network: r.array()?,
            stage: r.u16()?,
            step: r.u64()?,
            queue: r.u32()?,
            time_ms: r.u64()?,
            every_ms: r.u32()?,
            leaving: match r.u8()? {
                0 => false,
                1 => true,
                v => {
                    return Err(CodecError::Invalid {
                        field: "leaving",
                        reason: format!("{v}"),
                    });
                }
            },
            arch: {
                let version = r.u32()?;
                let n = r.u32()? as usize;
                if n > MAX_VIEW_STAGES {
                    return Err(CodecError::Invalid {
                        field: "architecture stages",
                        reason: format!("{n} over {MAX_VIEW_STAGES}"),
                    });
                }
                let mut stages = Vec::with_capacity(n);
                for _ in 0..n {
                    stages.push((r.u16()?, r.u32()?));
                }
                ArchView { version, stages }
            },
        })
    }
}

/// What one node serves, stored in the DHT under [`node_key`] with an expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub node: NodeId,
    pub network: Hash32,
    pub stage: u16,
    pub expires_ms: u64,
    pub addrs: Vec<String>,
}

impl Canonical for NodeRecord {
    const DOMAIN: &'static str = "neuroshard/node-record/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.node.0);
        w.fixed(&self.network);
        w.u16(self.stage);
        w.u64(self.expires_ms);
        w.len(self.addrs.len());
        for a in &self.addrs {
            w.bytes(a.as_bytes());
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let node = NodeId(r.array()?);
        let network = r.array()?;
        let stage = r.u16()?;
        let expires_ms = r.u64()?;
        let n = r.len(MAX_ADDRS)?;
        let addrs = (0..n)
            .map(|_| {
                String::from_utf8(r.bytes(MAX_ADDR_LEN)?.to_vec()).map_err(|e| {
                    CodecError::Invalid {
                        field: "address",
                        reason: e.to_string(),
                    }
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            node,
            network,
            stage,
            expires_ms,
            addrs,
        })
    }
}

/// DHT key of a network's genesis by its id: the value must hash to the id, so nobody can
/// replace it, only withhold it.
pub fn network_key(network: &Hash32) -> Vec<u8> {
    format!("neuroshard/network/{}", hex::encode(network)).into_bytes()
}

/// DHT key of a node's record.
pub fn node_key(node: &NodeId) -> Vec<u8> {
    let mut k = b"neuroshard/node/".to_vec();
    k.extend_from_slice(&node.0);
    k
}

/// DHT provider key of the replicas of `stage` in `network`.
pub fn stage_key(network: &Hash32, stage: usize) -> Vec<u8> {
    format!("neuroshard/stage/{}/{stage}", hex::encode(network)).into_bytes()
}

/// DHT provider validation: nodes only announce, and only look up, the stage keys of their
/// network; any other key (or a stage past the network's last) is junk a peer could use to fill
/// the store's key budget. Before the node knows its network, any network's stage key passes.
pub fn validate_provider_key(key: &[u8], network: Option<&Hash32>, stages: usize) -> bool {
    let Some(rest) = key.strip_prefix(b"neuroshard/stage/") else {
        return false;
    };
    let Some((net_hex, stage)) = std::str::from_utf8(rest)
        .ok()
        .and_then(|r| r.split_once('/'))
    else {
        return false;
    };
    let net_ok = match network {
        Some(n) => net_hex == hex::encode(n),
        None => net_hex.len() == 64 && net_hex.bytes().all(|b| b.is_ascii_hexdigit()),
    };
    // `stage_key` writes a plain decimal: no sign, no leading zero.
    let canonical = stage
        .parse::<usize>()
        .is_ok_and(|s| s < stages && s.to_string() == stage);
    net_ok && canonical
}

/// Verifies a signed value and that `author` (when known) is its signer.
pub fn open<T: Canonical>(
    bytes: &[u8],
    author: Option<&NodeId>,
) -> Result<T, crate::core::OpenError> {
    let signed = Signed::<T>::from_bytes(bytes)?;
    let value = signed.verify()?;
    if let Some(author) = author
        && signed.signer().node_id() != *author
    {
        return Err(crate::core::OpenError::NotTheSender {
            signer: signed.signer().node_id(),
            from: *author,
        });
    }
    Ok(value)
}

/// Gossip validation: heartbeats must be signed by their author and name the author's node.
pub fn validate_gossip(topic: &str, author: &NodeId, data: &[u8]) -> Validation {
    let stage = match Topic::parse(topic) {
        Some(Topic::Sync(stage)) => {
            return match open::<crate::sync::SyncMsg>(data, Some(author)) {
                Ok(m) if m.stage() == stage => Validation::Accept,
                Ok(_) => {
                    tracing::debug!(%author, "sync message on another stage's topic");
                    Validation::Reject
                }
                Err(e) => {
                    tracing::debug!(%author, "sync message refused: {e}");
                    Validation::Reject
                }
            };
        }
        // The envelope, its author and its signature here, so a forged proof is not
        // forwarded to everyone (one verification, ~75 µs); the economy checks the rest.
        Some(Topic::Proof(_)) => {
            return match neuroshard_proof::SignedProof::from_bytes(data) {
                Ok(p) if p.signer().node_id() == *author && p.verify().is_ok() => {
                    Validation::Accept
                }
                _ => Validation::Reject,
            };
        }
        // Consensus signatures are checked against the committee by the finality machine,
        // which reports (and the core penalises) a sender of bad ones; here only the form.
        Some(Topic::Finality) => {
            return match crate::finality::FinalityGossip::from_canonical_bytes(data) {
                Ok(_) => Validation::Accept,
                Err(_) => Validation::Reject,
            };
        }
        // Signed by the account it debits, published by that account (relays come by
        // anti-entropy); the economy checks the rest.
        // A settlement of paid inference is published by the entry node the payer named.
        Some(Topic::Ops) => {
            // A fraud report is published by its accuser (every node replays it before its
            // verdict counts; see `core/fraud.rs`).
            if let Ok(report) = crate::wire::FraudReport::from_canonical_bytes(data) {
                let acc = &report.proof.accusation;
                return if acc.signer().node_id() == *author && acc.verify().is_ok() {
                    Validation::Accept
                } else {
                    Validation::Reject
                };
            }
            // An audit demand is published by its auditor (jurors check the rest).
            // (An envelope's payload is any type's: the demand's domain tells it apart.)
            if let Ok(d) = neuroshard_proof::Signed::<crate::wire::AuditDemand>::from_bytes(data)
                && crate::wire::AuditDemand::from_canonical_bytes(d.payload_bytes()).is_ok()
            {
                return if d.signer().node_id() == *author && d.verify().is_ok() {
                    Validation::Accept
                } else {
                    Validation::Reject
                };
            }
            // Fee claims are published by the auditor every claim pays (the committee checks
            // the workers' signatures and the draw).
            if let Ok(f) = neuroshard_proof::Signed::<crate::wire::FeeClaims>::from_bytes(data)
                && let Ok(claims) = crate::wire::FeeClaims::from_canonical_bytes(f.payload_bytes())
            {
                let to_author = claims.claims.iter().all(|c| {
                    neuroshard_audit::Served::from_canonical_bytes(c.served.payload_bytes())
                        .is_ok_and(|s| s.to == *author)
                });
                return if to_author && f.signer().node_id() == *author && f.verify().is_ok() {
                    Validation::Accept
                } else {
                    Validation::Reject
                };
            }
            return match neuroshard_ledger::decode_op(data) {
                // A payment spreads only inside its settlement (every ledger refuses it bare).
                Ok(op) => match op.op().action {
                    neuroshard_ledger::Action::PayInference { entry, .. } => {
                        if entry == *author && !op.payees().is_empty() {
                            Validation::Accept
                        } else {
                            Validation::Reject
                        }
                    }
                    _ if op.op().account == *author => Validation::Accept,
                    _ => Validation::Reject,
                },
                Err(_) => Validation::Reject,
            };
        }
        Some(Topic::Heartbeat(stage)) => stage,
        None => return Validation::Ignore,
    };
    match open::<Heartbeat>(data, Some(author)) {
        Ok(hb) if hb.node == *author && hb.stage == stage => Validation::Accept,
        Ok(_) => {
            tracing::debug!(%author, "heartbeat names another node or stage");
            Validation::Reject
        }
        Err(e) => {
            tracing::debug!(%author, "heartbeat refused: {e}");
            Validation::Reject
        }
    }
}

/// DHT validation: node records under their own key, unexpired, signed by the publisher;
/// a network genesis signed by anyone (each reader compares its hash with the id it follows),
/// and under its id's key only the document with that hash.
pub fn validate_record(key: &[u8], value: &[u8], publisher: Option<&NodeId>, now_ms: u64) -> bool {
    if key == NETWORK_KEY {
        return crate::network::Network::open(value).is_ok();
    }
    if key.starts_with(b"neuroshard/network/") {
        return crate::network::Network::open(value).is_ok_and(|n| network_key(&n.id) == key);
    }
    // A record speaks for the node that signed it, and lives a bounded time: naming another
    // node (its addresses, its θ₀) or living "forever" is refused.
    let fresh = |expires_ms: u64| {
        expires_ms > now_ms && expires_ms <= now_ms.saturating_add(MAX_RECORD_LIFETIME_MS)
    };
    if key.starts_with(b"neuroshard/theta/") {
        return signed_by::<crate::sync::ThetaRecord>(value, publisher).is_some_and(
            |(rec, signer)| {
                crate::sync::theta_key(&rec.network, usize::from(rec.stage)) == key
                    && rec.node == signer
                    && fresh(rec.expires_ms)
            },
        );
    }
    if key.starts_with(b"neuroshard/node/") {
        return signed_by::<NodeRecord>(value, publisher).is_some_and(|(rec, signer)| {
            node_key(&rec.node) == key && rec.node == signer && fresh(rec.expires_ms)
        });
    }
    false
}

/// A signed value and the node that signed it, if the signature holds and (when known) the
/// signer is `publisher`.
fn signed_by<T: Canonical>(bytes: &[u8], publisher: Option<&NodeId>) -> Option<(T, NodeId)> {
    let signed = Signed::<T>::from_bytes(bytes).ok()?;
    let signer = signed.signer().node_id();
    if publisher.is_some_and(|p| *p != signer) {
        return None;
    }
    Some((signed.verify().ok()?, signer))
}

#[cfg(test)]
mod tests;
