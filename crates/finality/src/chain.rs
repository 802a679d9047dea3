//! A joiner's check of the finalized history: from the genesis committee, each epoch's
//! certificate must carry more than 2/3 of the power of the committee the previous epoch
//! named, and each value names the next committee by hash. Nothing is taken from the peer
//! that serves the chain: a forged value, a certificate of too little or foreign power, a
//! committee other than the one named, or a gap in the epochs is refused.

use malachite_types::{CommitCertificate, ThresholdParams, Value as _};
use neuroshard_proof::{CodecError, Hash32, Reader, Writer};

use crate::context::{Committee, EpochValue, FinalityContext};
use crate::wire::{MAX_CERT_SIGNATURES, decode_certificate, encode_certificate, verify_commit};

/// Most members a served committee may list.
pub const MAX_COMMITTEE: usize = 1024;

/// One finalized epoch as a joiner receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertifiedEpoch {
    pub value: EpochValue,
    pub certificate: CommitCertificate<FinalityContext>,
    /// The committee `value.next_committee` names.
    pub next_committee: Committee,
}

impl CertifiedEpoch {
    /// As a server sends it: the value, the certificate and the next committee.
    pub fn encode(&self, w: &mut Writer) {
        self.value.encode(w);
        w.bytes(&encode_certificate(&self.certificate));
        self.next_committee.encode(w);
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let value = EpochValue::decode(r)?;
        // A certificate's bytes: its header and at most MAX_CERT_SIGNATURES of 96 bytes.
        let cert = r.bytes(128 + MAX_CERT_SIGNATURES * 96)?;
        Ok(Self {
            value,
            certificate: decode_certificate(cert)?,
            next_committee: Committee::decode(r, MAX_COMMITTEE)?,
        })
    }
}

/// Where a verified chain ends: its last epoch and state, and who finalizes the next epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainHead {
    pub epoch: u64,
    pub state: Hash32,
    pub committee: Committee,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ChainError {
    #[error("epoch {got} follows epoch {after}")]
    Gap { after: u64, got: u64 },
    #[error("epoch {epoch}: the certificate is for epoch {certified}")]
    OtherEpoch { epoch: u64, certified: u64 },
    #[error("epoch {epoch}: the certificate is for another value")]
    OtherValue { epoch: u64 },
    #[error("epoch {epoch}: {reason}")]
    Certificate { epoch: u64, reason: String },
    #[error("epoch {epoch}: the committee served is not the one the value names")]
    OtherCommittee { epoch: u64 },
}

/// Verifies `chain` as following `head` (the genesis: epoch 0, the genesis state and
/// committee; or a head verified before).
pub fn verify_chain(head: &ChainHead, chain: &[CertifiedEpoch]) -> Result<ChainHead, ChainError> {
    let quorum = ThresholdParams::default().quorum;
    let mut epoch = head.epoch;
    let mut state = head.state;
    let mut committee = head.committee.clone();
    for c in chain {
        let e = c.value.epoch;
        if epoch.checked_add(1) != Some(e) {
            return Err(ChainError::Gap {
                after: epoch,
                got: e,
            });
        }
        if c.certificate.height.0 != e {
            return Err(ChainError::OtherEpoch {
                epoch: e,
                certified: c.certificate.height.0,
            });
        }
        if c.certificate.value_id != c.value.id() {
            return Err(ChainError::OtherValue { epoch: e });
        }
        verify_commit(&c.certificate, &committee, quorum).map_err(|err| {
            ChainError::Certificate {
                epoch: e,
                reason: err.to_string(),
            }
        })?;
        if c.next_committee.hash() != c.value.next_committee
            || c.next_committee.validators().is_empty()
        {
            return Err(ChainError::OtherCommittee { epoch: e });
        }
        epoch = e;
        state = c.value.state;
        committee = c.next_committee.clone();
    }
    Ok(ChainHead {
        epoch,
        state,
        committee,
    })
}
