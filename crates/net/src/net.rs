//! [`Net`]: the cloneable handle the node uses, and the events it receives.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use libp2p::multiaddr::Protocol;
use libp2p::{PeerId, SwarmBuilder, noise, request_response, tcp, yamux};
use tokio::sync::{mpsc, oneshot};

use crate::behaviour::{self, Behaviour};
use crate::blob::{self, BlobStore};
use crate::codec::{CounterSet, Counters};
use crate::ids::{AddressBook, keypair_from_secret, peer_id_of};
use crate::task::{Command, EVENT_QUEUE, EventQueue, Reply, Task};
use crate::{Address, NetConfig, NetError};
use neuroshard_proof::NodeId;

/// What the network tells the node.
#[derive(Debug)]
pub enum NetEvent {
    /// A gossip message the validator accepted (never our own).
    Gossip {
        topic: String,
        author: NodeId,
        data: Vec<u8>,
    },
    /// A peer's request; answer it with [`Net::respond`] (dropping `channel` fails the request).
    Request {
        peer: NodeId,
        data: Vec<u8>,
        channel: ResponseChannel,
    },
    /// The first connection to a peer opened.
    PeerConnected(NodeId),
    /// The last connection to a peer closed.
    PeerDisconnected(NodeId),
}

impl NetEvent {
    /// Bytes the event holds against the inbound budget ([`NetConfig::max_queued_bytes`]).
    pub(crate) fn queued_bytes(&self) -> usize {
        match self {
            NetEvent::Gossip { topic, data, .. } => topic.len().saturating_add(data.len()),
            NetEvent::Request { data, .. } => data.len(),
            NetEvent::PeerConnected(_) | NetEvent::PeerDisconnected(_) => 0,
        }
    }
}

/// The application's end of the event queue: taking an event releases its bytes from the
/// inbound budget.
pub struct NetEvents {
    rx: mpsc::Receiver<NetEvent>,
    queued: Arc<AtomicUsize>,
}

impl NetEvents {
    /// The next event; `None` once the network task stopped.
    pub async fn recv(&mut self) -> Option<NetEvent> {
        let event = self.rx.recv().await?;
        self.queued
            .fetch_sub(event.queued_bytes(), Ordering::AcqRel);
        Some(event)
    }

    /// Message bytes delivered and not yet taken.
    pub fn queued_bytes(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

impl fmt::Debug for NetEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetEvents")
            .field("queued_bytes", &self.queued_bytes())
            .finish_non_exhaustive()
    }
}

/// Where the response to one inbound request goes.
pub struct ResponseChannel(pub(crate) request_response::ResponseChannel<Vec<u8>>);

impl ResponseChannel {
    /// Whether the requester may still receive a response (not timed out, connection open).
    pub fn is_open(&self) -> bool {
        self.0.is_open()
    }
}

impl fmt::Debug for ResponseChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseChannel")
            .field("open", &self.is_open())
            .finish()
    }
}

/// A handle to the network task. Cloning is cheap; the task stops on [`Net::shutdown`] or
/// when every handle is dropped.
#[derive(Clone)]
pub struct Net {
    inner: Arc<Inner>,
}

struct Inner {
    peer_id: PeerId,
    node_id: NodeId,
    book: AddressBook,
    commands: mpsc::UnboundedSender<Command>,
    counters: Arc<CounterSet>,
    blobs: BlobStore,
    max_frame: usize,
    max_gossip: usize,
    penalty: f64,
    request_timeout: Duration,
    /// The peers named by `config.bootstrap` (the ones with a NeuroShard key).
    bootstrap: Vec<NodeId>,
}

impl fmt::Debug for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Net")
            .field("peer_id", &self.inner.peer_id)
            .finish_non_exhaustive()
    }
}

impl Net {
    /// Starts the swarm task on the current tokio runtime with the libp2p secp256k1 keypair
    /// made from `secret`: listens, subscribes to `config.topics`, dials the bootstrap peers.
    pub async fn start(secret: [u8; 32], config: NetConfig) -> Result<(Net, NetEvents), NetError> {
        let key = keypair_from_secret(&secret)?;
        if config.max_frame == 0 || config.max_gossip == 0 {
            return Err(NetError::Transport(
                "max_frame and max_gossip must be positive".into(),
            ));
        }
        let counters = Arc::new(CounterSet::default());
        let mut behaviour = Behaviour::new(&key, &config, &counters)?;
        for topic in &config.topics {
            behaviour::subscribe(&mut behaviour.gossip, topic)?;
        }
        let transport = |e: &dyn fmt::Display| NetError::Transport(e.to_string());
        let mut swarm = SwarmBuilder::with_existing_identity(key)
            .with_tokio()
            .with_tcp(
                tcp::Config::default().nodelay(true),
                noise::Config::new,
                yamux::Config::default,
            )
            .map_err(|e| transport(&e))?
            .with_quic_config(|mut c| {
                c.keep_alive_interval = Duration::from_secs(5);
                c.max_idle_timeout = 15_000;
                c
            })
            .with_behaviour(|_| behaviour)
            .map_err(|e| transport(&e))?
            .with_swarm_config(|c| c.with_idle_connection_timeout(config.idle_timeout))
            .build();
        let local = *swarm.local_peer_id();

        for addr in &config.listen {
            swarm
                .listen_on(addr.0.clone())
                .map_err(|e| NetError::Listen {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                })?;
        }
        let mut bootstrap = false;
        let mut bootstrap_peers = Vec::new();
        for addr in config.bootstrap.iter().map(|a| &a.0) {
            let Some(Protocol::P2p(peer)) = addr.iter().last() else {
                return Err(NetError::DialFailure(format!(
                    "bootstrap address {addr} does not end in /p2p/<peer id>"
                )));
            };
            if peer == local {
                continue;
            }
            bootstrap_peers.push(peer);
            let mut bare = addr.clone();
            bare.pop();
            swarm.behaviour_mut().kad.add_address(&peer, bare);
            if let Err(e) = swarm.dial(addr.clone()) {
                tracing::warn!(%addr, error = %e, "cannot dial bootstrap peer");
            }
            bootstrap = true;
        }
        if bootstrap && swarm.behaviour_mut().kad.bootstrap().is_ok() {
            CounterSet::bump(&counters.kad_queries);
        }

        let (commands, command_rx) = mpsc::unbounded_channel();
        let (event_tx, rx) = mpsc::channel(EVENT_QUEUE);
        let queued = Arc::new(AtomicUsize::new(0));
        let events = NetEvents {
            rx,
            queued: queued.clone(),
        };
        let blobs = BlobStore::default();
        let book = AddressBook::default();
        let node_id = book.learn(&local).ok_or(NetError::InvalidSecret)?;
        // Learned now, so a request can go to a bootstrap peer before it has spoken.
        let mut bootstrap_nodes = Vec::new();
        for peer in &bootstrap_peers {
            if let Some(node) = book.learn(peer)
                && !bootstrap_nodes.contains(&node)
            {
                bootstrap_nodes.push(node);
            }
        }
        let inner = Inner {
            peer_id: local,
            node_id,
            book: book.clone(),
            commands,
            counters: counters.clone(),
            blobs: blobs.clone(),
            max_frame: config.max_frame,
            max_gossip: config.max_gossip,
            penalty: config.penalty,
            request_timeout: config.request_timeout,
            bootstrap: bootstrap_nodes,
        };
        let task = Task::new(
            swarm,
            EventQueue::new(event_tx, queued, config.max_queued_bytes),
            command_rx,
            counters,
            blobs,
            config,
            book,
        );
        tokio::spawn(task.run());
        tracing::info!(peer = %local, "network started");
        Ok((
            Net {
                inner: Arc::new(inner),
            },
            events,
        ))
    }

    /// The node ids of the bootstrap peers this transport was started with (those whose peer
    /// id holds a secp256k1 key: NeuroShard nodes), in the order given.
    pub fn bootstrap_nodes(&self) -> Vec<NodeId> {
        self.inner.bootstrap.clone()
    }

    /// Our node id (the same key's BLAKE3, as everywhere above the transport).
    pub fn node_id(&self) -> NodeId {
        self.inner.node_id
    }

    /// Our transport identity as text (libp2p's peer id), for logs and addresses.
    pub fn transport_id(&self) -> String {
        self.inner.peer_id.to_string()
    }

    /// Teaches the address book a node by its compressed secp256k1 key (e.g. the signer of a
    /// record), so requests to that node can be sent before it was met.
    pub fn learn_key(&self, public_key: &[u8; 33]) -> Option<NodeId> {
        let peer = peer_id_of(public_key).ok()?;
        self.inner.book.learn(&peer)
    }

    fn peer(&self, node: &NodeId) -> Result<PeerId, NetError> {
        self.inner
            .book
            .peer(node)
            .ok_or(NetError::UnknownPeer(*node))
    }

    fn send(&self, command: Command) -> Result<(), NetError> {
        self.inner
            .commands
            .send(command)
            .map_err(|_| NetError::Shutdown)
    }

    /// Sends a command carrying a reply channel and waits for the reply.
    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, NetError> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        rx.await.map_err(|_| NetError::Shutdown)?
    }

    /// Our listen addresses, each ending in `/p2p/<our peer id>`; waits until at least one
    /// listener is up (empty if none could start or the network has shut down).
    pub async fn listen_addrs(&self) -> Vec<Address> {
        let (tx, rx) = oneshot::channel();
        if self.send(Command::ListenAddrs(tx)).is_err() {
            return Vec::new();
        }
        rx.await
            .unwrap_or_default()
            .into_iter()
            .map(Address)
            .collect()
    }

    /// Connects to an address (with `/p2p/<id>` the peer's identity is checked and it joins the
    /// routing table); returns once connected. Ok at once if already connected to that peer.
    pub async fn dial(&self, addr: Address) -> Result<(), NetError> {
        let limit = self.inner.request_timeout;
        tokio::time::timeout(limit, self.call(|reply| Command::Dial(addr.0, reply)))
            .await
            .map_err(|_| NetError::Timeout)?
    }

    /// Publishes on a gossip topic. Publishing with no subscribed peer is not an error (it is
    /// counted in [`Counters::gossip_no_peers`]).
    pub fn publish(&self, topic: &str, data: Vec<u8>) -> Result<(), NetError> {
        if data.len() > self.inner.max_gossip {
            return Err(NetError::FrameTooLarge {
                len: data.len(),
                max: self.inner.max_gossip,
            });
        }
        self.send(Command::Publish {
            topic: topic.to_string(),
            data,
        })
    }

    /// Subscribes to exactly `topics` (joining new ones, leaving the rest): a node listens to
    /// every stage while it chooses one, then only to what its stage needs.
    pub async fn set_topics(&self, topics: Vec<String>) -> Result<(), NetError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::SetTopics(topics, reply))?;
        rx.await.map_err(|_| NetError::Shutdown)?
    }

    /// Sends a request on `/neuroshard/msg/1` and waits for the response.
    pub async fn request(&self, node: NodeId, data: Vec<u8>) -> Result<Vec<u8>, NetError> {
        let peer = self.peer(&node)?;
        if data.len() > self.inner.max_frame {
            return Err(NetError::FrameTooLarge {
                len: data.len(),
                max: self.inner.max_frame,
            });
        }
        self.bounded(self.call(|reply| Command::Request { peer, data, reply }))
            .await
    }

    /// Guards against a reply that never comes: libp2p's own timers cover the request, this
    /// covers the dial before it.
    async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, NetError>>,
    ) -> Result<T, NetError> {
        let limit = self.inner.request_timeout * 2 + Duration::from_secs(5);
        tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| NetError::Timeout)?
    }

    /// Answers an inbound request. A response over `max_frame` is not sent (the requester
    /// sees a failure).
    pub fn respond(&self, channel: ResponseChannel, data: Vec<u8>) {
        let _ = self.send(Command::Respond { channel, data });
    }

    /// Stores a record locally and at the closest peers; our copy is republished every
    /// `republish_interval` and lives on others for `record_ttl` after the last publication.
    /// The value must pass our own record validator (publisher = us). Succeeds even if no
    /// other peer took it.
    pub async fn put_record(&self, key: Vec<u8>, value: Vec<u8>) -> Result<(), NetError> {
        self.call(|reply| Command::PutRecord { key, value, reply })
            .await
    }

    /// All distinct values under `key` that pass the record validator, from the local store
    /// and every peer the lookup reached; empty if none.
    pub async fn get_record(&self, key: Vec<u8>) -> Result<Vec<Vec<u8>>, NetError> {
        self.call(|reply| Command::GetRecord { key, reply }).await
    }

    /// Announces that we provide `key` (locally at once, then at the closest peers).
    pub async fn start_providing(&self, key: Vec<u8>) -> Result<(), NetError> {
        self.call(|reply| Command::StartProviding { key, reply })
            .await
    }

    /// Providers of `key`, ourselves included if we provide it.
    pub async fn get_providers(&self, key: Vec<u8>) -> Result<HashSet<NodeId>, NetError> {
        let peers = self
            .call(|reply| Command::GetProviders { key, reply })
            .await?;
        Ok(peers
            .iter()
            .filter_map(|p| self.inner.book.learn(p))
            .collect())
    }

    /// Serves `data` on `/neuroshard/blob/1` under its BLAKE3 hash, which is returned.
    pub fn offer_blob(&self, data: Arc<Vec<u8>>) -> [u8; 32] {
        self.inner.blobs.insert(data)
    }

    pub fn withdraw_blob(&self, hash: [u8; 32]) {
        self.inner.blobs.remove(&hash);
    }

    /// Downloads the blob with this BLAKE3 hash from `peer` in 1 MiB chunks, refusing blobs
    /// longer than `max_len` before downloading them. A peer that serves bytes not matching the
    /// hash, or malformed chunks, is penalised.
    pub async fn fetch_blob(
        &self,
        node: NodeId,
        hash: [u8; 32],
        max_len: usize,
    ) -> Result<Vec<u8>, NetError> {
        let peer = self.peer(&node)?;
        let send = |data: Vec<u8>| {
            self.bounded(self.call(move |reply| Command::BlobRequest { peer, data, reply }))
        };
        let result = blob::fetch(send, hash, max_len).await;
        if let Err(e @ (NetError::HashMismatch | NetError::Protocol(_))) = &result {
            self.penalize(node, &format!("blob transfer: {e}"));
        }
        result
    }

    /// Lowers the peer's application score by `NetConfig::penalty` (gossipsub counts it in the
    /// peer score); at or below `NetConfig::ban_threshold` the peer is disconnected and blocked.
    pub fn penalize(&self, node: NodeId, reason: &str) {
        self.penalize_by(node, self.inner.penalty, reason);
    }

    /// [`Net::penalize`] with an explicit amount (e.g. a large one for a forged signature).
    pub fn penalize_by(&self, node: NodeId, amount: f64, reason: &str) {
        // A node we never met has no transport score to lower.
        let Ok(peer) = self.peer(&node) else {
            return;
        };
        let _ = self.send(Command::Penalize {
            peer,
            amount,
            reason: reason.to_string(),
        });
    }

    pub fn counters(&self) -> Counters {
        self.inner.counters.snapshot()
    }

    /// Stops the network task and closes every connection; later calls fail with `Shutdown`.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(Command::Shutdown(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}
