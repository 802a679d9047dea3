//! The engine's side of verification by recomputation: it keeps what a replay of its jobs
//! needs (the weights of each step it computed at, the inputs of each job) within a byte
//! budget, hands them to an auditor on request, and replays other replicas' jobs.
//!
//! Genesis batches are re-derivable, but upstream activations and gradients are not, and the
//! weights of a step inside a round are this replica's own: so both are kept, on disk when
//! the node has a data directory. The oldest entries go first when the budget is reached; a
//! job whose evidence is gone can no longer be answered for (an auditor treats that as a
//! refusal), so the budget must cover the challenge window (see the README's figures).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, channel, sync_channel};

use neuroshard_audit::{
    AuditContext, AuditRate, ChallengeSeed, DeterminismClass, EvidenceError, EvidenceLimits,
    FraudProof, JobCommitment, JobInputs, JobKind, Replayed, Replayer, Tolerance, Verdict, check,
};
use neuroshard_model::replay::{Wire, WireFn, replay_job};
use neuroshard_model::{Stage, StageSpec};
use neuroshard_proof::{Hash32, NodeId, Reader, Writer};

use super::Engine;
use crate::act_codec::{ActSpec, Expect, Scheme, pack};
use crate::core::{EngineError, Evidence};
use crate::wire::MicroBatchId;

/// Bytes a replica keeps for audits by default. Evidence stays until every job's beacon has
/// been final for an epoch and 40 s (so that the committee's jurors find it): about 90 s of
/// steps, 950 MB for the default network's stage (10.5 MB of weights a step, one step a
/// second, plus the jobs' inputs); twice that leaves room for faster nodes. A worker whose
/// evidence is gone when its jurors ask is slashed as refusing.
pub const DEFAULT_AUDIT_BUDGET: u64 = 2 << 30;

/// Evidence kept by name, oldest first, within a byte budget; in memory without a directory.
pub struct JobStore {
    dir: Option<PathBuf>,
    budget: u64,
    used: u64,
    /// (name, bytes, the optimizer step whose job it serves), oldest first.
    entries: VecDeque<(String, u64, u64)>,
    /// Without a directory: everything. With one: what the writer has not confirmed yet.
    memory: HashMap<String, Arc<Vec<u8>>>,
    writer: Option<DiskWriter>,
}

/// Writes and removals in the order given, on a thread of their own: a weights snapshot is
/// megabytes written once per step, which the engine thread (the training's critical path)
/// need not wait for.
struct DiskWriter {
    thread: Option<std::thread::JoinHandle<()>>,
    ops: SyncSender<DiskOp>,
    /// Writes done: the name and the bytes written (a name may have been rewritten since).
    written: Receiver<(String, Arc<Vec<u8>>)>,
}

enum DiskOp {
    Write(PathBuf, Arc<Vec<u8>>, String),
    Remove(PathBuf),
}

/// Writes queued before the engine waits for the disk.
const QUEUED_WRITES: usize = 16;

impl DiskWriter {
    fn spawn() -> std::io::Result<Self> {
        let (ops, rx) = sync_channel::<DiskOp>(QUEUED_WRITES);
        let (done, written) = channel();
        let thread = std::thread::Builder::new()
            .name("evidence".into())
            .spawn(move || {
                let mut staging = Vec::new();
                for op in rx {
                    match op {
                        // A failed write loses that evidence: the auditor who asks for it
                        // gets a refusal, as for evidence past the budget.
                        DiskOp::Write(path, bytes, name) => {
                            if super::uncached::write(&path, &bytes, &mut staging).is_ok()
                                && done.send((name, bytes)).is_err()
                            {
                                break;
                            }
                        }
                        DiskOp::Remove(path) => {
                            let _ = std::fs::remove_file(path);
                        }
                    }
                }
            })?;
        Ok(Self {
            thread: Some(thread),
            ops,
            written,
        })
    }
}

/// A write the disk confirmed: its bytes leave memory, unless the name was rewritten since.
fn confirmed(memory: &mut HashMap<String, Arc<Vec<u8>>>, name: &str, bytes: &Arc<Vec<u8>>) {
    if memory.get(name).is_some_and(|m| Arc::ptr_eq(m, bytes)) {
        memory.remove(name);
    }
}

impl JobStore {
    /// A store in `dir` (created; its previous contents are dropped: a restarted node's
    /// earlier jobs were committed under state it no longer has) or, without one, in memory.
    pub fn new(dir: Option<PathBuf>, budget: u64) -> std::io::Result<Self> {
        if let Some(d) = &dir {
            let _ = std::fs::remove_dir_all(d);
            std::fs::create_dir_all(d)?;
        }
        let writer = dir.as_ref().map(|_| DiskWriter::spawn()).transpose()?;
        Ok(Self {
            dir,
            budget,
            used: 0,
            entries: VecDeque::new(),
            memory: HashMap::new(),
            writer,
        })
    }

    /// Waits (a second at most per write) until what was put is on disk.
    pub fn flush(&mut self) {
        let Some(w) = &self.writer else { return };
        while !self.memory.is_empty() {
            let Ok((done, bytes)) = w.written.recv_timeout(std::time::Duration::from_secs(1))
            else {
                return;
            };
            confirmed(&mut self.memory, &done, &bytes);
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    fn has(&self, name: &str) -> bool {
        self.entries.iter().any(|(n, ..)| n == name)
    }

    /// Drops what only jobs before optimizer step `step` need: their audits are over.
    pub fn forget_before(&mut self, step: u64) {
        let old: Vec<String> = self
            .entries
            .iter()
            .filter(|(.., s)| *s < step)
            .map(|(n, ..)| n.clone())
            .collect();
        for name in old {
            self.remove(&name);
        }
    }

    pub(super) fn put(
        &mut self,
        name: String,
        bytes: Vec<u8>,
        step: u64,
    ) -> Result<(), EngineError> {
        self.remove(&name);
        let len = bytes.len() as u64;
        if len > self.budget {
            // Larger than the whole budget (0: keep nothing): not kept, nothing evicted.
            return Err(EngineError::NoEvidence(format!(
                "{name}: over the evidence budget"
            )));
        }
        while self.used.saturating_add(len) > self.budget {
            let Some((old, ..)) = self.entries.front().cloned() else {
                break;
            };
            self.remove(&old);
        }
        let bytes = Arc::new(bytes);
        if let (Some(d), Some(w)) = (&self.dir, &self.writer) {
            for (done, bytes) in w.written.try_iter() {
                confirmed(&mut self.memory, &done, &bytes);
            }
            let op = DiskOp::Write(d.join(&name), Arc::clone(&bytes), name.clone());
            if w.ops.send(op).is_err() {
                return Err(EngineError::NoEvidence(format!(
                    "{name}: the writer stopped"
                )));
            }
        }
        self.memory.insert(name.clone(), bytes);
        self.used = self.used.saturating_add(len);
        self.entries.push_back((name, len, step));
        Ok(())
    }

    fn remove(&mut self, name: &str) {
        let Some(i) = self.entries.iter().position(|(n, ..)| n == name) else {
            return;
        };
        if let Some((_, len, _)) = self.entries.remove(i) {
            self.used = self.used.saturating_sub(len);
        }
        self.memory.remove(name);
        if let (Some(d), Some(w)) = (&self.dir, &self.writer) {
            let _ = w.ops.send(DiskOp::Remove(d.join(name)));
        }
    }

    fn get(&self, name: &str) -> Result<Arc<Vec<u8>>, EngineError> {
        if !self.has(name) {
            return Err(EngineError::NoEvidence(name.to_string()));
        }
        if let Some(bytes) = self.memory.get(name) {
            return Ok(Arc::clone(bytes));
        }
        match &self.dir {
            Some(d) => {
                let path = d.join(name);
                std::fs::read(&path)
                    .map(Arc::new)
                    .map_err(|e| EngineError::File {
                        path,
                        source: Arc::new(e),
                    })
            }
            None => self
                .memory
                .get(name)
                .cloned()
                .ok_or_else(|| EngineError::NoEvidence(name.to_string())),
        }
    }
}

impl Drop for JobStore {
    /// A stopped node's evidence is of no use (a restarted one starts a new store): the
    /// directory goes with it, once the writer is done.
    fn drop(&mut self) {
        if let Some(mut w) = self.writer.take() {
            let (dead, _) = sync_channel(1);
            drop(std::mem::replace(&mut w.ops, dead));
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

pub(super) fn outer_name(hash: &Hash32) -> String {
    format!("o-{}", hex::encode(hash))
}

fn weights_name(hash: &Hash32) -> String {
    format!("w-{}", hex::encode(hash))
}

fn job_name(mb: &MicroBatchId, kind: JobKind) -> String {
    let k = match kind {
        JobKind::Forward => "f",
        JobKind::Backward => "b",
        JobKind::Offer => "o",
    };
    format!("j-{}-{}-{}-{k}", hex::encode(mb.origin), mb.step, mb.index)
}

/// Weights as stored and served: the flat `f32` values, little-endian.
pub fn weights_bytes(values: &[Vec<f32>]) -> Vec<u8> {
    let n = values.iter().map(Vec::len).sum::<usize>();
    let mut out = Vec::with_capacity(n.saturating_mul(4));
    for v in values {
        if cfg!(target_endian = "little") {
            // The in-memory bytes are the format: one copy, no per-value work (this runs
            // once per optimizer step on the whole stage).
            out.extend_from_slice(bytemuck::cast_slice(v));
        } else {
            v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
    }
    out
}

pub(super) fn weights_from_bytes(bytes: &[u8], numel: usize) -> Result<Vec<f32>, EngineError> {
    if bytes.len() != numel.saturating_mul(4) {
        return Err(EngineError::AuditWeights(format!(
            "{} bytes for {numel} parameters",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// What the network's activation codec does to a tensor before its receiver computes on it:
/// the replay hashes outputs as they travel.
pub fn codec_wire(spec: ActSpec, dim: usize) -> Wire {
    let f = |scheme: Scheme| -> Option<WireFn> {
        if scheme == Scheme::F32 {
            return None;
        }
        Some(Arc::new(move |a: &neuroshard_model::Activations| {
            let expect = Expect {
                scheme,
                dim,
                max_batch: a.batch,
                max_seq: a.seq,
            };
            pack(a, scheme)
                .and_then(|p| p.unpack(&expect))
                .unwrap_or_else(|_| a.clone())
        }))
    };
    Wire {
        forward: f(spec.forward),
        backward: f(spec.backward),
    }
}

/// Encodes a job's inputs for the store (and for the auditor who asks).
pub fn encode_inputs(inputs: &JobInputs) -> Vec<u8> {
    let mut w = Writer::new();
    inputs.encode(&mut w);
    w.into_bytes()
}

pub fn decode_inputs(bytes: &[u8]) -> Result<JobInputs, EngineError> {
    let mut r = Reader::new(bytes);
    let inputs = JobInputs::decode(&mut r).map_err(|e| EngineError::AuditInputs(e.to_string()))?;
    r.finish()
        .map_err(|e| EngineError::AuditInputs(e.to_string()))?;
    Ok(inputs)
}

impl Engine {
    /// Keeps the evidence of every job from now on in `store`, and replays with the
    /// network's activation codec `wire`.
    pub fn with_job_store(mut self, store: JobStore, wire: Wire) -> Self {
        self.store = Some(store);
        self.wire = wire;
        self
    }

    /// Drops the evidence of jobs before optimizer step `step` (their audits are over).
    pub fn forget_evidence_before(&mut self, step: u64) {
        if let Some(s) = self.store.as_mut() {
            s.forget_before(step);
        }
    }

    /// Bytes of evidence held, and the budget (none without a store).
    pub fn evidence_bytes(&self) -> Option<(u64, u64)> {
        self.store.as_ref().map(|s| (s.used(), s.budget()))
    }

    /// Stores what a replay of this job needs: the weights it ran at (once per step) and its
    /// inputs. A store that fails to write loses that job's evidence, not the job.
    pub(super) fn keep_evidence(
        &mut self,
        mb: &MicroBatchId,
        kind: JobKind,
        version: u64,
        weights: &Hash32,
        inputs: &JobInputs,
    ) -> Result<(), EngineError> {
        let Some(store) = self.store.as_ref() else {
            return Ok(());
        };
        let wname = weights_name(weights);
        let bytes = (!store.has(&wname))
            .then(|| {
                self.weights(version)
                    .map(|s| weights_bytes(s.params().values()))
            })
            .transpose()?;
        let store = self
            .store
            .as_mut()
            .ok_or(EngineError::NoEvidence(wname.clone()))?;
        if let Some(bytes) = bytes {
            store.put(wname, bytes, version)?;
        }
        store.put(job_name(mb, kind), encode_inputs(inputs), version)
    }

    /// The inputs of one of our jobs and the weights it ran at, for an auditor.
    pub fn evidence(
        &self,
        mb: &MicroBatchId,
        kind: JobKind,
        weights: &Hash32,
    ) -> Result<Evidence, EngineError> {
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| EngineError::NoEvidence("no evidence store".into()))?;
        let inputs = store.get(&job_name(mb, kind))?;
        let mut weights = store.get(&weights_name(weights))?;
        // An offer's blob is its weights, then the outer state it was taken against.
        if kind == JobKind::Offer {
            let neuroshard_audit::StageData::Outer { hash, .. } = decode_inputs(&inputs)?.input
            else {
                return Err(EngineError::AuditInputs(
                    "an offer without its outer state".into(),
                ));
            };
            let outer = store.get(&outer_name(&hash))?;
            weights = Arc::new([&weights[..], &outer[..]].concat());
        }
        Ok(Evidence { inputs, weights })
    }

    /// Replays a job of the stage `spec` (this one's, or another's when settling a fraud
    /// proof) on the weights it committed to.
    pub fn replay(
        &self,
        spec: StageSpec,
        job: &JobCommitment,
        inputs: &JobInputs,
        weights: &[u8],
    ) -> Result<Replayed, EngineError> {
        if job.kind == JobKind::Offer {
            return self.replay_offer(spec, job, inputs, weights);
        }
        let mut stage = if spec == *self.stage.spec() {
            self.stage.clone()
        } else {
            // Another stage's blocks may lie past this one's model (a stage the network grew
            // holds the newest block indices); the depth only bounds the indices.
            let config = neuroshard_model::ModelConfig {
                layers: self.stage.config().layers.max(spec.end_layer),
                ..self.stage.config().clone()
            };
            Stage::init(config, spec, 0)?
        };
        let flat = weights_from_bytes(weights, stage.params().numel())?;
        stage.params_mut().set_flat(&flat)?;
        if stage.model_hash() != job.weights_hash {
            return Err(EngineError::AuditWeights(
                "the weights served are not those the commitment names".into(),
            ));
        }
        Ok(replay_job(&stage, job.kind, inputs, &self.wire)?)
    }
}

/// Everything an engine needs to settle a fraud proof besides the weights: the context the
/// checker built from its own ledger and round state.
#[derive(Debug, Clone)]
pub struct Settle {
    pub spec: StageSpec,
    pub proof: FraudProof,
    pub network: Hash32,
    pub seed: ChallengeSeed,
    pub validators: Vec<NodeId>,
    pub rate: AuditRate,
    pub limits: EvidenceLimits,
    pub class: DeterminismClass,
}

impl Settle {
    /// The audit context of a job of `stage` and `round`, as this node checks it.
    pub fn context(&self, stage: u16, round: u64) -> AuditContext<'_> {
        AuditContext {
            network: self.network,
            stage,
            round,
            seed: self.seed,
            validators: &self.validators,
            rate: self.rate,
            limits: self.limits,
            tolerance: Tolerance::default(),
        }
    }
}

/// The engine replaying the one job a fraud proof is about, on the weights served with it.
struct OneJob<'a> {
    engine: &'a Engine,
    spec: StageSpec,
    weights: &'a [u8],
    class: DeterminismClass,
}

impl Replayer for OneJob<'_> {
    type Error = EngineError;

    fn class(&self) -> DeterminismClass {
        self.class
    }

    fn replay(&self, job: &JobCommitment, inputs: &JobInputs) -> Result<Replayed, EngineError> {
        self.engine.replay(self.spec, job, inputs, self.weights)
    }
}

impl Engine {
    /// Settles a fraud proof by `neuroshard_audit::check`, replaying its job here.
    pub fn settle(&self, s: &Settle, weights: &[u8]) -> Result<Verdict, EvidenceError> {
        let Ok(c) = s.proof.job.verify() else {
            return Err(EvidenceError::AccusationMismatch);
        };
        let ctx = s.context(c.stage, c.round);
        let replayer = OneJob {
            engine: self,
            spec: s.spec,
            weights,
            class: s.class,
        };
        check(&ctx, &s.proof, &replayer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_its_budget_oldest_first_and_reports_what_is_gone() {
        let mut s = JobStore::new(None, 100).unwrap();
        s.put("a".into(), vec![1; 60], 0).unwrap();
        s.put("b".into(), vec![2; 60], 1).unwrap();
        assert_eq!(s.used(), 60);
        assert!(matches!(s.get("a"), Err(EngineError::NoEvidence(_))));
        assert_eq!(*s.get("b").unwrap(), vec![2; 60]);
        // Rewriting a name replaces it rather than counting it twice.
        s.put("b".into(), vec![3; 40], 1).unwrap();
        assert_eq!(s.used(), 40);
        // Larger than the budget: not kept, and nothing else evicted for it.
        assert!(s.put("c".into(), vec![0; 101], 2).is_err());
        assert_eq!(s.used(), 40);
        s.put("d".into(), vec![4; 10], 5).unwrap();
        s.forget_before(5);
        assert!(s.get("b").is_err());
        assert_eq!(s.used(), 10);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit");
        let mut d = JobStore::new(Some(path.clone()), 1 << 20).unwrap();
        d.put("w-1".into(), vec![7; 10], 0).unwrap();
        // Served from memory until written, from the file after.
        assert_eq!(*d.get("w-1").unwrap(), vec![7; 10]);
        d.flush();
        assert_eq!(std::fs::read(path.join("w-1")).unwrap(), vec![7; 10]);
        assert_eq!(*d.get("w-1").unwrap(), vec![7; 10]);
        std::fs::remove_file(path.join("w-1")).unwrap();
        assert!(matches!(d.get("w-1"), Err(EngineError::File { .. })));
        // A restarted node starts with an empty store: its old jobs' state is gone.
        std::fs::write(path.join("left-over"), [1]).unwrap();
        let again = JobStore::new(Some(path.clone()), 1 << 20).unwrap();
        assert_eq!(again.used(), 0);
        assert_eq!(std::fs::read_dir(&path).unwrap().count(), 0);
        // And a stopped one leaves none behind.
        drop(again);
        drop(d);
        assert!(!path.exists());
    }

    #[test]
    fn weights_of_the_wrong_size_or_another_hash_are_refused() {
        assert!(weights_from_bytes(&[0; 7], 2).is_err());
        assert_eq!(
            weights_from_bytes(&weights_bytes(&[vec![1.5], vec![-2.0]]), 2).unwrap(),
            vec![1.5, -2.0]
        );
        assert!(matches!(
            decode_inputs(&[9, 9, 9]),
            Err(EngineError::AuditInputs(_))
        ));
    }
}
