//! The two request-response protocols: opaque requests go to the application, blob chunk
//! requests are answered here; failures map to [`NetError`].

use libp2p::PeerId;
use libp2p::request_response::{self, Message, OutboundFailure};

use super::Task;
use crate::NetError;
use crate::codec::{CounterSet, frame_too_large};
use crate::net::{NetEvent, ResponseChannel};
use neuroshard_proof::NodeId;

type Event = request_response::Event<Vec<u8>, Vec<u8>>;

impl Task {
    pub(super) fn respond(&mut self, channel: ResponseChannel, data: Vec<u8>) {
        let max = self.config.max_frame;
        if data.len() > max {
            tracing::warn!(len = data.len(), max, "response over max_frame not sent");
            return;
        }
        let msg = &mut self.swarm.behaviour_mut().msg;
        if msg.send_response(channel.0, data).is_err() {
            tracing::debug!("response not sent: request stream already closed");
        }
    }

    pub(super) fn msg_event(&mut self, event: Event) {
        if let Some((peer, request, channel)) = self.settle(event, false) {
            // Requests from peers that are not NeuroShard nodes are dropped (they time out).
            if let Some(node) = self.book.learn(&peer)
                && self.request_allowed(peer, &node, "msg")
            {
                self.emit(NetEvent::Request {
                    peer: node,
                    data: request,
                    channel: ResponseChannel(channel),
                });
            }
        }
    }

    /// Whether `peer` is within its request rate for `kind`; over it, the request is dropped
    /// (it fails at the peer) and the peer pays a quarter penalty.
    fn request_allowed(&mut self, peer: PeerId, node: &NodeId, kind: &str) -> bool {
        if self
            .request_rate
            .allow(node, kind, std::time::Instant::now())
        {
            return true;
        }
        CounterSet::bump(&self.counters.requests_over_rate);
        let penalty = self.config.penalty / 4.0;
        self.penalize(peer, penalty, "requests over its rate");
        false
    }

    pub(super) fn blob_event(&mut self, event: Event) {
        if let Some((peer, request, channel)) = self.settle(event, true) {
            let Some(node) = self.book.learn(&peer) else {
                return;
            };
            if !self.request_allowed(peer, &node, "blob") {
                return;
            }
            let response = self.blobs.serve(&request);
            let blob = &mut self.swarm.behaviour_mut().blob;
            if blob.send_response(channel, response).is_err() {
                tracing::debug!(%peer, "blob response not sent: stream closed");
            }
        }
    }

    /// What both protocols do alike: answers our pending requests (responses and failures)
    /// and logs inbound failures. Returns an inbound request for the protocol to handle.
    fn settle(
        &mut self,
        event: Event,
        blob: bool,
    ) -> Option<(PeerId, Vec<u8>, request_response::ResponseChannel<Vec<u8>>)> {
        let (request_id, result) = match event {
            Event::Message {
                peer,
                message:
                    Message::Request {
                        request, channel, ..
                    },
                ..
            } => return Some((peer, request, channel)),
            Event::Message {
                message:
                    Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => (request_id, Ok(response)),
            Event::OutboundFailure {
                peer,
                request_id,
                error,
                ..
            } => (request_id, Err(self.outbound_error(peer, error))),
            Event::InboundFailure { peer, error, .. } => {
                self.inbound_failure(peer, error);
                return None;
            }
            Event::ResponseSent { .. } => return None,
        };
        let pending = if blob {
            &mut self.blob_requests
        } else {
            &mut self.requests
        };
        if let Some(reply) = pending.remove(&request_id) {
            let _ = reply.send(result);
        }
        None
    }

    /// Maps a failed request to our error; a peer that answered with an oversize frame is
    /// penalised.
    fn outbound_error(&mut self, peer: PeerId, error: OutboundFailure) -> NetError {
        match error {
            OutboundFailure::DialFailure => {
                NetError::DialFailure(format!("could not connect to {peer}"))
            }
            OutboundFailure::Timeout => NetError::Timeout,
            OutboundFailure::ConnectionClosed => NetError::ConnectionClosed,
            OutboundFailure::UnsupportedProtocols => NetError::UnsupportedProtocol,
            OutboundFailure::Io(e) => match frame_too_large(&e) {
                // Our own requests are checked against the limit before they are queued, so
                // an oversize frame here is the peer's response.
                Some((len, max)) => {
                    let reason = format!("answered with a frame of {len} bytes (limit {max})");
                    self.penalize(peer, self.config.penalty, &reason);
                    NetError::FrameTooLarge { len, max }
                }
                None => NetError::Remote(e.to_string()),
            },
        }
    }

    fn inbound_failure(&mut self, peer: PeerId, error: request_response::InboundFailure) {
        if let request_response::InboundFailure::Io(e) = &error
            && let Some((len, max)) = frame_too_large(e)
        {
            let reason = format!("sent a frame of {len} bytes (limit {max})");
            self.penalize(peer, self.config.penalty, &reason);
            return;
        }
        tracing::debug!(%peer, %error, "inbound request failed");
    }
}
