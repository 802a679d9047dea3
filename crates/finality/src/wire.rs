//! Consensus messages on the wire, and the checks of their signatures and certificates.
//!
//! A vote or proposal is signed over its canonical bytes (its own domain) with the
//! validator's node key; a certificate is a list of (address, signature) from which each
//! vote is rebuilt and checked. Every list is bounded before it is read.

// The certificate checks answer Malachite's `CertificateValidity`, whose error type is its own.
#![allow(clippy::result_large_err)]

use malachite_types::{
    CertificateError, CommitCertificate, CommitSignature, NilOrVal, PolkaCertificate,
    PolkaSignature, Round, RoundCertificate, RoundCertificateType, RoundSignature, SignedMessage,
    SignedProposal, SignedVote, ThresholdParam, ValidatorSet as _, VoteType,
};
use neuroshard_proof::{Canonical, CodecError, NodeId, PublicKey, Reader, Signature, Writer};

use crate::context::{
    Address, Committee, Epoch, FinalityContext, Proposal, Sig, ValueId, Vote, get_nil_or,
    get_round, get_vote_type, put_nil_or, put_round, put_vote_type,
};

/// Most signatures one certificate carries (a committee is far smaller).
pub const MAX_CERT_SIGNATURES: usize = 1024;

/// What validators send each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsensusWire {
    Vote(SignedVote<FinalityContext>),
    Proposal(SignedProposal<FinalityContext>),
    Polka(PolkaCertificate<FinalityContext>),
    Round(RoundCertificate<FinalityContext>),
}

impl ConsensusWire {
    pub fn epoch(&self) -> u64 {
        match self {
            Self::Vote(v) => v.message.epoch.0,
            Self::Proposal(p) => p.message.epoch.0,
            Self::Polka(c) => c.height.0,
            Self::Round(c) => c.height.0,
        }
    }

    /// Whether a member of `committee` signed it (a vote or a proposal; certificates: no).
    pub fn signed_by_member(&self, committee: &Committee) -> bool {
        let key = |a: &Address| committee.get(&a.0).map(|v| v.public_key);
        match self {
            Self::Vote(v) => key(&v.message.validator)
                .is_some_and(|k| verify_signed(&v.message, &v.signature, &k)),
            Self::Proposal(p) => key(&p.message.proposer)
                .is_some_and(|k| verify_signed(&p.message, &p.signature, &k)),
            Self::Polka(_) | Self::Round(_) => false,
        }
    }

    /// Who signed it: a vote's validator, a proposal's proposer (certificates: none).
    pub fn signer(&self) -> Option<NodeId> {
        match self {
            Self::Vote(v) => Some(v.message.validator.0),
            Self::Proposal(p) => Some(p.message.proposer.0),
            Self::Polka(_) | Self::Round(_) => None,
        }
    }
}

fn put_sig(w: &mut Writer, s: &Sig) {
    w.fixed(&s.0);
}

fn get_sig(r: &mut Reader<'_>) -> Result<Sig, CodecError> {
    Ok(Sig(r.array()?))
}

fn put_addr(w: &mut Writer, a: &Address) {
    w.fixed(&a.0.0);
}

fn get_addr(r: &mut Reader<'_>) -> Result<Address, CodecError> {
    Ok(Address(NodeId(r.array()?)))
}

impl Canonical for ConsensusWire {
    const DOMAIN: &'static str = "neuroshard/finality/wire/v1";

    fn encode_body(&self, w: &mut Writer) {
        match self {
            Self::Vote(v) => {
                w.u8(0);
                w.bytes(&v.message.to_canonical_bytes());
                put_sig(w, &v.signature);
            }
            Self::Proposal(p) => {
                w.u8(1);
                w.bytes(&p.message.to_canonical_bytes());
                put_sig(w, &p.signature);
            }
            Self::Polka(c) => {
                w.u8(2);
                w.u64(c.height.0);
                put_round(w, c.round);
                w.fixed(&c.value_id.0);
                w.len(c.polka_signatures.len());
                for s in &c.polka_signatures {
                    put_addr(w, &s.address);
                    put_sig(w, &s.signature);
                }
            }
            Self::Round(c) => {
                w.u8(3);
                w.u64(c.height.0);
                put_round(w, c.round);
                w.u8(match c.cert_type {
                    RoundCertificateType::Skip => 0,
                    RoundCertificateType::Precommit => 1,
                });
                w.len(c.round_signatures.len());
                for s in &c.round_signatures {
                    put_vote_type(w, s.vote_type);
                    put_nil_or(w, &s.value_id);
                    put_addr(w, &s.address);
                    put_sig(w, &s.signature);
                }
            }
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(match r.u8()? {
            0 => {
                let vote = Vote::from_canonical_bytes(r.bytes(256)?)?;
                Self::Vote(SignedMessage::new(vote, get_sig(r)?))
            }
            1 => {
                let p = Proposal::from_canonical_bytes(r.bytes(512)?)?;
                Self::Proposal(SignedMessage::new(p, get_sig(r)?))
            }
            2 => {
                let height = Epoch(r.u64()?);
                let round = get_round(r)?;
                let value_id = ValueId(r.array()?);
                let n = r.len(MAX_CERT_SIGNATURES)?;
                let mut polka_signatures = Vec::with_capacity(n);
                for _ in 0..n {
                    polka_signatures.push(PolkaSignature::new(get_addr(r)?, get_sig(r)?));
                }
                Self::Polka(PolkaCertificate {
                    height,
                    round,
                    value_id,
                    polka_signatures,
                })
            }
            3 => {
                let height = Epoch(r.u64()?);
                let round = get_round(r)?;
                let cert_type = match r.u8()? {
                    0 => RoundCertificateType::Skip,
                    1 => RoundCertificateType::Precommit,
                    t => {
                        return Err(CodecError::Invalid {
                            field: "round certificate type",
                            reason: format!("unknown type {t}"),
                        });
                    }
                };
                let n = r.len(MAX_CERT_SIGNATURES)?;
                let mut round_signatures = Vec::with_capacity(n);
                for _ in 0..n {
                    let vote_type = get_vote_type(r)?;
                    let value_id = get_nil_or(r)?;
                    let address = get_addr(r)?;
                    let signature = get_sig(r)?;
                    round_signatures
                        .push(RoundSignature::new(vote_type, value_id, address, signature));
                }
                Self::Round(RoundCertificate {
                    height,
                    round,
                    cert_type,
                    round_signatures,
                })
            }
            t => {
                return Err(CodecError::Invalid {
                    field: "consensus message",
                    reason: format!("unknown kind {t}"),
                });
            }
        })
    }
}

/// A commit certificate as a finalized epoch carries it (for joiners and for the record).
pub fn encode_certificate(c: &CommitCertificate<FinalityContext>) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(b"neuroshard/finality/certificate/v1");
    w.u64(c.height.0);
    put_round(&mut w, c.round);
    w.fixed(&c.value_id.0);
    w.len(c.commit_signatures.len());
    for s in &c.commit_signatures {
        put_addr(&mut w, &s.address);
        put_sig(&mut w, &s.signature);
    }
    w.into_bytes()
}

pub fn decode_certificate(bytes: &[u8]) -> Result<CommitCertificate<FinalityContext>, CodecError> {
    let mut r = Reader::new(bytes);
    let domain = r.bytes(64)?;
    if domain != b"neuroshard/finality/certificate/v1" {
        return Err(CodecError::Domain {
            expected: "neuroshard/finality/certificate/v1",
        });
    }
    let height = Epoch(r.u64()?);
    let round = get_round(&mut r)?;
    let value_id = ValueId(r.array()?);
    let n = r.len(MAX_CERT_SIGNATURES)?;
    let mut commit_signatures = Vec::with_capacity(n);
    for _ in 0..n {
        commit_signatures.push(CommitSignature::new(get_addr(&mut r)?, get_sig(&mut r)?));
    }
    r.finish()?;
    Ok(CommitCertificate {
        height,
        round,
        value_id,
        commit_signatures,
    })
}

/// Whether `sig` by `key` signs `msg`'s canonical bytes.
pub fn verify_signed<T: Canonical>(msg: &T, sig: &Sig, key: &PublicKey) -> bool {
    key.verify(&msg.to_canonical_bytes(), &Signature(sig.0))
        .is_ok()
}

/// Checks each vote's signature against the committee and sums the power of distinct
/// signers; the sum must meet `threshold`.
fn verify_votes(
    votes: impl Iterator<Item = SignedVote<FinalityContext>>,
    committee: &Committee,
    threshold: ThresholdParam,
) -> Result<(), CertificateError<FinalityContext>> {
    let mut seen: Vec<Address> = Vec::new();
    let mut signed = 0u64;
    for vote in votes {
        let address = vote.message.validator;
        let Some(v) = committee.get_by_address(&address) else {
            return Err(CertificateError::UnknownValidator(address));
        };
        if seen.contains(&address) {
            return Err(CertificateError::DuplicateVote(address));
        }
        seen.push(address);
        if !verify_signed(&vote.message, &vote.signature, &v.public_key) {
            return Err(CertificateError::InvalidCommitSignature(
                CommitSignature::new(address, vote.signature),
            ));
        }
        signed = signed
            .checked_add(v.power)
            .ok_or(CertificateError::VotingPowerOverflow {
                signed,
                added: v.power,
            })?;
    }
    let total = committee.total_power();
    if !threshold.is_met(signed, total) {
        return Err(CertificateError::NotEnoughVotingPower {
            signed,
            total,
            expected: threshold.min_expected(total),
        });
    }
    Ok(())
}

/// More than 2/3 of the committee's power precommitted this value in this round.
pub fn verify_commit(
    c: &CommitCertificate<FinalityContext>,
    committee: &Committee,
    quorum: ThresholdParam,
) -> Result<(), CertificateError<FinalityContext>> {
    let ctx = FinalityContext;
    let votes = c.commit_signatures.iter().map(|s| {
        let vote = malachite_types::Context::new_precommit(
            &ctx,
            c.height,
            c.round,
            NilOrVal::Val(c.value_id),
            s.address,
        );
        SignedMessage::new(vote, s.signature)
    });
    verify_votes(votes, committee, quorum)
}

/// More than 2/3 of the power prevoted this value in this round.
pub fn verify_polka(
    c: &PolkaCertificate<FinalityContext>,
    committee: &Committee,
    quorum: ThresholdParam,
) -> Result<(), CertificateError<FinalityContext>> {
    verify_votes(c.votes(&FinalityContext), committee, quorum)
}

/// A precommit certificate needs more than 2/3 of the power (any values); a skip certificate
/// more than 1/3 (at least one honest member is in that round).
pub fn verify_round(
    c: &RoundCertificate<FinalityContext>,
    committee: &Committee,
    quorum: ThresholdParam,
    honest: ThresholdParam,
) -> Result<(), CertificateError<FinalityContext>> {
    let threshold = match c.cert_type {
        RoundCertificateType::Precommit => {
            if let Some(s) = c
                .round_signatures
                .iter()
                .find(|s| s.vote_type != VoteType::Precommit)
            {
                return Err(CertificateError::InvalidVoteType(s.address));
            }
            quorum
        }
        RoundCertificateType::Skip => honest,
    };
    if c.round == Round::Nil {
        return Err(CertificateError::NotEnoughVotingPower {
            signed: 0,
            total: committee.total_power(),
            expected: 1,
        });
    }
    verify_votes(c.votes(&FinalityContext), committee, threshold)
}

/// Why double-sign evidence does not convict.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EvidenceError {
    #[error("the two messages are not of one kind, epoch, round and step")]
    NotComparable,
    #[error("the two messages are for the same value")]
    SameValue,
    #[error("the two messages name different validators")]
    TwoSigners,
    #[error("{0} is not in the committee")]
    NotAMember(NodeId),
    #[error("a signature does not verify")]
    BadSignature,
}

/// Checks double-sign evidence against the committee of its epoch: two messages signed by
/// one member for one (epoch, round, step) with different values. Returns the offender.
pub fn verify_equivocation(
    first: &ConsensusWire,
    second: &ConsensusWire,
    committee: &Committee,
) -> Result<NodeId, EvidenceError> {
    let (who, ok) = match (first, second) {
        (ConsensusWire::Vote(a), ConsensusWire::Vote(b)) => {
            let (x, y) = (&a.message, &b.message);
            if (x.kind, x.epoch, x.round) != (y.kind, y.epoch, y.round) {
                return Err(EvidenceError::NotComparable);
            }
            if x.value == y.value {
                return Err(EvidenceError::SameValue);
            }
            if x.validator != y.validator {
                return Err(EvidenceError::TwoSigners);
            }
            let v = committee
                .get(&x.validator.0)
                .ok_or(EvidenceError::NotAMember(x.validator.0))?;
            let ok = verify_signed(x, &a.signature, &v.public_key)
                && verify_signed(y, &b.signature, &v.public_key);
            (x.validator.0, ok)
        }
        (ConsensusWire::Proposal(a), ConsensusWire::Proposal(b)) => {
            let (x, y) = (&a.message, &b.message);
            if (x.epoch, x.round) != (y.epoch, y.round) {
                return Err(EvidenceError::NotComparable);
            }
            if x.value == y.value && x.pol_round == y.pol_round {
                return Err(EvidenceError::SameValue);
            }
            if x.proposer != y.proposer {
                return Err(EvidenceError::TwoSigners);
            }
            let v = committee
                .get(&x.proposer.0)
                .ok_or(EvidenceError::NotAMember(x.proposer.0))?;
            let ok = verify_signed(x, &a.signature, &v.public_key)
                && verify_signed(y, &b.signature, &v.public_key);
            (x.proposer.0, ok)
        }
        _ => return Err(EvidenceError::NotComparable),
    };
    if !ok {
        return Err(EvidenceError::BadSignature);
    }
    Ok(who)
}
