//! Entry points for the fuzz targets in `fuzz/` into this crate's private decoders: request
//! frames, blob chunk requests and responses, and the key inlined in a peer id. Built only
//! with the `fuzzing` feature; nothing in the node uses it.

use std::io;
use std::sync::Arc;

use futures::io::Cursor;
use libp2p::request_response::Codec;
use libp2p::{PeerId, StreamProtocol};

use crate::NetError;
use crate::blob::{self, BlobStore};
use crate::codec::{FrameCodec, TrafficCounter};

/// Reads request frames from `stream` as a peer's stream would deliver them, each capped at
/// `max` bytes, until the bytes run out or a frame is refused.
pub fn read_frames(stream: &[u8], max: usize) -> Vec<io::Result<Vec<u8>>> {
    let mut codec = FrameCodec::new(max, max, Arc::new(TrafficCounter::default()));
    let proto = StreamProtocol::new("/neuroshard/fuzz/1");
    let mut io = Cursor::new(stream);
    let mut out = Vec::new();
    futures::executor::block_on(async {
        while (io.position() as usize) < stream.len() {
            let frame = codec.read_request(&proto, &mut io).await;
            let stop = frame.is_err();
            out.push(frame);
            if stop {
                break;
            }
        }
    });
    out
}

/// Writes `data` as one frame capped at `max` bytes.
pub fn write_frame(data: &[u8], max: usize) -> io::Result<Vec<u8>> {
    let mut codec = FrameCodec::new(max, max, Arc::new(TrafficCounter::default()));
    let proto = StreamProtocol::new("/neuroshard/fuzz/1");
    let mut io = Cursor::new(Vec::new());
    futures::executor::block_on(codec.write_request(&proto, &mut io, data.to_vec()))?;
    Ok(io.into_inner())
}

/// `(len, max)` when the error is an oversize frame.
pub fn frame_too_large(err: &io::Error) -> Option<(usize, usize)> {
    crate::codec::frame_too_large(err)
}

/// A blob server holding `blobs`; returns their hashes and its answer to `request`.
pub fn serve_blob(blobs: &[Vec<u8>], request: &[u8]) -> (Vec<[u8; 32]>, Vec<u8>) {
    let store = BlobStore::default();
    let hashes = blobs
        .iter()
        .map(|b| store.insert(Arc::new(b.clone())))
        .collect();
    (hashes, store.serve(request))
}

/// The chunk request for chunk `index` of the blob `hash`.
pub fn blob_request(hash: &[u8; 32], index: u64) -> Vec<u8> {
    blob::encode_request(hash, index)
}

/// Fetches the blob `hash` (at most `max_len` bytes) from a peer that answers the i-th chunk
/// request with `responses[i]` (and with an empty frame once they run out).
pub fn fetch_blob(
    responses: &[Vec<u8>],
    hash: [u8; 32],
    max_len: usize,
) -> Result<Vec<u8>, NetError> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let send = |_request: Vec<u8>| {
        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let response = responses.get(i).cloned().unwrap_or_default();
        async move { Ok(response) }
    };
    futures::executor::block_on(blob::fetch(send, hash, max_len))
}

/// The node id of a peer id read from the wire (`None` when it inlines no secp256k1 key).
pub fn node_of_peer_bytes(bytes: &[u8]) -> Option<crate::NodeId> {
    let peer = PeerId::from_bytes(bytes).ok()?;
    crate::ids::node_of(&peer)
}

/// The peer id bytes of a compressed secp256k1 key (to seed the peer-id target).
pub fn peer_bytes_of(public_key: &[u8; 33]) -> Result<Vec<u8>, NetError> {
    Ok(crate::ids::peer_id_of(public_key)?.to_bytes())
}
