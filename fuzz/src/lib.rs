//! Fixtures shared by the fuzz targets and the seed generator: fixed identities, a sample of
//! each message kind, and a ledger state in which the fuzzed account has funds.

use std::sync::LazyLock;

#[cfg(feature = "node")]
pub mod node;

/// What the transport targets serve and fetch (feature `net`).
#[cfg(feature = "net")]
pub mod net {
    /// The blob the fetch target asks for: one chunk, so a seed holds a whole fetch.
    pub const BLOB: &[u8] = b"a pseudo-gradient blob, small enough that one chunk carries it";
    /// The fetch cap: a lying total up to three chunks is allocated, a larger one refused.
    pub const BLOB_MAX: usize = 3 * neuroshard_net::CHUNK_SIZE;
}

use neuroshard_data::{
    BuildParams, Dtype, HexHash, MANIFEST_FORMAT, Manifest, ManifestError, ShardEntry, ShardError,
    ShardView, Split, SplitCounts, Stats, TOKENIZER_FILE, TokenizerInfo, encode_shard, merkle_root,
    shard_file_name,
};
use neuroshard_ledger::{AccountOp, Action, LedgerState};
use neuroshard_proof::fixtures::{test_identity, training_proof, uptime_proof};
use neuroshard_proof::{Canonical, Identity, Proof, ProofVerifier, Signed};

/// The clock every target verifies at (the sample proofs' timestamp).
pub const T0: u64 = 1_800_000_000_000;

/// Prover / account owner, receipt signer, and a second account.
pub static ALICE: LazyLock<Identity> = LazyLock::new(|| test_identity(1));
pub static NEIGHBOUR: LazyLock<Identity> = LazyLock::new(|| test_identity(2));
pub static BOB: LazyLock<Identity> = LazyLock::new(|| test_identity(3));

/// A verifier that knows the receipt signer.
pub fn verifier() -> ProofVerifier {
    let mut v = ProofVerifier::new();
    v.add_known_node(NEIGHBOUR.public_key());
    v
}

pub fn sample_proofs() -> Vec<Proof> {
    vec![
        training_proof(&ALICE, &NEIGHBOUR, 7, T0),
        uptime_proof(&ALICE, 8, T0),
    ]
}

pub fn sample_ops() -> Vec<AccountOp> {
    let actions = [
        Action::Transfer {
            to: BOB.node_id(),
            amount: 1_000,
        },
        Action::Stake {
            amount: 500,
            unlock_at_ms: T0 + 2 * 86_400_000,
        },
        Action::Unstake { amount: 100 },
        Action::Burn { amount: 7 },
        Action::Register { stage: 1 },
        Action::Announce {
            memory_bytes: 16 << 30,
            flops_per_s: 1_000_000_000_000,
        },
    ];
    actions
        .into_iter()
        .map(|action| AccountOp {
            network: neuroshard_proof::fixtures::TEST_NETWORK,
            account: ALICE.node_id(),
            nonce: 0,
            timestamp_ms: T0,
            action,
        })
        .collect()
}

/// Wraps `payload` in an envelope signed by `by`, so fuzzed payloads pass the signature.
pub fn signed_by<T: Canonical>(by: &Identity, payload: &[u8]) -> Signed<T> {
    Signed::from_parts(payload.to_vec(), by.public_key(), by.sign(payload))
}

/// ALICE with the rewards of a few uptime proofs, so ops can move real funds.
pub static FUNDED: LazyLock<LedgerState> = LazyLock::new(|| {
    let mut state = LedgerState::new();
    let mut v = verifier();
    for nonce in 0..3 {
        let signed = uptime_proof(&ALICE, nonce, T0 + nonce).sign(&ALICE);
        if let Ok(p) = v.verify(&signed, T0) {
            let _ = state.apply_proof(&p);
        }
    }
    state
});

/// A consistent manifest, built by ALICE, over a train and a validation shard of `tokens`.
pub fn manifest_for(tokens: &[u32]) -> Result<Manifest, ShardError> {
    let half = tokens.len() / 2;
    let files = [
        encode_shard(&tokens[..half], Dtype::U16)?,
        encode_shard(&tokens[half..], Dtype::U16)?,
    ];
    let mut shards = Vec::new();
    for (i, (bytes, split)) in files.iter().zip([Split::Train, Split::Val]).enumerate() {
        shards.push(ShardEntry {
            index: i as u64,
            split,
            file: shard_file_name(split, 0),
            tokens: ShardView::parse(bytes)?.len() as u64,
            bytes: bytes.len() as u64,
            blake3: HexHash(*blake3::hash(bytes).as_bytes()),
        });
    }
    let hashes: Vec<_> = shards.iter().map(|e| e.blake3.0).collect();
    let root = merkle_root(&hashes).map_or([0; 32], |r| r);
    Ok(Manifest {
        format: MANIFEST_FORMAT.into(),
        name: "fuzz".into(),
        params: BuildParams {
            inputs: vec!["in".into()],
            vocab: 512,
            shard_tokens: 64,
            val_fraction: 0.5,
            skip_bad: false,
            synthetic: None,
        },
        tokenizer: TokenizerInfo {
            file: TOKENIZER_FILE.into(),
            blake3: HexHash([7; 32]),
            vocab_size: 512,
            pad_id: 0,
            bos_id: 1,
            eos_id: 2,
        },
        dtype: Dtype::U16,
        stats: Stats {
            tokens: SplitCounts {
                train: shards[0].tokens,
                val: shards[1].tokens,
            },
            ..Stats::default()
        },
        entropy_floor: None,
        shards,
        merkle_root: HexHash(root),
        builder: ALICE.public_key(),
    })
}

/// Why a sample manifest could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

/// The signed manifest file over [`manifest_for`].
pub fn sample_manifest(tokens: &[u32]) -> Result<Vec<u8>, SampleError> {
    Ok(manifest_for(tokens)?.sign(&ALICE)?.to_file_bytes()?)
}

/// Seeds of the `audit_evidence` target, each with its mode byte: a fraud proof filed by the
/// job's assigned auditor (against the context the target checks in), a job commitment, a
/// round commitment and a countersignature envelope.
pub fn sample_audit() -> Vec<Vec<u8>> {
    use neuroshard_audit::{
        ChallengeSeed, Countersign, DeterminismClass, FraudProof, IsaLevel, JobCommitment,
        JobInputs, JobKind, MicroBatchRef, NO_HASH, Replayed, StageData, Tensor, UpstreamData,
        auditor_for, offer_micro_batch,
    };
    let hidden = |seed: f32| Tensor {
        batch: 2,
        seq: 2,
        dim: 8,
        data: (0..32).map(|i| (i as f32 * 0.3 + seed).sin()).collect(),
    };
    let inputs = JobInputs {
        input: StageData::Hidden(hidden(0.0)),
        upstream: UpstreamData::Grad(hidden(1.0)),
    };
    let class = DeterminismClass {
        build: [1; 32],
        isa: IsaLevel::X86V3,
        cache_bytes: [32 << 10, 1 << 20, 32 << 20],
        micro_batches: 2,
    };
    let job = JobCommitment {
        network: [0; 32],
        worker: ALICE.node_id(),
        stage: 1,
        round: 1,
        step: 4,
        micro_batch: MicroBatchRef {
            origin: BOB.node_id(),
            step: 4,
            index: 0,
        },
        kind: JobKind::Backward,
        class,
        weights_hash: [2; 32],
        input_hash: inputs.input.hash(),
        upstream_hash: inputs.upstream.hash(),
        output_hash: hidden(2.0).hash(),
        grads_hash: [3; 32],
        epoch: 0,
    };
    let validators = [ALICE.node_id(), NEIGHBOUR.node_id(), BOB.node_id()];
    let assigned = auditor_for(&ChallengeSeed([0; 32]), &job.key(), job.worker, &validators);
    let auditor = if assigned == Some(BOB.node_id()) {
        &*BOB
    } else {
        &*NEIGHBOUR
    };
    let claimed = Replayed {
        output_hash: [4; 32],
        grads_hash: NO_HASH,
        output: None,
    };
    let proof = FraudProof::new(
        auditor,
        job.sign(&ALICE),
        &job,
        inputs,
        &claimed,
        Some(hidden(2.0)),
        T0,
    );
    // An offer: its input is the outer state, by hash and length.
    let offer_inputs = JobInputs {
        input: StageData::Outer {
            hash: [5; 32],
            len: 3 * 4096 + 33,
        },
        upstream: UpstreamData::None,
    };
    let offer = JobCommitment {
        round: 1,
        micro_batch: offer_micro_batch(ALICE.node_id(), 1),
        kind: JobKind::Offer,
        input_hash: [5; 32],
        upstream_hash: NO_HASH,
        output_hash: [7; 32],
        ..job
    };
    let offer_auditor = [&*NEIGHBOUR, &*BOB]
        .into_iter()
        .find(|i| {
            auditor_for(
                &ChallengeSeed([0; 32]),
                &offer.key(),
                ALICE.node_id(),
                &validators,
            ) == Some(i.node_id())
        })
        .unwrap_or(&NEIGHBOUR);
    let offer_proof = FraudProof::new(
        offer_auditor,
        offer.sign(&ALICE),
        &offer,
        offer_inputs.clone(),
        &Replayed {
            output_hash: [8; 32],
            grads_hash: offer.grads_hash,
            output: None,
        },
        None,
        T0,
    );
    let mut encoded_inputs = neuroshard_proof::Writer::new();
    offer_inputs.encode(&mut encoded_inputs);
    let countersign = Signed::sign(
        &NEIGHBOUR,
        &Countersign {
            network: [0; 32],
            job: job.key(),
            worker: job.worker,
            received_hash: job.output_hash,
        },
    );
    // A provenance charge: a first-stage job's tokens with the genesis windows they name.
    let named = JobInputs {
        input: StageData::Genesis(neuroshard_audit::GenesisTokens {
            tokens: neuroshard_audit::TokenIds {
                batch: 2,
                seq: 2,
                ids: vec![1, 2, 3, 4],
            },
            windows: vec![
                neuroshard_audit::WindowRef {
                    shard: 0,
                    window: 5,
                },
                neuroshard_audit::WindowRef {
                    shard: 1,
                    window: 9,
                },
            ],
        }),
        upstream: UpstreamData::None,
    };
    let first = JobCommitment {
        stage: 0,
        kind: JobKind::Forward,
        input_hash: named.input.hash(),
        upstream_hash: named.upstream.hash(),
        grads_hash: NO_HASH,
        ..job
    };
    let provenance = FraudProof::provenance(auditor, first.sign(&ALICE), &first, named, T0);
    let with_mode = |mode: u8, bytes: Vec<u8>| [vec![mode], bytes].concat();
    vec![
        with_mode(0, proof.to_canonical_bytes()),
        with_mode(0, provenance.to_canonical_bytes()),
        with_mode(1, job.to_canonical_bytes()),
        with_mode(0, offer_proof.to_canonical_bytes()),
        with_mode(2, encoded_inputs.into_bytes()),
        with_mode(3, countersign.to_bytes()),
    ]
}

/// The finality target's committee: the three fixed identities and a fourth, equal power.
pub fn finality_committee() -> neuroshard_finality::Committee {
    neuroshard_finality::Committee::new(
        [&*ALICE, &*NEIGHBOUR, &*BOB, &test_identity(4)]
            .iter()
            .map(|id| neuroshard_finality::Validator::new(id.public_key(), 10))
            .collect(),
    )
}

/// The value every member of the finality target computes for `epoch`.
pub fn finality_value(epoch: u64) -> neuroshard_finality::EpochValue {
    neuroshard_finality::EpochValue {
        epoch,
        contents: [epoch as u8; 32],
        state: [0x55; 32],
        next_committee: finality_committee().hash(),
    }
}

/// Seeds of the `finality_wire` target (mode byte first): consensus messages of epoch 1 as a
/// run of the committee produces them (mode 0), and a certified epoch (mode 1).
pub fn sample_finality() -> Vec<Vec<u8>> {
    use neuroshard_finality::{Finality, FinalityEvent, Timeouts};
    let now = std::time::Instant::now();
    let members = [
        ALICE.clone(),
        NEIGHBOUR.clone(),
        BOB.clone(),
        test_identity(4),
    ];
    let mut nodes: Vec<Finality> = members
        .iter()
        .map(|id| Finality::new(id.clone(), Timeouts::default()))
        .collect();
    let mut seeds = Vec::new();
    let mut inbox: Vec<(usize, Vec<u8>)> = Vec::new();
    for (i, n) in nodes.iter_mut().enumerate() {
        if n.start_epoch(1, finality_committee(), now).is_ok() {
            n.set_value(finality_value(1), now);
        }
        while let Some(m) = n.poll_transmit() {
            inbox.push((i, m));
        }
    }
    let mut certified = None;
    let mut steps = 0;
    // Alice's write-ahead log, as mode 2 seeds (length-prefixed entries).
    let mut log = neuroshard_proof::Writer::new();
    while let Some((from, msg)) = inbox.pop() {
        steps += 1;
        if steps > 10_000 {
            break;
        }
        if seeds.len() < 12 {
            let mut s = vec![0u8];
            s.extend_from_slice(&msg);
            seeds.push(s);
        }
        for (i, n) in nodes.iter_mut().enumerate() {
            if i == from {
                continue;
            }
            n.handle_message(members[from].node_id(), &msg, now);
            while let Some(e) = n.poll_wal() {
                if i == 0 && e.epoch == 1 {
                    log.bytes(&e.bytes);
                }
            }
            while let Some(e) = n.poll_event() {
                if let FinalityEvent::Finalized(f) = e {
                    certified.get_or_insert(f);
                }
            }
            while let Some(m) = n.poll_transmit() {
                inbox.push((i, m));
            }
        }
    }
    let mut s = vec![2u8];
    s.extend_from_slice(&log.into_bytes());
    seeds.push(s);
    if let Some(f) = certified {
        let mut w = neuroshard_proof::Writer::new();
        neuroshard_finality::CertifiedEpoch {
            value: f.value,
            certificate: f.certificate,
            next_committee: finality_committee(),
        }
        .encode(&mut w);
        let mut s = vec![1u8];
        s.extend_from_slice(&w.into_bytes());
        seeds.push(s);
    }
    seeds
}
