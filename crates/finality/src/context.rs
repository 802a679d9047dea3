//! The types Malachite's consensus core is generic over, for NeuroShard: validators are
//! node ids with their secp256k1 keys and a voting power from stake, a height is a ledger
//! epoch, and the value agreed is the epoch's summary (its contents and the state they lead
//! to). Votes and proposals are signed in canonical bytes with the node's own key.

use std::fmt;

use malachite_types::{
    Context, Extension, NilOrVal, Round, SignedExtension, SigningScheme, VoteType, VotingPower,
};
use neuroshard_proof::{Canonical, CodecError, Hash32, NodeId, PublicKey, Reader, Writer};

/// A validator's address: its node id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Address(pub NodeId);

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Address({})", self.0)
    }
}

impl malachite_types::Address for Address {}

/// A ledger epoch: the height consensus decides one value at.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Epoch(pub u64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl malachite_types::Height for Epoch {
    const ZERO: Self = Epoch(0);
    const INITIAL: Self = Epoch(1);

    fn increment_by(&self, n: u64) -> Self {
        Epoch(self.0.saturating_add(n))
    }

    fn decrement_by(&self, n: u64) -> Option<Self> {
        self.0.checked_sub(n).map(Epoch)
    }

    fn as_u64(&self) -> u64 {
        self.0
    }
}

/// What an epoch finalizes: the hash of its ordered contents (proofs, ledger operations,
/// registrations), the ledger's state hash after applying them on top of the previous
/// epoch, and the hash of the committee that finalizes the next epoch (derived from that
/// state's stakes), so that a joiner can follow the committee from certificates alone. All
/// three are checked by each validator before it votes for a proposal.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct EpochValue {
    pub epoch: u64,
    pub contents: Hash32,
    pub state: Hash32,
    pub next_committee: Hash32,
}

impl EpochValue {
    pub fn encode(&self, w: &mut Writer) {
        w.u64(self.epoch);
        w.fixed(&self.contents);
        w.fixed(&self.state);
        w.fixed(&self.next_committee);
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            epoch: r.u64()?,
            contents: r.array()?,
            state: r.array()?,
            next_committee: r.array()?,
        })
    }
}

/// A value's id: BLAKE3 of its canonical bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ValueId(pub Hash32);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex_prefix(&self.0))
    }
}

fn hex_prefix(h: &Hash32) -> String {
    h[..8].iter().map(|b| format!("{b:02x}")).collect()
}

impl EpochValue {
    /// The value's id, the hash validators vote on: once certified, a beacon no one chose
    /// alone and every node holds.
    pub fn id_hash(&self) -> Hash32 {
        let mut w = Writer::new();
        w.bytes(b"neuroshard/finality/value");
        self.encode(&mut w);
        *blake3::hash(&w.into_bytes()).as_bytes()
    }
}

impl malachite_types::Value for EpochValue {
    type Id = ValueId;

    fn id(&self) -> ValueId {
        ValueId(self.id_hash())
    }
}

/// A proposal: the proposer's value for (epoch, round), with the round its lock came from.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Proposal {
    pub epoch: Epoch,
    pub round: Round,
    pub value: EpochValue,
    pub pol_round: Round,
    pub proposer: Address,
}

/// A prevote or precommit for a value id (or nil).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Vote {
    pub kind: VoteType,
    pub epoch: Epoch,
    pub round: Round,
    pub value: NilOrVal<ValueId>,
    pub validator: Address,
    /// Vote extensions are disabled in this network (`VoteExtensionPolicy::Disabled`): none is
    /// ever signed or sent, so none is encoded.
    pub extension: Option<SignedExtension<FinalityContext>>,
}

/// A committee member: its key, the node id derived from it, and its voting power.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Validator {
    pub address: Address,
    pub public_key: PublicKey,
    pub power: VotingPower,
}

impl Validator {
    pub fn new(public_key: PublicKey, power: VotingPower) -> Self {
        Self {
            address: Address(public_key.node_id()),
            public_key,
            power,
        }
    }
}

/// The committee of an epoch, sorted by address (one entry per address).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Committee {
    validators: Vec<Validator>,
    total: VotingPower,
}

impl Committee {
    /// Members with no power are left out; a key listed twice keeps its first entry. The total
    /// power must stay below `u64::MAX / 3` (Malachite multiplies it by the threshold's
    /// denominator): see [`crate::committee::MAX_TOTAL_POWER`], which the committee rule keeps.
    pub fn new(mut validators: Vec<Validator>) -> Self {
        validators.retain(|v| v.power > 0);
        validators.sort_by_key(|v| v.address);
        validators.dedup_by(|a, b| a.address == b.address);
        let total = validators
            .iter()
            .fold(0u64, |t, v| t.saturating_add(v.power));
        Self { validators, total }
    }

    pub fn validators(&self) -> &[Validator] {
        &self.validators
    }

    pub fn get(&self, node: &NodeId) -> Option<&Validator> {
        self.validators
            .binary_search_by(|v| v.address.0.cmp(node))
            .ok()
            .map(|i| &self.validators[i])
    }

    pub fn total_power(&self) -> VotingPower {
        self.total
    }

    /// BLAKE3 of the members' keys and powers in address order: what an epoch value names.
    pub fn hash(&self) -> Hash32 {
        let mut w = Writer::new();
        w.bytes(b"neuroshard/finality/committee");
        w.len(self.validators.len());
        for v in &self.validators {
            w.fixed(v.public_key.as_bytes());
            w.u64(v.power);
        }
        *blake3::hash(&w.into_bytes()).as_bytes()
    }

    /// The members as they travel to joiners (keys and powers).
    pub fn encode(&self, w: &mut Writer) {
        w.len(self.validators.len());
        for v in &self.validators {
            w.fixed(v.public_key.as_bytes());
            w.u64(v.power);
        }
    }

    /// Decodes at most `max` members; keys must be valid points.
    pub fn decode(r: &mut Reader<'_>, max: usize) -> Result<Self, CodecError> {
        let n = r.len(max)?;
        let mut validators = Vec::with_capacity(n);
        for _ in 0..n {
            let key: [u8; 33] = r.array()?;
            let public_key = PublicKey::from_bytes(&key).map_err(|e| CodecError::Invalid {
                field: "committee key",
                reason: e.to_string(),
            })?;
            validators.push(Validator::new(public_key, r.u64()?));
        }
        Ok(Self::new(validators))
    }
}

impl malachite_types::ValidatorSet<FinalityContext> for Committee {
    fn count(&self) -> usize {
        self.validators.len()
    }

    fn total_voting_power(&self) -> VotingPower {
        self.total
    }

    fn get_by_address(&self, address: &Address) -> Option<&Validator> {
        self.get(&address.0)
    }

    fn get_by_index(&self, index: usize) -> Option<&Validator> {
        self.validators.get(index)
    }
}

impl malachite_types::Validator<FinalityContext> for Validator {
    fn address(&self) -> &Address {
        &self.address
    }

    fn public_key(&self) -> &PublicKey {
        &self.public_key
    }

    fn voting_power(&self) -> VotingPower {
        self.power
    }
}

/// A secp256k1 signature with the total order Malachite's types ask for.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Sig(pub [u8; 64]);

/// secp256k1 ECDSA over SHA-256, as every other NeuroShard signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Secp256k1;

/// Why signature or key bytes do not decode.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KeyDecodeError(String);

impl SigningScheme for Secp256k1 {
    type DecodingError = KeyDecodeError;
    type Signature = Sig;
    type PublicKey = PublicKey;
    type PrivateKey = [u8; 32];

    fn decode_signature(bytes: &[u8]) -> Result<Sig, KeyDecodeError> {
        let arr: [u8; 64] = bytes
            .try_into()
            .map_err(|_| KeyDecodeError(format!("a signature of {} bytes", bytes.len())))?;
        Ok(Sig(arr))
    }

    fn encode_signature(signature: &Sig) -> Vec<u8> {
        signature.0.to_vec()
    }

    fn decode_public_key(bytes: &[u8]) -> Result<PublicKey, KeyDecodeError> {
        PublicKey::from_bytes(bytes).map_err(|e| KeyDecodeError(e.to_string()))
    }

    fn encode_public_key(public_key: &PublicKey) -> Vec<u8> {
        public_key.to_bytes().to_vec()
    }
}

/// Proposals carry the value itself (it is 72 bytes): no proposal parts are streamed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NoParts;

impl malachite_types::ProposalPart<FinalityContext> for NoParts {
    fn is_first(&self) -> bool {
        true
    }

    fn is_last(&self) -> bool {
        true
    }
}

/// No vote extensions (see [`Vote::extension`]).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NoExtension;

impl Extension for NoExtension {
    fn size_bytes(&self) -> usize {
        0
    }
}

/// The network's consensus context.
#[derive(Clone, Debug, Default)]
pub struct FinalityContext;

impl Context for FinalityContext {
    type Address = Address;
    type Height = Epoch;
    type ProposalPart = NoParts;
    type Proposal = Proposal;
    type Validator = Validator;
    type ValidatorSet = Committee;
    type Value = EpochValue;
    type Vote = Vote;
    type Extension = NoExtension;
    type SigningScheme = Secp256k1;
    type Timeouts = malachite_types::LinearTimeouts;

    /// Stake-weighted and deterministic: a point drawn from (epoch, round) over the
    /// committee's cumulative power, so a validator proposes in proportion to its power and
    /// nobody can pick the order.
    fn select_proposer<'a>(
        &self,
        committee: &'a Committee,
        epoch: Epoch,
        round: Round,
    ) -> &'a Validator {
        let mut h = blake3::Hasher::new();
        h.update(b"neuroshard/finality/proposer");
        h.update(&epoch.0.to_le_bytes());
        h.update(&round.as_i64().to_le_bytes());
        let digest = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest.as_bytes()[..8]);
        let draw = u64::from_le_bytes(first) % committee.total.max(1);
        let mut acc = 0u64;
        for v in &committee.validators {
            acc = acc.saturating_add(v.power);
            if draw < acc {
                return v;
            }
        }
        // Malachite never asks with an empty committee (no epoch starts without one); the last
        // member stands in if the powers were saturated.
        committee
            .validators
            .last()
            .expect("a committee has at least one member")
    }

    fn new_proposal(
        &self,
        epoch: Epoch,
        round: Round,
        value: EpochValue,
        pol_round: Round,
        proposer: Address,
    ) -> Proposal {
        Proposal {
            epoch,
            round,
            value,
            pol_round,
            proposer,
        }
    }

    fn new_prevote(
        &self,
        epoch: Epoch,
        round: Round,
        value: NilOrVal<ValueId>,
        validator: Address,
    ) -> Vote {
        Vote::new(VoteType::Prevote, epoch, round, value, validator)
    }

    fn new_precommit(
        &self,
        epoch: Epoch,
        round: Round,
        value: NilOrVal<ValueId>,
        validator: Address,
    ) -> Vote {
        Vote::new(VoteType::Precommit, epoch, round, value, validator)
    }
}

impl Vote {
    fn new(
        kind: VoteType,
        epoch: Epoch,
        round: Round,
        value: NilOrVal<ValueId>,
        validator: Address,
    ) -> Self {
        Self {
            kind,
            epoch,
            round,
            value,
            validator,
            extension: None,
        }
    }
}

impl malachite_types::Proposal<FinalityContext> for Proposal {
    fn height(&self) -> Epoch {
        self.epoch
    }

    fn round(&self) -> Round {
        self.round
    }

    fn value(&self) -> &EpochValue {
        &self.value
    }

    fn take_value(self) -> EpochValue {
        self.value
    }

    fn pol_round(&self) -> Round {
        self.pol_round
    }

    fn validator_address(&self) -> &Address {
        &self.proposer
    }
}

impl malachite_types::Vote<FinalityContext> for Vote {
    fn height(&self) -> Epoch {
        self.epoch
    }

    fn round(&self) -> Round {
        self.round
    }

    fn value(&self) -> &NilOrVal<ValueId> {
        &self.value
    }

    fn take_value(self) -> NilOrVal<ValueId> {
        self.value
    }

    fn vote_type(&self) -> VoteType {
        self.kind
    }

    fn validator_address(&self) -> &Address {
        &self.validator
    }

    fn extension(&self) -> Option<&SignedExtension<FinalityContext>> {
        self.extension.as_ref()
    }

    fn take_extension(&mut self) -> Option<SignedExtension<FinalityContext>> {
        self.extension.take()
    }

    fn extend(self, extension: SignedExtension<FinalityContext>) -> Self {
        Self {
            extension: Some(extension),
            ..self
        }
    }
}

/// Rounds travel as i64 (Malachite's nil round is −1).
pub(crate) fn put_round(w: &mut Writer, round: Round) {
    w.u64(round.as_i64() as u64);
}

pub(crate) fn get_round(r: &mut Reader<'_>) -> Result<Round, CodecError> {
    let raw = r.u64()? as i64;
    match raw {
        -1 => Ok(Round::Nil),
        0..=0xFFFF_FFFF => Ok(Round::new(raw as u32)),
        _ => Err(CodecError::Invalid {
            field: "round",
            reason: format!("{raw} is neither nil nor a u32"),
        }),
    }
}

impl Canonical for Proposal {
    const DOMAIN: &'static str = "neuroshard/finality/proposal/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.epoch.0);
        put_round(w, self.round);
        self.value.encode(w);
        put_round(w, self.pol_round);
        w.fixed(&self.proposer.0.0);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            epoch: Epoch(r.u64()?),
            round: get_round(r)?,
            value: EpochValue::decode(r)?,
            pol_round: get_round(r)?,
            proposer: Address(NodeId(r.array()?)),
        })
    }
}

impl Canonical for Vote {
    const DOMAIN: &'static str = "neuroshard/finality/vote/v1";

    fn encode_body(&self, w: &mut Writer) {
        put_vote_type(w, self.kind);
        w.u64(self.epoch.0);
        put_round(w, self.round);
        put_nil_or(w, &self.value);
        w.fixed(&self.validator.0.0);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            kind: get_vote_type(r)?,
            epoch: Epoch(r.u64()?),
            round: get_round(r)?,
            value: get_nil_or(r)?,
            validator: Address(NodeId(r.array()?)),
            extension: None,
        })
    }
}

pub(crate) fn put_vote_type(w: &mut Writer, t: VoteType) {
    w.u8(match t {
        VoteType::Prevote => 0,
        VoteType::Precommit => 1,
    });
}

pub(crate) fn get_vote_type(r: &mut Reader<'_>) -> Result<VoteType, CodecError> {
    match r.u8()? {
        0 => Ok(VoteType::Prevote),
        1 => Ok(VoteType::Precommit),
        t => Err(CodecError::Invalid {
            field: "vote type",
            reason: format!("unknown type {t}"),
        }),
    }
}

pub(crate) fn put_nil_or(w: &mut Writer, v: &NilOrVal<ValueId>) {
    match v {
        NilOrVal::Nil => w.u8(0),
        NilOrVal::Val(id) => {
            w.u8(1);
            w.fixed(&id.0);
        }
    }
}

pub(crate) fn get_nil_or(r: &mut Reader<'_>) -> Result<NilOrVal<ValueId>, CodecError> {
    match r.u8()? {
        0 => Ok(NilOrVal::Nil),
        1 => Ok(NilOrVal::Val(ValueId(r.array()?))),
        t => Err(CodecError::Invalid {
            field: "value id",
            reason: format!("unknown tag {t}"),
        }),
    }
}
