//! The replica side of serving: admission of a peer's (or our own) step, per-peer and total
//! bounds, and one engine job for all queued steps.

use std::collections::BTreeMap;
use std::time::Instant;

use neuroshard_proof::{Canonical, NodeId};

use super::serve::{Cached, Reply};
use super::{EngineError, EngineJob, NodeCore, Token, Transmit};
use crate::serve::engine::{StepJob, StepResult, StreamKey};
use crate::serve::wire::SampleError;
use crate::serve::{Chunk, Head, InferMsg, InferReply};

/// Why a replica refuses an inference step (sent back as the refusal's text).
#[derive(Debug, thiserror::Error)]
enum StepRefused {
    #[error("token id outside the vocabulary")]
    TokenOutsideVocabulary,
    #[error("non-finite hidden state")]
    NonFiniteHidden,
    #[error("wrong kind of input for this stage")]
    WrongInputKind,
    #[error("an empty chunk, or hidden values that are not rows of d_model")]
    NotRows,
    #[error("chunk too long")]
    ChunkTooLong,
    #[error("positions overflow")]
    PositionsOverflow,
    #[error("a step without input")]
    NoInput,
    #[error("positions {pos}+{rows} beyond max_seq {max_seq}")]
    BeyondContext { pos: u32, rows: u32, max_seq: usize },
    #[error("the last stage needs sampling rules")]
    NoSampling,
    #[error(transparent)]
    Sample(#[from] SampleError),
    #[error("{targets} targets for a last chunk of {last:?} positions")]
    TargetCount { targets: usize, last: Option<usize> },
    #[error("a target is outside the vocabulary")]
    TargetOutsideVocabulary,
}

/// Sum of the chunks' positions, or why they do not fit this stage.
fn chunk_rows(chunks: &[Chunk], embed: bool, dim: usize, vocab: usize) -> Result<u32, StepRefused> {
    let mut total: u32 = 0;
    for c in chunks {
        match (c, embed) {
            (Chunk::Tokens(t), true) if t.iter().any(|&t| t as usize >= vocab) => {
                return Err(StepRefused::TokenOutsideVocabulary);
            }
            (Chunk::Hidden(h), false) if h.iter().any(|x| !x.is_finite()) => {
                return Err(StepRefused::NonFiniteHidden);
            }
            (Chunk::Tokens(_), true) | (Chunk::Hidden(_), false) => {}
            _ => return Err(StepRefused::WrongInputKind),
        }
        let rows = c.rows(dim).filter(|r| *r > 0).ok_or(StepRefused::NotRows)?;
        let rows = u32::try_from(rows).map_err(|_| StepRefused::ChunkTooLong)?;
        total = total
            .checked_add(rows)
            .ok_or(StepRefused::PositionsOverflow)?;
    }
    if total == 0 {
        return Err(StepRefused::NoInput);
    }
    Ok(total)
}

impl NodeCore {
    // ---- the replica side --------------------------------------------------------------

    /// A peer's inference request.
    pub(super) fn on_infer_request(
        &mut self,
        from: NodeId,
        token: Token,
        msg: InferMsg,
        now: Instant,
    ) {
        if let Some(answer) = self.accept_infer(from, Reply::Remote(token), msg, now) {
            self.transmits.push_back(Transmit::Respond {
                token,
                data: answer.to_canonical_bytes(),
            });
        }
    }

    fn drop_stream_cache(&mut self, from: NodeId, stream: u64) {
        if self.serve.cached.remove(&(from, stream)).is_some() {
            self.serve.evict.push((from, stream));
            self.dispatch_infer();
        }
    }

    /// Admits a step (the answer comes when the engine ran it: `None` here) or answers at
    /// once. `from` is the stream's coordinator: streams are keyed by it, so a peer reaches
    /// only its own.
    pub(super) fn accept_infer(
        &mut self,
        from: NodeId,
        reply: Reply,
        msg: InferMsg,
        now: Instant,
    ) -> Option<InferReply> {
        let (stream, pos, chunks, head_spec) = match msg {
            InferMsg::Close { stream } => {
                self.drop_stream_cache(from, stream);
                return Some(InferReply::Closed);
            }
            InferMsg::Settle { stream, request } => {
                let receipt = self.sign_receipt(from, stream, request);
                self.drop_stream_cache(from, stream);
                return Some(receipt);
            }
            InferMsg::Step {
                stream,
                pos,
                chunks,
                head,
            } => (stream, pos, chunks, head),
        };
        let model = &self.settings.model;
        let newest = self.pipeline.layouts().newest();
        let (embed, head) = (newest.is_first(self.stage), newest.is_last(self.stage));
        let checked = chunk_rows(&chunks, embed, model.d_model, model.vocab).and_then(|rows| {
            let end = pos
                .checked_add(rows)
                .filter(|e| *e as usize <= model.max_seq)
                .ok_or(StepRefused::BeyondContext {
                    pos,
                    rows,
                    max_seq: model.max_seq,
                })?;
            match (head, &head_spec) {
                (true, None) => Err(StepRefused::NoSampling),
                (true, Some(Head::Sample(s))) => Ok(s.check(model.vocab).map(|_| end)?),
                (true, Some(Head::Score(targets))) => {
                    let last = chunks.last().and_then(|c| c.rows(model.d_model));
                    if last != Some(targets.len()) {
                        Err(StepRefused::TargetCount {
                            targets: targets.len(),
                            last,
                        })
                    } else if targets.iter().any(|&t| t as usize >= model.vocab) {
                        Err(StepRefused::TargetOutsideVocabulary)
                    } else {
                        Ok(end)
                    }
                }
                (false, _) => Ok(end),
            }
        });
        let end = match checked {
            Ok(end) => end,
            Err(why) => {
                let why = why.to_string();
                if from != self.me {
                    self.penalize(from, format!("inference step: {why}"));
                }
                return Some(InferReply::Rejected(why));
            }
        };
        let key = (from, stream);
        if self.serve.queue.len() >= self.serve.limits.queued {
            return Some(InferReply::Busy);
        }
        match self.serve.cached.get(&key).map(|c| (c.busy, c.positions)) {
            Some((true, _)) => return Some(InferReply::Busy),
            Some((_, have)) if pos != 0 && have != pos => {
                return Some(InferReply::Restart { stream, have });
            }
            None if pos != 0 => return Some(InferReply::Restart { stream, have: 0 }),
            None if !self.make_room(from) => return Some(InferReply::Busy),
            _ => {}
        }
        self.serve.cached.insert(
            key,
            Cached {
                positions: pos,
                busy: true,
                last_used: now,
            },
        );
        let job = StepJob {
            key,
            fresh: pos == 0,
            chunks,
            head: if head { head_spec } else { None },
        };
        self.serve.queue.push((reply, job, end));
        self.dispatch_infer();
        None
    }

    /// Room for one more stream of `peer`: its own least recently used idle stream goes when
    /// it holds `per_peer`. A full replica takes the least recently used idle stream of the
    /// peer holding the most, when that one holds more than `peer` would: a few keys cannot
    /// keep every other entry node out. Otherwise a full replica takes no new stream.
    fn make_room(&mut self, peer: NodeId) -> bool {
        let limits = self.serve.limits;
        let mut own = self.streams_of(peer).len();
        if own >= limits.per_peer {
            if !self.evict_idle_stream_of(peer) {
                return false;
            }
            own -= 1;
        }
        if self.serve.cached.len() >= limits.cached {
            let mut held: BTreeMap<NodeId, usize> = BTreeMap::new();
            for (p, _) in self.serve.cached.keys() {
                *held.entry(*p).or_default() += 1;
            }
            let fullest = held
                .into_iter()
                .max_by_key(|(p, n)| (*n, *p))
                .filter(|(_, n)| *n > own + 1);
            if let Some((heavy, _)) = fullest {
                self.evict_idle_stream_of(heavy);
            }
        }
        self.serve.cached.len() < limits.cached
    }

    fn streams_of(&self, peer: NodeId) -> Vec<(&StreamKey, &Cached)> {
        self.serve
            .cached
            .range((peer, 0)..=(peer, u64::MAX))
            .collect()
    }

    /// Drops `peer`'s least recently used idle stream; false when all its streams are busy.
    fn evict_idle_stream_of(&mut self, peer: NodeId) -> bool {
        let lru = self
            .streams_of(peer)
            .into_iter()
            .filter(|(_, c)| !c.busy)
            .min_by_key(|(_, c)| c.last_used)
            .map(|(k, _)| *k);
        let Some(k) = lru else {
            return false;
        };
        self.serve.cached.remove(&k);
        self.serve.evict.push(k);
        true
    }

    /// One engine job for every queued step (a batch per stage), when none is running.
    pub(super) fn dispatch_infer(&mut self) {
        if self.serve.running.is_some()
            || (self.serve.queue.is_empty() && self.serve.evict.is_empty())
        {
            return;
        }
        let queued = std::mem::take(&mut self.serve.queue);
        let evict = std::mem::take(&mut self.serve.evict);
        let mut meta = Vec::with_capacity(queued.len());
        let mut steps = Vec::with_capacity(queued.len());
        for (reply, job, end) in queued {
            meta.push((reply, job.key, end));
            steps.push(job);
        }
        let token = self.engine(EngineJob::Infer { steps, evict });
        self.serve.running = Some((token, meta));
    }

    /// The engine ran a batch of steps.
    pub(super) fn on_inferred(
        &mut self,
        token: Token,
        results: Vec<Result<StepResult, EngineError>>,
        now: Instant,
    ) {
        let Some((running, meta)) = self.serve.running.take() else {
            return;
        };
        if running != token {
            self.serve.running = Some((running, meta));
            return;
        }
        let mut results = results.into_iter();
        for (reply, key, end) in meta {
            let result = results.next().unwrap_or(Err(EngineError::NoResult));
            let answer = match result {
                Ok(out) => {
                    if let Some(c) = self.serve.cached.get_mut(&key) {
                        c.positions = end;
                        c.busy = false;
                        c.last_used = now;
                    }
                    match out {
                        StepResult::Hidden(data) => InferReply::Hidden {
                            stream: key.1,
                            pos: end,
                            data,
                        },
                        StepResult::Token { token, draws } => InferReply::Token {
                            stream: key.1,
                            pos: end,
                            token,
                            draws,
                        },
                        StepResult::Scored { nll } => InferReply::Scored {
                            stream: key.1,
                            pos: end,
                            nll,
                        },
                    }
                }
                Err(e) => {
                    self.serve.cached.remove(&key);
                    InferReply::Rejected(e.to_string())
                }
            };
            match reply {
                Reply::Remote(t) => self.transmits.push_back(Transmit::Respond {
                    token: t,
                    data: answer.to_canonical_bytes(),
                }),
                Reply::Local { stream, hop } => self.on_hop_answer(stream, hop, Ok(answer), now),
            }
        }
        self.dispatch_infer();
    }
}
