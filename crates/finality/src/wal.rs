//! The write-ahead log: what Malachite records before it acts, so that a validator that
//! restarts mid-epoch re-derives the votes and proposal it already signed and sends those
//! again (reused from the log, not signed afresh) instead of signing different ones, which
//! would be a double sign.
//!
//! Malachite records five kinds of input: votes, proposals and polka certificates received
//! (and our own), proposed values with their verdict, and timeouts that fired. Each entry is
//! encoded here; the caller keeps them durably (before it sends what the same step
//! produced) and hands them back to [`crate::Finality::restore`].

use std::time::Duration;

use malachite::{Input, ProposedValue};
use malachite_types::{Timeout, TimeoutKind, Validity, ValueOrigin};
use neuroshard_proof::{Canonical, CodecError, NodeId, Reader, Writer};

use crate::context::{Address, Epoch, EpochValue, FinalityContext, get_round, put_round};
use crate::wire::ConsensusWire;

const DOMAIN: &[u8] = b"neuroshard/finality/wal/v1";
/// Largest entry read back (a polka certificate of a full committee, with room).
const MAX_ENTRY: usize = 256 * 1024;

/// One recorded input, for the caller to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalEntry {
    pub epoch: u64,
    pub bytes: Vec<u8>,
}

fn timeout_kind(w: &mut Writer, k: TimeoutKind) {
    match k {
        TimeoutKind::Propose => w.u8(0),
        TimeoutKind::Prevote => w.u8(1),
        TimeoutKind::Precommit => w.u8(2),
        TimeoutKind::Rebroadcast => w.u8(3),
        TimeoutKind::FinalizeHeight(d) => {
            w.u8(4);
            w.u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        }
    }
}

/// The bytes of a recorded input (None for inputs Malachite never records).
pub fn encode_entry(input: &Input<FinalityContext>) -> Option<Vec<u8>> {
    let mut w = Writer::new();
    w.bytes(DOMAIN);
    match input {
        Input::Vote(v) => {
            w.u8(0);
            w.bytes(&ConsensusWire::Vote(v.clone()).to_canonical_bytes());
        }
        Input::Proposal(p) => {
            w.u8(0);
            w.bytes(&ConsensusWire::Proposal(p.clone()).to_canonical_bytes());
        }
        Input::PolkaCertificate(c) => {
            w.u8(0);
            w.bytes(&ConsensusWire::Polka(c.clone()).to_canonical_bytes());
        }
        Input::ProposedValue(p, origin) => {
            w.u8(1);
            w.u64(p.height.0);
            put_round(&mut w, p.round);
            put_round(&mut w, p.valid_round);
            w.fixed(&p.proposer.0.0);
            p.value.encode(&mut w);
            w.u8(u8::from(p.validity.is_valid()));
            w.u8(u8::from(origin.is_sync()));
        }
        Input::TimeoutElapsed(t) => {
            w.u8(2);
            put_round(&mut w, t.round);
            timeout_kind(&mut w, t.kind);
        }
        _ => return None,
    }
    Some(w.into_bytes())
}

/// A recorded input read back.
pub fn decode_entry(bytes: &[u8]) -> Result<Input<FinalityContext>, CodecError> {
    let mut r = Reader::new(bytes);
    if r.bytes(DOMAIN.len())? != DOMAIN {
        return Err(CodecError::Domain {
            expected: "neuroshard/finality/wal/v1",
        });
    }
    let input = match r.u8()? {
        0 => match ConsensusWire::from_canonical_bytes(r.bytes(MAX_ENTRY)?)? {
            ConsensusWire::Vote(v) => Input::Vote(v),
            ConsensusWire::Proposal(p) => Input::Proposal(p),
            ConsensusWire::Polka(c) => Input::PolkaCertificate(c),
            ConsensusWire::Round(c) => Input::RoundCertificate(c),
        },
        1 => {
            let height = Epoch(r.u64()?);
            let round = get_round(&mut r)?;
            let valid_round = get_round(&mut r)?;
            let proposer = Address(NodeId(r.array()?));
            let value = EpochValue::decode(&mut r)?;
            let validity = Validity::from_bool(r.u8()? == 1);
            let origin = if r.u8()? == 1 {
                ValueOrigin::Sync
            } else {
                ValueOrigin::Consensus
            };
            Input::ProposedValue(
                ProposedValue {
                    height,
                    round,
                    valid_round,
                    proposer,
                    value,
                    validity,
                },
                origin,
            )
        }
        2 => {
            let round = get_round(&mut r)?;
            let kind = match r.u8()? {
                0 => TimeoutKind::Propose,
                1 => TimeoutKind::Prevote,
                2 => TimeoutKind::Precommit,
                3 => TimeoutKind::Rebroadcast,
                4 => TimeoutKind::FinalizeHeight(Duration::from_millis(r.u64()?)),
                k => {
                    return Err(CodecError::Invalid {
                        field: "timeout kind",
                        reason: format!("unknown kind {k}"),
                    });
                }
            };
            Input::TimeoutElapsed(Timeout::new(round, kind))
        }
        t => {
            return Err(CodecError::Invalid {
                field: "log entry",
                reason: format!("unknown kind {t}"),
            });
        }
    };
    r.finish()?;
    Ok(input)
}

#[cfg(test)]
mod tests {
    use super::*;
    use malachite_types::{NilOrVal, Round, SignedMessage, VoteType};

    use crate::context::{Sig, ValueId, Vote};

    fn value() -> EpochValue {
        EpochValue {
            epoch: 3,
            contents: [1; 32],
            state: [2; 32],
            next_committee: [3; 32],
        }
    }

    #[test]
    fn every_recorded_kind_reads_back_as_written_and_garbage_does_not() {
        let vote = Vote {
            kind: VoteType::Precommit,
            epoch: Epoch(3),
            round: Round::new(2),
            value: NilOrVal::Val(ValueId([9; 32])),
            validator: Address(NodeId([4; 32])),
            extension: None,
        };
        let inputs: Vec<Input<FinalityContext>> = vec![
            Input::Vote(SignedMessage::new(vote, Sig([7; 64]))),
            Input::ProposedValue(
                ProposedValue {
                    height: Epoch(3),
                    round: Round::new(1),
                    valid_round: Round::Nil,
                    proposer: Address(NodeId([5; 32])),
                    value: value(),
                    validity: Validity::Invalid,
                },
                ValueOrigin::Consensus,
            ),
            Input::TimeoutElapsed(Timeout::new(Round::new(4), TimeoutKind::Prevote)),
            Input::TimeoutElapsed(Timeout::finalize_height(
                Round::new(0),
                Duration::from_millis(1500),
            )),
        ];
        for input in inputs {
            let bytes = encode_entry(&input).expect("recorded kind");
            assert_eq!(decode_entry(&bytes).unwrap(), input);
            assert!(decode_entry(&bytes[..bytes.len() - 1]).is_err());
            let mut other = bytes.clone();
            other.push(0);
            assert!(decode_entry(&other).is_err(), "trailing bytes are refused");
        }
        assert!(decode_entry(b"not a log entry").is_err());
    }
}
