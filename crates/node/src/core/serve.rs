//! Serving inside the core: streams this node coordinates (hop by hop through the stages,
//! with failover) and the replica side (admission, per-peer bounds, idle eviction, batching
//! the queued steps into one engine job). See `crate::serve` for the design.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use neuroshard_proof::{Canonical, NodeId};

use super::serve_pay::{Paid, Settling};
use super::{NodeCore, Pending, Token, TransferError, Transmit};
use crate::serve::engine::{StepJob, StreamKey};
use crate::serve::{
    Chunk, Completion, Finish, Head, InferMsg, InferReply, OpenError, SampleSpec, ServeEvent,
    ServeLimits,
};

/// Why a stream ended without its answer.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum StreamError {
    #[error("no live replica of stage {0} left")]
    NoReplica(usize),
    #[error("ended ({0:?}) before it was scored")]
    Unscored(Finish),
}

/// Service time the router assumes per queued inference step.
const STEP_TIME: Duration = Duration::from_millis(5);

/// Where a replica's answer goes: a peer's request, or a hop of our own stream.
#[derive(Debug, Clone, Copy)]
pub(super) enum Reply {
    Remote(Token),
    Local { stream: u64, hop: u64 },
}

/// A step admitted at a replica: where its answer goes, its stream, its end position.
pub(super) type Admitted = (Reply, StreamKey, u32);

/// A stream's cache as the replica side books it (the cache itself is the engine's).
#[derive(Debug, Clone)]
pub(super) struct Cached {
    pub(super) positions: u32,
    pub(super) busy: bool,
    pub(super) last_used: Instant,
}

/// The hop in progress of a coordinated stream.
#[derive(Debug, Clone)]
struct Hop {
    id: u64,
    stage: usize,
    input: Chunk,
    to: NodeId,
    /// The replica gets the stage's whole history (a new holder).
    fresh: bool,
    tried: BTreeSet<NodeId>,
    deadline: Instant,
}

#[derive(Debug, Clone)]
struct Stream {
    tokens: Vec<u32>,
    generated: usize,
    max_tokens: usize,
    sample: SampleSpec,
    stop_token: Option<u32>,
    /// The stage ids it crosses, in order (the architecture version it was opened under).
    route: Vec<usize>,
    /// Per stage of the route: the inputs it was fed (replayed to a new replica), their positions, and the
    /// replica holding the cache.
    history: Vec<Vec<Chunk>>,
    positions: Vec<u32>,
    holders: Vec<Option<NodeId>>,
    hop: Option<Hop>,
    paid: Option<Paid>,
    /// An evaluation stream of our own: the targets the last stage scores, and its answer.
    score: Option<Scored>,
}

impl Stream {
    /// A stream of `prompt` through the stages of `route`, nothing fed yet, free and sampling.
    fn new(
        prompt: Vec<u32>,
        max_tokens: usize,
        sample: SampleSpec,
        stop_token: Option<u32>,
        route: Vec<usize>,
    ) -> Self {
        let stages = route.len();
        Stream {
            route,
            tokens: prompt,
            generated: 0,
            max_tokens,
            sample,
            stop_token,
            history: vec![Vec::new(); stages],
            positions: vec![0; stages],
            holders: vec![None; stages],
            hop: None,
            paid: None,
            score: None,
        }
    }
}

/// A held-out window's targets and, once the last stage answered, their summed loss.
#[derive(Debug, Clone)]
struct Scored {
    targets: Vec<u32>,
    nll: Option<f64>,
}

/// Serving state of one core.
pub(super) struct ServeState {
    pub(super) limits: ServeLimits,
    next_stream: u64,
    next_hop: u64,
    streams: BTreeMap<u64, Stream>,
    pub(super) events: VecDeque<ServeEvent>,
    pub(super) cached: BTreeMap<StreamKey, Cached>,
    pub(super) queue: Vec<(Reply, StepJob, u32)>,
    pub(super) evict: Vec<StreamKey>,
    /// The engine job in flight and, per step, where its answer goes and the end position.
    pub(super) running: Option<(Token, Vec<Admitted>)>,
    pub(super) next_sweep: Instant,
    /// Paid streams that ended, waiting for receipts.
    pub(super) settling: BTreeMap<u64, Settling>,
    /// Payers with a paid stream open or settling here.
    pub(super) paying: BTreeSet<NodeId>,
}

impl ServeState {
    pub(super) fn new(limits: ServeLimits, start: Instant) -> Self {
        Self {
            limits,
            next_stream: 1,
            next_hop: 1,
            streams: BTreeMap::new(),
            events: VecDeque::new(),
            cached: BTreeMap::new(),
            queue: Vec::new(),
            evict: Vec::new(),
            running: None,
            next_sweep: start + sweep_every(limits),
            settling: BTreeMap::new(),
            paying: BTreeSet::new(),
        }
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let hops = self.streams.values().filter_map(|s| s.hop.as_ref());
        hops.map(|h| h.deadline)
            .chain(self.settling.values().map(Settling::deadline))
            .chain((!self.cached.is_empty()).then_some(self.next_sweep))
            .min()
    }
}

impl NodeCore {
    // ---- the coordinator ---------------------------------------------------------------

    /// Opens a stream for `req`; its tokens come out of [`Self::poll_serve`].
    pub fn open_stream(&mut self, req: Completion, now: Instant) -> Result<u64, OpenError> {
        let model = &self.settings.model;
        let bad = |m: String| Err(OpenError::Invalid(m));
        if req.prompt.is_empty() {
            return bad("the prompt is empty".into());
        }
        if req.prompt.len() >= model.max_seq {
            return bad(format!(
                "the prompt has {} tokens; this model's context is {}",
                req.prompt.len(),
                model.max_seq
            ));
        }
        if req.prompt.iter().any(|&t| t as usize >= model.vocab) {
            return bad("a prompt token is outside the vocabulary".into());
        }
        if req.max_tokens == 0 {
            return bad("max_tokens must be at least 1".into());
        }
        if let Err(e) = req.sample.check(model.vocab) {
            return bad(e.to_string());
        }
        if self.serve.streams.len() >= self.serve.limits.max_streams {
            return Err(OpenError::Full(self.serve.streams.len()));
        }
        let paid = self
            .check_payment(req.payment.as_deref(), now)
            .map_err(OpenError::Payment)?;
        if let Some(p) = &paid {
            self.serve.paying.insert(p.payer);
        }
        let sample = SampleSpec {
            draws: 0,
            ..req.sample
        };
        let stream = Stream {
            paid,
            ..Stream::new(
                req.prompt,
                req.max_tokens,
                sample,
                req.stop_token,
                self.serve_route(),
            )
        };
        Ok(self.launch(stream, now))
    }

    /// Opens a stream of our own that feeds `inputs` through every stage and has the last
    /// stage score `targets` (one per input); its end goes to [`Self::on_eval_stream_end`],
    /// never to the API. Checked by the caller (windows of the genesis data).
    pub(super) fn open_eval_stream(
        &mut self,
        inputs: Vec<u32>,
        targets: Vec<u32>,
        now: Instant,
    ) -> u64 {
        // Scoring draws nothing: the sampling rules are never used.
        let greedy = SampleSpec {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
            draws: 0,
        };
        let stream = Stream {
            score: Some(Scored { targets, nll: None }),
            ..Stream::new(inputs, 1, greedy, None, self.serve_route())
        };
        self.launch(stream, now)
    }

    /// The stages a new stream crosses: those of the newest version every stage of which
    /// has a registered replica (a stage the network just grew may have none yet).
    pub(super) fn serve_route(&self) -> Vec<usize> {
        let layouts = self.pipeline.layouts();
        // A driver serves through the version it trains: its new stages have live replicas
        // (a mover registers for its new stage while it still drains).
        if layouts.newest().is_first(self.stage)
            && let Some(l) = layouts.get(self.pipeline.driving())
        {
            return l.order().to_vec();
        }
        let ledger = self.economy.ledger();
        let held = |s: usize| {
            s == self.stage || u16::try_from(s).is_ok_and(|s| ledger.registered(s).next().is_some())
        };
        layouts
            .newest_first()
            .find(|l| l.order().iter().all(|&s| held(s)))
            .unwrap_or_else(|| layouts.oldest())
            .order()
            .to_vec()
    }

    /// Numbers `stream`, keeps it, and feeds its prompt to stage 0.
    fn launch(&mut self, stream: Stream, now: Instant) -> u64 {
        let id = self.serve.next_stream;
        self.serve.next_stream += 1;
        let prompt = Chunk::Tokens(stream.tokens.clone());
        self.serve.streams.insert(id, stream);
        self.start_hop(id, 0, prompt, now);
        id
    }

    /// Ends a stream early (a stop string matched, the client left).
    pub fn cancel_stream(&mut self, stream: u64, now: Instant) {
        self.end_stream(stream, Ok(Finish::Cancelled), now);
    }

    /// Bounds of serving (defaults: [`ServeLimits::default`]).
    pub fn set_serve_limits(&mut self, limits: ServeLimits) {
        self.serve.limits = limits;
        self.serve.next_sweep = self.last_now + sweep_every(limits);
    }

    /// Tokens and ends of the streams this node coordinates.
    pub fn poll_serve(&mut self) -> Option<ServeEvent> {
        self.serve.events.pop_front()
    }

    /// Which replica holds the cache of our stream `id` at each stage (None: none yet).
    pub fn stream_holders(&self, id: u64) -> Option<Vec<Option<NodeId>>> {
        self.serve.streams.get(&id).map(|s| s.holders.clone())
    }

    pub(super) fn serve_has_stream(&self, id: u64) -> bool {
        self.serve.streams.contains_key(&id)
    }

    /// Streams this node coordinates now.
    pub fn streams(&self) -> usize {
        self.serve.streams.len()
    }

    fn start_hop(&mut self, id: u64, stage: usize, input: Chunk, now: Instant) {
        let hop = self.serve.next_hop;
        self.serve.next_hop += 1;
        let Some(s) = self.serve.streams.get_mut(&id) else {
            return;
        };
        s.hop = Some(Hop {
            id: hop,
            stage,
            input,
            to: self.me,
            fresh: false,
            tried: BTreeSet::new(),
            deadline: now,
        });
        self.route_hop(id, now);
    }

    /// Picks the replica for the stream's hop (the holder of its cache if it is still
    /// there, else ourselves, else the best live or registered replica not yet tried) and
    /// sends it the step.
    fn route_hop(&mut self, id: u64, now: Instant) {
        let Some(s) = self.serve.streams.get(&id) else {
            return;
        };
        let Some(hop) = s.hop.clone() else {
            return;
        };
        let st = hop.stage;
        let Some(&stage) = s.route.get(st) else {
            return;
        };
        let holder = s.holders[st].filter(|h| !hop.tried.contains(h));
        let choice = holder.map(|h| (h, false)).or_else(|| {
            let me = (self.stage == stage && !hop.tried.contains(&self.me)).then_some(self.me);
            let live =
                crate::router::candidates(&self.pipeline.peers, stage, 1, &hop.tried, STEP_TIME);
            // Gossip is scoped to neighbouring stages, so far stages are known from the
            // ledger's registrations; a dead one fails over like any other.
            let registered = u16::try_from(stage).ok().and_then(|s16| {
                let all: Vec<NodeId> = self
                    .economy
                    .ledger()
                    .registered(s16)
                    .filter(|n| !hop.tried.contains(n) && *n != self.me)
                    .collect();
                (!all.is_empty()).then(|| all[(id as usize) % all.len()])
            });
            me.or(live.first().copied())
                .or(registered)
                .map(|n| (n, true))
        });
        let Some((to, fresh)) = choice else {
            self.end_stream(id, Err(StreamError::NoReplica(stage)), now);
            return;
        };
        let s = self.serve.streams.get_mut(&id).expect("checked above");
        let (pos, mut chunks) = if fresh {
            (0, s.history[st].clone())
        } else {
            (s.positions[st], Vec::new())
        };
        chunks.push(hop.input.clone());
        let head = (st + 1 == s.route.len()).then(|| match &s.score {
            Some(sc) => Head::Score(sc.targets.clone()),
            None => Head::Sample(s.sample),
        });
        let h = s.hop.as_mut().expect("checked above");
        h.to = to;
        h.fresh = fresh;
        h.deadline = now + self.serve.limits.hop_timeout;
        let msg = InferMsg::Step {
            stream: id,
            pos,
            chunks,
            head,
        };
        let hop_id = hop.id;
        if to == self.me {
            let reply = Reply::Local {
                stream: id,
                hop: hop_id,
            };
            if let Some(answer) = self.accept_infer(to, reply, msg, now) {
                self.on_hop_answer(id, hop_id, Ok(answer), now);
            }
        } else {
            let token = self.token();
            self.requests.insert(
                token,
                Pending::Infer {
                    stream: id,
                    hop: hop_id,
                },
            );
            self.transmits.push_back(Transmit::Request {
                to,
                token,
                data: msg.to_canonical_bytes(),
            });
        }
    }

    /// The answer to a hop (a peer's reply, our own engine's, or a transfer error).
    pub(super) fn on_hop_answer(
        &mut self,
        id: u64,
        hop_id: u64,
        answer: Result<InferReply, TransferError>,
        now: Instant,
    ) {
        let (d, vocab) = (self.settings.model.d_model, self.settings.model.vocab);
        // Answers for streams that ended or hops given up on are dropped.
        let Some(s) = self.serve.streams.get_mut(&id) else {
            return;
        };
        let last = s.route.len().saturating_sub(1);
        let Some(hop) = s.hop.clone().filter(|h| h.id == hop_id) else {
            return;
        };
        let st = hop.stage;
        let base = if hop.fresh {
            s.history[st]
                .iter()
                .map(|c| c.rows(d).unwrap_or(0) as u32)
                .sum()
        } else {
            s.positions[st]
        };
        let rows = hop.input.rows(d).unwrap_or(0) as u32;
        let want = base.saturating_add(rows);
        enum Next {
            Hop(usize, Chunk),
            Scored(f64),
            Emit(u32),
            Stop,
            Again,
            Fail(String, bool),
        }
        let next = match answer {
            Ok(InferReply::Hidden { stream, pos, data })
                if stream == id
                    && st < last
                    && pos == want
                    && data.len() == rows as usize * d
                    && data.iter().all(|x| x.is_finite()) =>
            {
                Next::Hop(st + 1, Chunk::Hidden(data))
            }
            Ok(InferReply::Token {
                stream,
                pos,
                token,
                draws,
            }) if stream == id
                && st == last
                && pos == want
                && (token as usize) < vocab
                && s.score.is_none() =>
            {
                s.sample.draws = draws;
                if Some(token) == s.stop_token {
                    Next::Stop
                } else {
                    Next::Emit(token)
                }
            }
            // A loss is a sum of cross-entropies: finite and never negative.
            Ok(InferReply::Scored { stream, pos, nll })
                if stream == id
                    && st == last
                    && pos == want
                    && s.score.is_some()
                    && nll.is_finite()
                    && nll >= 0.0 =>
            {
                Next::Scored(nll)
            }
            // The replica lost our cache (evicted, restarted): it gets the history once.
            Ok(InferReply::Restart { stream, .. }) if stream == id && !hop.fresh => Next::Again,
            Ok(InferReply::Busy) => Next::Fail("busy".into(), false),
            Ok(InferReply::Rejected(why)) => Next::Fail(format!("rejected: {why}"), false),
            Ok(other) => Next::Fail(format!("unexpected {} answer", reply_kind(&other)), true),
            Err(e) => Next::Fail(e.0, false),
        };
        if matches!(
            next,
            Next::Hop(..) | Next::Scored(_) | Next::Emit(_) | Next::Stop
        ) {
            s.history[st].push(hop.input);
            s.positions[st] = want;
            s.holders[st] = Some(hop.to);
        }
        match next {
            Next::Hop(stage, input) => self.start_hop(id, stage, input, now),
            Next::Stop => self.end_stream(id, Ok(Finish::Stop), now),
            Next::Scored(nll) => {
                if let Some(sc) = s.score.as_mut() {
                    sc.nll = Some(nll);
                }
                self.end_stream(id, Ok(Finish::Length), now);
            }
            Next::Emit(token) => {
                s.tokens.push(token);
                s.generated += 1;
                let done =
                    s.generated >= s.max_tokens || s.tokens.len() >= self.settings.model.max_seq;
                self.serve
                    .events
                    .push_back(ServeEvent::Token { stream: id, token });
                if done {
                    self.end_stream(id, Ok(Finish::Length), now);
                } else {
                    self.start_hop(id, 0, Chunk::Tokens(vec![token]), now);
                }
            }
            Next::Again => {
                s.holders[st] = None;
                self.route_hop(id, now);
            }
            Next::Fail(why, punish) => {
                if punish && hop.to != self.me {
                    self.penalize(hop.to, "inference reply that does not answer the step");
                }
                tracing::debug!("stream {id} stage {st} at {}: {why}", hop.to);
                self.fail_over(id, now);
            }
        }
    }

    /// The hop's replica failed: the next one gets the stage's history.
    fn fail_over(&mut self, id: u64, now: Instant) {
        let Some(s) = self.serve.streams.get_mut(&id) else {
            return;
        };
        let Some(hop) = s.hop.as_mut() else {
            return;
        };
        hop.tried.insert(hop.to);
        if s.holders[hop.stage] == Some(hop.to) {
            s.holders[hop.stage] = None;
        }
        let hop_id = self.serve.next_hop;
        self.serve.next_hop += 1;
        hop.id = hop_id;
        self.route_hop(id, now);
    }

    fn end_stream(&mut self, id: u64, how: Result<Finish, StreamError>, now: Instant) {
        let Some(s) = self.serve.streams.remove(&id) else {
            return;
        };
        if let Some(paid) = s.paid {
            let holders = s.holders.iter().enumerate();
            let holders = holders.filter_map(|(st, h)| h.map(|h| (st, h))).collect();
            self.start_settling(id, paid, holders, now);
        } else {
            self.close_holders(id, &s.holders, now);
        }
        if let Some(sc) = s.score {
            let result = match (how, sc.nll) {
                (Ok(_), Some(nll)) => Ok((nll, sc.targets.len())),
                (Ok(reason), None) => Err(StreamError::Unscored(reason)),
                (Err(e), _) => Err(e),
            };
            self.on_eval_stream_end(id, result, now);
            return;
        }
        self.serve.events.push_back(match how {
            Ok(reason) => ServeEvent::Finished { stream: id, reason },
            Err(error) => ServeEvent::Failed {
                stream: id,
                error: error.to_string(),
            },
        });
    }

    fn close_holders(&mut self, id: u64, holders: &[Option<NodeId>], now: Instant) {
        for holder in holders.iter().flatten().collect::<BTreeSet<_>>() {
            let msg = InferMsg::Close { stream: id };
            if *holder == self.me {
                self.accept_infer(self.me, Reply::Local { stream: id, hop: 0 }, msg, now);
            } else {
                let token = self.token();
                self.requests
                    .insert(token, Pending::Infer { stream: id, hop: 0 });
                self.transmits.push_back(Transmit::Request {
                    to: *holder,
                    token,
                    data: msg.to_canonical_bytes(),
                });
            }
        }
    }

    /// A peer is gone: hops waiting on it fail over now.
    pub(super) fn serve_peer_down(&mut self, peer: NodeId, now: Instant) {
        let waiting: Vec<u64> = self
            .serve
            .streams
            .iter()
            .filter(|(_, s)| s.hop.as_ref().is_some_and(|h| h.to == peer))
            .map(|(id, _)| *id)
            .collect();
        for id in waiting {
            self.fail_over(id, now);
        }
    }

    pub(super) fn serve_timeout(&mut self, now: Instant) {
        let late: Vec<u64> = self
            .serve
            .streams
            .iter()
            .filter(|(_, s)| s.hop.as_ref().is_some_and(|h| now >= h.deadline))
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            self.fail_over(id, now);
        }
        self.settle_due(now);
        if now >= self.serve.next_sweep {
            let idle = self.serve.limits.idle;
            self.serve.next_sweep = now + sweep_every(self.serve.limits);
            let stale: Vec<StreamKey> = self
                .serve
                .cached
                .iter()
                .filter(|(_, c)| !c.busy && now.saturating_duration_since(c.last_used) >= idle)
                .map(|(k, _)| *k)
                .collect();
            for k in stale {
                self.serve.cached.remove(&k);
                self.serve.evict.push(k);
            }
            self.dispatch_infer();
        }
    }
}

/// How often idle caches are looked for: a cache lives at most 1¼ × `idle` unused.
fn sweep_every(limits: ServeLimits) -> Duration {
    limits.idle / 4
}

fn reply_kind(r: &InferReply) -> &'static str {
    match r {
        InferReply::Hidden { .. } => "hidden",
        InferReply::Token { .. } => "token",
        InferReply::Restart { .. } => "restart",
        InferReply::Closed => "closed",
        InferReply::Busy => "busy",
        InferReply::Rejected(_) => "rejected",
        InferReply::Receipt(_) => "receipt",
        InferReply::Scored { .. } => "scored",
    }
}
