//! The tokio task that owns the swarm: it runs commands from [`crate::Net`] handles, answers
//! peers, validates what comes in, and turns swarm events into [`NetEvent`]s.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance, PublishError};
use libp2p::kad::QueryId;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::OutboundRequestId;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{ConnectionId, DialError, SwarmEvent};
use libp2p::{Multiaddr, PeerId, Swarm, identify, ping};
use tokio::sync::{mpsc, oneshot};

use crate::behaviour::{Behaviour, BehaviourEvent, KAD_PROTOCOL};
use crate::blob::BlobStore;
use crate::codec::CounterSet;
use crate::ids::AddressBook;
use crate::net::{NetEvent, ResponseChannel};
use crate::{NetConfig, NetError, Validation};

mod kad_queries;
mod rate;
mod requests;
mod scores;

use kad_queries::Query;
use rate::RateLimit;

pub(crate) type Reply<T> = oneshot::Sender<Result<T, NetError>>;

/// Capacity of the application's event queue.
pub(crate) const EVENT_QUEUE: usize = 4096;
/// How often application scores decay.
const DECAY_EVERY: Duration = Duration::from_secs(60);

/// The task's end of the event queue, bounded in count ([`EVENT_QUEUE`]) and in message bytes.
pub(crate) struct EventQueue {
    tx: mpsc::Sender<NetEvent>,
    queued: Arc<AtomicUsize>,
    max_bytes: usize,
}

impl EventQueue {
    pub(crate) fn new(
        tx: mpsc::Sender<NetEvent>,
        queued: Arc<AtomicUsize>,
        max_bytes: usize,
    ) -> Self {
        Self {
            tx,
            queued,
            max_bytes,
        }
    }

    /// Queues `event` if its bytes fit the budget and the queue has room; else hands it back
    /// (a request's channel dropped with it fails the request at the peer at once).
    fn push(&self, event: NetEvent) -> Result<(), NetEvent> {
        let size = event.queued_bytes();
        // One producer (this task): what it reads here can only shrink before it adds.
        if self
            .queued
            .load(Ordering::Acquire)
            .checked_add(size)
            .is_none_or(|total| total > self.max_bytes)
        {
            return Err(event);
        }
        self.queued.fetch_add(size, Ordering::AcqRel);
        match self.tx.try_send(event) {
            Ok(()) => Ok(()),
            Err(
                mpsc::error::TrySendError::Full(event) | mpsc::error::TrySendError::Closed(event),
            ) => {
                self.queued.fetch_sub(size, Ordering::AcqRel);
                Err(event)
            }
        }
    }

    fn closed(&self) -> bool {
        self.tx.is_closed()
    }
}

pub(crate) enum Command {
    Dial(Multiaddr, Reply<()>),
    ListenAddrs(oneshot::Sender<Vec<Multiaddr>>),
    Publish {
        topic: String,
        data: Vec<u8>,
    },
    SetTopics(Vec<String>, Reply<()>),
    Request {
        peer: PeerId,
        data: Vec<u8>,
        reply: Reply<Vec<u8>>,
    },
    BlobRequest {
        peer: PeerId,
        data: Vec<u8>,
        reply: Reply<Vec<u8>>,
    },
    Respond {
        channel: ResponseChannel,
        data: Vec<u8>,
    },
    PutRecord {
        key: Vec<u8>,
        value: Vec<u8>,
        reply: Reply<()>,
    },
    GetRecord {
        key: Vec<u8>,
        reply: Reply<Vec<Vec<u8>>>,
    },
    StartProviding {
        key: Vec<u8>,
        reply: Reply<()>,
    },
    GetProviders {
        key: Vec<u8>,
        reply: Reply<HashSet<PeerId>>,
    },
    Penalize {
        peer: PeerId,
        amount: f64,
        reason: String,
    },
    Shutdown(oneshot::Sender<()>),
}

pub(crate) struct Task {
    swarm: Swarm<Behaviour>,
    commands: mpsc::UnboundedReceiver<Command>,
    events: EventQueue,
    counters: Arc<CounterSet>,
    blobs: BlobStore,
    config: NetConfig,
    /// Node ids of the peers we met, for the application above.
    book: AddressBook,
    /// Listeners still open.
    listeners: usize,
    requests: HashMap<OutboundRequestId, Reply<Vec<u8>>>,
    blob_requests: HashMap<OutboundRequestId, Reply<Vec<u8>>>,
    dials: HashMap<ConnectionId, Reply<()>>,
    queries: HashMap<QueryId, Query>,
    listen_addrs: Vec<Multiaddr>,
    listen_waiters: Vec<oneshot::Sender<Vec<Multiaddr>>>,
    scores: scores::Scores,
    rate: RateLimit,
    request_rate: RateLimit,
}

impl Task {
    pub(crate) fn new(
        swarm: Swarm<Behaviour>,
        events: EventQueue,
        commands: mpsc::UnboundedReceiver<Command>,
        counters: Arc<CounterSet>,
        blobs: BlobStore,
        config: NetConfig,
        book: AddressBook,
    ) -> Self {
        let rate = RateLimit::new(
            config.gossip_per_sec,
            config.gossip_burst,
            rate::MAX_BUCKETS,
        );
        let request_rate = RateLimit::new(
            config.request_per_sec,
            config.request_burst,
            rate::MAX_BUCKETS,
        );
        Task {
            swarm,
            commands,
            events,
            counters,
            blobs,
            book,
            listeners: config.listen.len(),
            config,
            requests: HashMap::new(),
            blob_requests: HashMap::new(),
            dials: HashMap::new(),
            queries: HashMap::new(),
            listen_addrs: Vec::new(),
            listen_waiters: Vec::new(),
            scores: scores::Scores::default(),
            rate,
            request_rate,
        }
    }

    fn local(&self) -> PeerId {
        *self.swarm.local_peer_id()
    }

    pub(crate) async fn run(mut self) {
        let mut decay = tokio::time::interval(DECAY_EVERY);
        decay.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        decay.reset();
        let done = loop {
            tokio::select! {
                command = self.commands.recv() => match command {
                    None => break None,
                    Some(Command::Shutdown(done)) => break Some(done),
                    Some(command) => self.command(command),
                },
                event = self.swarm.select_next_some() => self.swarm_event(event),
                _ = decay.tick() => self.decay_scores(),
            }
        };
        tracing::debug!(peer = %self.local(), "network task stopping");
        // Dropping the swarm closes every connection; pending replies see `Shutdown`.
        drop(self);
        if let Some(done) = done {
            let _ = done.send(());
        }
    }

    fn emit(&self, event: NetEvent) {
        if let Err(event) = self.events.push(event) {
            // The application dropped its receiver: it no longer wants events.
            if !self.events.closed() {
                CounterSet::bump(&self.counters.events_dropped);
                tracing::warn!(
                    bytes = event.queued_bytes(),
                    queued = self.events.queued.load(Ordering::Acquire),
                    "event queue over its count or byte budget; event dropped"
                );
            }
        }
    }

    fn listen_addrs_with_id(&self) -> Vec<Multiaddr> {
        let local = self.local();
        self.listen_addrs
            .iter()
            .map(|a| a.clone().with(Protocol::P2p(local)))
            .collect()
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Dial(addr, reply) => self.dial(addr, reply),
            Command::ListenAddrs(reply) => {
                if self.listen_addrs.is_empty() && self.listeners > 0 {
                    self.listen_waiters.push(reply);
                } else {
                    let _ = reply.send(self.listen_addrs_with_id());
                }
            }
            Command::Publish { topic, data } => self.publish(topic, data),
            Command::SetTopics(topics, reply) => {
                let gossip = &mut self.swarm.behaviour_mut().gossip;
                let _ = reply.send(crate::behaviour::set_topics(gossip, &topics));
            }
            Command::Request { peer, data, reply } => {
                if let Some(reply) = self.refuse_peer(peer, reply) {
                    let id = self.swarm.behaviour_mut().msg.send_request(&peer, data);
                    self.requests.insert(id, reply);
                }
            }
            Command::BlobRequest { peer, data, reply } => {
                if let Some(reply) = self.refuse_peer(peer, reply) {
                    let id = self.swarm.behaviour_mut().blob.send_request(&peer, data);
                    self.blob_requests.insert(id, reply);
                }
            }
            Command::Respond { channel, data } => self.respond(channel, data),
            Command::PutRecord { key, value, reply } => self.put_record(key, value, reply),
            Command::GetRecord { key, reply } => self.get_record(key, reply),
            Command::StartProviding { key, reply } => self.start_providing(key, reply),
            Command::GetProviders { key, reply } => self.get_providers(key, reply),
            Command::Penalize {
                peer,
                amount,
                reason,
            } => self.penalize(peer, amount, &reason),
            // Handled by `run`.
            Command::Shutdown(_) => {}
        }
    }

    /// Answers requests to ourselves or to blocked peers at once; otherwise hands the reply back.
    fn refuse_peer<T>(&self, peer: PeerId, reply: Reply<T>) -> Option<Reply<T>> {
        let why = if peer == self.local() {
            "cannot send a request to ourselves"
        } else if self.scores.is_banned(&peer) {
            "peer is blocked"
        } else {
            return Some(reply);
        };
        let _ = reply.send(Err(NetError::DialFailure(why.into())));
        None
    }

    fn dial(&mut self, addr: Multiaddr, reply: Reply<()>) {
        let opts = match addr.iter().last() {
            Some(Protocol::P2p(peer)) => {
                if peer == self.local() {
                    let _ = reply.send(Err(NetError::DialFailure("address is our own".into())));
                    return;
                }
                let mut bare = addr.clone();
                bare.pop();
                self.swarm.behaviour_mut().kad.add_address(&peer, bare);
                DialOpts::peer_id(peer)
                    .addresses(vec![addr])
                    .condition(PeerCondition::Disconnected)
                    .build()
            }
            _ => DialOpts::from(addr),
        };
        let id = opts.connection_id();
        match self.swarm.dial(opts) {
            Ok(()) => {
                self.dials.insert(id, reply);
            }
            // Already connected to that peer: nothing to do.
            Err(DialError::DialPeerConditionFalse(_)) => {
                let _ = reply.send(Ok(()));
            }
            Err(e) => {
                let _ = reply.send(Err(NetError::DialFailure(e.to_string())));
            }
        }
    }

    fn publish(&mut self, topic: String, data: Vec<u8>) {
        let len = data.len();
        let gossip = &mut self.swarm.behaviour_mut().gossip;
        match gossip.publish(IdentTopic::new(&topic), data) {
            Ok(_) => self.counters.gossip.sent(len),
            Err(PublishError::NoPeersSubscribedToTopic) => {
                CounterSet::bump(&self.counters.gossip_no_peers);
                tracing::debug!(topic, "published with no subscribed peers");
            }
            Err(PublishError::Duplicate) => {
                tracing::debug!(topic, "message identical to one already published")
            }
            Err(e) => tracing::warn!(topic, error = %e, "publish failed"),
        }
    }

    fn swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::Behaviour(BehaviourEvent::Gossip(e)) => self.gossip_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Kad(e)) => self.kad_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Msg(e)) => self.msg_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Blob(e)) => self.blob_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) if info.protocols.contains(&KAD_PROTOCOL) => {
                // Only peers that speak our DHT join the routing table.
                for addr in info.listen_addrs {
                    if !is_unspecified(&addr) {
                        self.swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event {
                peer,
                connection,
                result: Err(e),
            })) => {
                tracing::debug!(%peer, error = %e, "ping failed; closing connection");
                self.swarm.close_connection(connection);
            }
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::debug!(%address, "listening");
                self.listen_addrs.push(address);
                let addrs = self.listen_addrs_with_id();
                for waiter in self.listen_waiters.drain(..) {
                    let _ = waiter.send(addrs.clone());
                }
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                self.listen_addrs.retain(|a| a != &address);
            }
            SwarmEvent::ListenerClosed {
                addresses, reason, ..
            } => {
                tracing::warn!(?addresses, ?reason, "listener closed");
                self.listen_addrs.retain(|a| !addresses.contains(a));
                self.listeners = self.listeners.saturating_sub(1);
                if self.listeners == 0 {
                    for waiter in self.listen_waiters.drain(..) {
                        let _ = waiter.send(Vec::new());
                    }
                }
            }
            SwarmEvent::ListenerError { error, .. } => {
                tracing::warn!(%error, "listener error");
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                num_established,
                ..
            } => {
                if let Some(reply) = self.dials.remove(&connection_id) {
                    let _ = reply.send(Ok(()));
                }
                if num_established.get() == 1 {
                    tracing::debug!(peer = %peer_id, "peer connected");
                    if let Some(node) = self.book.learn(&peer_id) {
                        self.emit(NetEvent::PeerConnected(node));
                    }
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                cause,
                ..
            } => {
                tracing::debug!(peer = %peer_id, ?cause, "peer disconnected");
                if let Some(node) = self.book.learn(&peer_id) {
                    self.emit(NetEvent::PeerDisconnected(node));
                }
            }
            SwarmEvent::OutgoingConnectionError {
                connection_id,
                peer_id,
                error,
            } => {
                tracing::debug!(?peer_id, %error, "outgoing connection failed");
                if let Some(reply) = self.dials.remove(&connection_id) {
                    let _ = reply.send(Err(NetError::DialFailure(error.to_string())));
                }
            }
            SwarmEvent::IncomingConnectionError { error, .. } => {
                tracing::debug!(%error, "incoming connection failed");
            }
            _ => {}
        }
    }

    fn gossip_event(&mut self, event: gossipsub::Event) {
        let gossipsub::Event::Message {
            propagation_source,
            message_id,
            message,
        } = event
        else {
            return;
        };
        self.counters.gossip.received(message.data.len());
        let topic = message.topic.as_str();
        // Strict validation never delivers unsigned messages; refuse one anyway, and one from
        // a peer that is not a NeuroShard node (no secp256k1 key in its peer id).
        let author = message.source.as_ref().and_then(|a| self.book.learn(a));
        // The rate first: a flood costs one table lookup per message, not a validation.
        let over_rate = author
            .as_ref()
            .is_some_and(|a| !self.rate.allow(a, topic, std::time::Instant::now()));
        let verdict = match &author {
            Some(_) if over_rate => Validation::Ignore,
            Some(author) => (self.config.gossip_validator)(topic, author, &message.data),
            None => Validation::Reject,
        };
        if over_rate {
            CounterSet::bump(&self.counters.gossip_over_rate);
            // Relays of a flood are not at fault; its author, when it sent it itself, is.
            if message.source == Some(propagation_source) {
                // A quarter penalty: twenty messages over the rate before a ban at the defaults.
                let penalty = self.config.penalty / 4.0;
                self.penalize(propagation_source, penalty, "gossip over its rate");
            }
        }
        let acceptance = match verdict {
            Validation::Accept => MessageAcceptance::Accept,
            Validation::Reject => MessageAcceptance::Reject,
            Validation::Ignore => MessageAcceptance::Ignore,
        };
        if verdict == Validation::Reject {
            tracing::debug!(peer = %propagation_source, topic, "gossip message rejected");
        }
        self.swarm
            .behaviour_mut()
            .gossip
            .report_message_validation_result(&message_id, &propagation_source, acceptance);
        if let (Validation::Accept, Some(author)) = (verdict, author) {
            self.emit(NetEvent::Gossip {
                topic: message.topic.into_string(),
                author,
                data: message.data,
            });
        }
    }
}

fn is_unspecified(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| match p {
        Protocol::Ip4(ip) => ip.is_unspecified(),
        Protocol::Ip6(ip) => ip.is_unspecified(),
        _ => false,
    })
}
