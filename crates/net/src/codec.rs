//! Length-prefixed frames for the request-response protocols, with a size cap checked before
//! anything is allocated or sent, and byte counters per protocol.
//!
//! Wire format of one request or response: a 4-byte big-endian length, then that many bytes.
//! Each stream carries exactly one request and one response.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::prelude::*;
use libp2p::StreamProtocol;
use libp2p::request_response;
use serde::{Deserialize, Serialize};

/// Bytes and messages moved by one protocol.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Traffic {
    pub sent_bytes: u64,
    pub received_bytes: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
}

/// Snapshot of the traffic counters. Request and blob bytes are counted on the wire (frame
/// headers included); gossip bytes are message payloads (published once, received per copy).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    pub gossip: Traffic,
    pub request: Traffic,
    pub blob: Traffic,
    /// Kademlia queries started (puts, gets, provider announcements and lookups, bootstraps).
    pub kad_queries: u64,
    /// Gossip messages published while no peer was subscribed (sent to nobody).
    pub gossip_no_peers: u64,
    /// Events dropped because the application's event queue was full.
    pub events_dropped: u64,
    /// Gossip messages ignored because their author was over its rate.
    pub gossip_over_rate: u64,
    /// Inbound requests dropped because their peer was over its rate.
    pub requests_over_rate: u64,
    /// DHT provider entries refused by the provider validator (stored or found).
    pub providers_refused: u64,
}

impl Counters {
    /// Bytes this node sent, all protocols together.
    pub fn sent_bytes(&self) -> u64 {
        self.request.sent_bytes + self.gossip.sent_bytes + self.blob.sent_bytes
    }

    /// Bytes this node received, all protocols together.
    pub fn received_bytes(&self) -> u64 {
        self.request.received_bytes + self.gossip.received_bytes + self.blob.received_bytes
    }
}

/// Live counters of one protocol.
#[derive(Default, Debug)]
pub(crate) struct TrafficCounter {
    sent_bytes: AtomicU64,
    received_bytes: AtomicU64,
    messages_sent: AtomicU64,
    messages_received: AtomicU64,
}

impl TrafficCounter {
    pub(crate) fn sent(&self, bytes: usize) {
        self.sent_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.messages_sent.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn received(&self, bytes: usize) {
        self.received_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.messages_received.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Traffic {
        Traffic {
            sent_bytes: self.sent_bytes.load(Ordering::Relaxed),
            received_bytes: self.received_bytes.load(Ordering::Relaxed),
            messages_sent: self.messages_sent.load(Ordering::Relaxed),
            messages_received: self.messages_received.load(Ordering::Relaxed),
        }
    }
}

/// All live counters, shared by the handle, the swarm task and the codecs.
#[derive(Default, Debug)]
pub(crate) struct CounterSet {
    pub gossip: TrafficCounter,
    pub request: Arc<TrafficCounter>,
    pub blob: Arc<TrafficCounter>,
    pub kad_queries: AtomicU64,
    pub gossip_no_peers: AtomicU64,
    pub events_dropped: AtomicU64,
    pub gossip_over_rate: AtomicU64,
    pub requests_over_rate: AtomicU64,
    pub providers_refused: AtomicU64,
}

impl CounterSet {
    pub(crate) fn snapshot(&self) -> Counters {
        Counters {
            gossip: self.gossip.snapshot(),
            request: self.request.snapshot(),
            blob: self.blob.snapshot(),
            kad_queries: self.kad_queries.load(Ordering::Relaxed),
            gossip_no_peers: self.gossip_no_peers.load(Ordering::Relaxed),
            events_dropped: self.events_dropped.load(Ordering::Relaxed),
            gossip_over_rate: self.gossip_over_rate.load(Ordering::Relaxed),
            requests_over_rate: self.requests_over_rate.load(Ordering::Relaxed),
            providers_refused: self.providers_refused.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The error carried inside `io::Error` when a frame is over the limit, so that the swarm task
/// can tell it apart from other stream failures (see [`frame_too_large`]).
#[derive(Debug, thiserror::Error)]
#[error("frame of {len} bytes exceeds the limit of {max} bytes")]
pub(crate) struct OversizeFrame {
    pub len: usize,
    pub max: usize,
}

/// `Some((len, max))` if the error is an oversize frame refused by a codec.
pub(crate) fn frame_too_large(err: &io::Error) -> Option<(usize, usize)> {
    err.get_ref()
        .and_then(|inner| inner.downcast_ref::<OversizeFrame>())
        .map(|o| (o.len, o.max))
}

fn oversize(len: usize, max: usize) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, OversizeFrame { len, max })
}

/// Request-response codec of opaque byte frames with separate caps for requests and responses.
#[derive(Clone, Debug)]
pub(crate) struct FrameCodec {
    max_request: usize,
    max_response: usize,
    traffic: Arc<TrafficCounter>,
}

impl FrameCodec {
    pub(crate) fn new(
        max_request: usize,
        max_response: usize,
        traffic: Arc<TrafficCounter>,
    ) -> Self {
        // The length prefix is 32 bits.
        let cap = u32::MAX as usize;
        FrameCodec {
            max_request: max_request.min(cap),
            max_response: max_response.min(cap),
            traffic,
        }
    }

    async fn read_frame<T>(&self, io: &mut T, max: usize) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        let mut header = [0u8; 4];
        io.read_exact(&mut header).await?;
        let len = u32::from_be_bytes(header) as usize;
        if len > max {
            return Err(oversize(len, max));
        }
        // Grow with the data actually received, so a lying header cannot make us allocate.
        let mut buf = Vec::with_capacity(len.min(64 * 1024));
        (&mut *io).take(len as u64).read_to_end(&mut buf).await?;
        if buf.len() != len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("frame ended after {} of {len} bytes", buf.len()),
            ));
        }
        self.traffic.received(4 + len);
        Ok(buf)
    }

    async fn write_frame<T>(&self, io: &mut T, data: &[u8], max: usize) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        if data.len() > max {
            return Err(oversize(data.len(), max));
        }
        // `max` is at most u32::MAX, so the length fits.
        let header = (data.len() as u32).to_be_bytes();
        io.write_all(&header).await?;
        io.write_all(data).await?;
        io.flush().await?;
        self.traffic.sent(4 + data.len());
        Ok(())
    }
}

impl request_response::Codec for FrameCodec {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        self.read_frame(io, self.max_request).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        self.read_frame(io, self.max_response).await
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        self.write_frame(io, &req, self.max_request).await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        res: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        self.write_frame(io, &res, self.max_response).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::io::Cursor;
    use request_response::Codec;

    fn codec(max: usize) -> FrameCodec {
        FrameCodec::new(max, max, Arc::new(TrafficCounter::default()))
    }

    fn proto() -> StreamProtocol {
        StreamProtocol::new("/test/1")
    }

    #[test]
    fn round_trip_and_counts() {
        futures::executor::block_on(async {
            let mut c = codec(16);
            let mut buf = Cursor::new(Vec::new());
            c.write_request(&proto(), &mut buf, b"hello".to_vec())
                .await
                .unwrap();
            assert_eq!(buf.get_ref().len(), 9);
            buf.set_position(0);
            let got = c.read_request(&proto(), &mut buf).await.unwrap();
            assert_eq!(got, b"hello");
            let t = c.traffic.snapshot();
            assert_eq!((t.sent_bytes, t.received_bytes), (9, 9));
            assert_eq!((t.messages_sent, t.messages_received), (1, 1));
        });
    }

    #[test]
    fn oversize_refused_both_ways() {
        futures::executor::block_on(async {
            let mut c = codec(4);
            let mut buf = Cursor::new(Vec::new());
            let err = c
                .write_request(&proto(), &mut buf, vec![0; 5])
                .await
                .unwrap_err();
            assert_eq!(frame_too_large(&err), Some((5, 4)));
            assert!(buf.get_ref().is_empty());
            // A header claiming 4 GiB is refused before any allocation.
            let mut buf = Cursor::new(vec![0xff, 0xff, 0xff, 0xff, 1, 2]);
            let err = c.read_response(&proto(), &mut buf).await.unwrap_err();
            assert_eq!(frame_too_large(&err), Some((u32::MAX as usize, 4)));
        });
    }

    /// Reads request frames until the stream ends or one is refused.
    fn read_all(c: &mut FrameCodec, stream: &[u8]) -> Vec<io::Result<Vec<u8>>> {
        let mut buf = Cursor::new(stream);
        let mut out = Vec::new();
        futures::executor::block_on(async {
            while (buf.position() as usize) < stream.len() {
                let frame = c.read_request(&proto(), &mut buf).await;
                let stop = frame.is_err();
                out.push(frame);
                if stop {
                    break;
                }
            }
        });
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// A stream of valid frames, mutated: every frame read is within the cap and is the
        /// bytes that followed its header; a refused header is over the cap; a length field
        /// claiming more than arrived allocates no more than arrived (plus one read buffer).
        #[test]
        fn mutated_frame_streams(
            frames in proptest::collection::vec(proptest::collection::vec(0u8..=255, 0..300), 1..4),
            cap in 1usize..400,
            m in neuroshard_mutate::mutations(),
        ) {
            let mut c = codec(cap);
            let mut stream = Cursor::new(Vec::new());
            futures::executor::block_on(async {
                for f in &frames {
                    let _ = c.write_request(&proto(), &mut stream, f.clone()).await;
                }
            });
            let bad = neuroshard_mutate::apply(stream.get_ref(), &m);
            let (read, largest) = neuroshard_mutate::largest_allocation(|| read_all(&mut c, &bad));
            proptest::prop_assert!(largest <= 2 * bad.len() + 64 * 1024, "{largest} bytes");
            let mut at = 0;
            for frame in read {
                match frame {
                    Ok(f) => {
                        proptest::prop_assert!(f.len() <= cap);
                        proptest::prop_assert_eq!(&bad[at + 4..at + 4 + f.len()], &f[..]);
                        at += 4 + f.len();
                    }
                    Err(e) => {
                        if let Some((len, max)) = frame_too_large(&e) {
                            proptest::prop_assert!(len > max && max == cap);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn truncated_frames_are_errors() {
        futures::executor::block_on(async {
            let mut c = codec(100);
            for bytes in [vec![], vec![0, 0], vec![0, 0, 0, 10, 1, 2, 3]] {
                let mut buf = Cursor::new(bytes);
                let err = c.read_request(&proto(), &mut buf).await.unwrap_err();
                assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
                assert_eq!(frame_too_large(&err), None);
            }
        });
    }
}
