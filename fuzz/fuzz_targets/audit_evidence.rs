//! Audit messages from peers. First byte 0: a fraud proof, taken through every check before
//! the replay (the replayer here holds no weights); 1: a job commitment; 2: a job's inputs as
//! evidence carries them (an offer's names its outer state); 3: a countersignature envelope. Whatever decodes must re-encode to its bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_audit::{
    AuditContext, AuditRate, ChallengeSeed, Countersign, DeterminismClass, EvidenceLimits,
    FraudProof, JobCommitment, JobInputs, Replayed, Replayer, Tolerance, check,
};
use neuroshard_fuzz::{ALICE, BOB, NEIGHBOUR};
use neuroshard_proof::{Canonical, Reader, Signed, Writer};

#[derive(Debug, thiserror::Error)]
#[error("this replayer holds no weights")]
struct NoWeights;

struct Empty(DeterminismClass);

impl Replayer for Empty {
    type Error = NoWeights;
    fn class(&self) -> DeterminismClass {
        self.0
    }
    fn replay(&self, _: &JobCommitment, _: &JobInputs) -> Result<Replayed, NoWeights> {
        Err(NoWeights)
    }
}

fn round_trips<T: Canonical>(bytes: &[u8]) -> Option<T> {
    let value = T::from_canonical_bytes(bytes).ok()?;
    assert_eq!(value.to_canonical_bytes(), bytes);
    Some(value)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode {
        0 => {
            let Some(proof) = round_trips::<FraudProof>(rest) else {
                return;
            };
            let validators = [ALICE.node_id(), NEIGHBOUR.node_id(), BOB.node_id()];
            let ctx = AuditContext {
                network: [0; 32],
                stage: 1,
                round: 1,
                seed: ChallengeSeed([0; 32]),
                validators: &validators,
                rate: AuditRate {
                    per_million: 1_000_000,
                },
                limits: EvidenceLimits {
                    max_rows: 64,
                    dim: 8,
                },
                tolerance: Tolerance::default(),
            };
            if let Ok(class) = proof.job.verify().map(|c| c.class) {
                let _ = check(&ctx, &proof, &Empty(class));
            }
        }
        1 => {
            round_trips::<JobCommitment>(rest);
        }
        2 => {
            let mut r = Reader::new(rest);
            if let Ok(inputs) = JobInputs::decode(&mut r)
                && r.finish().is_ok()
            {
                let mut w = Writer::new();
                inputs.encode(&mut w);
                assert_eq!(w.into_bytes(), rest);
            }
        }
        _ => {
            if let Ok(s) = Signed::<Countersign>::from_bytes(rest) {
                assert_eq!(s.to_bytes(), rest);
                let _ = s.verify();
            }
        }
    }
});
