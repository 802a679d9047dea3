//! Chunked, hash-checked transfer of large blobs over `/neuroshard/blob/1`.
//!
//! A blob is served under its BLAKE3 hash. The fetcher asks for chunk `i` (1 MiB each); every
//! response carries the blob's total length, so the first chunk tells the fetcher how much is
//! coming and lets it refuse blobs above its cap before it downloads them. The rest is fetched a
//! few chunks at a time and the whole blob is checked against the hash at the end.
//!
//! Request: `hash (32) || chunk index (u64 BE)`.
//! Response: `status (u8) || total length (u64 BE) || chunk bytes` with status 0 = ok,
//! 1 = unknown hash, 2 = bad request (malformed or index past the end).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, stream};

use crate::NetError;

/// Bytes per chunk.
pub const CHUNK_SIZE: usize = 1024 * 1024;
/// Chunk requests in flight per fetch.
const PARALLEL_CHUNKS: usize = 4;

pub(crate) const REQUEST_LEN: usize = 32 + 8;
const HEADER_LEN: usize = 1 + 8;
/// Largest response frame of the blob protocol.
pub(crate) const MAX_RESPONSE: usize = HEADER_LEN + CHUNK_SIZE;

const OK: u8 = 0;
const NOT_FOUND: u8 = 1;
const BAD_REQUEST: u8 = 2;

/// Blobs this node serves, by hash.
#[derive(Clone, Default)]
pub(crate) struct BlobStore(Arc<Mutex<Blobs>>);

type Blobs = HashMap<[u8; 32], Arc<Vec<u8>>>;

impl BlobStore {
    pub(crate) fn insert(&self, data: Arc<Vec<u8>>) -> [u8; 32] {
        let hash = *blake3::hash(&data).as_bytes();
        self.lock().insert(hash, data);
        hash
    }

    pub(crate) fn remove(&self, hash: &[u8; 32]) {
        self.lock().remove(hash);
    }

    fn get(&self, hash: &[u8; 32]) -> Option<Arc<Vec<u8>>> {
        self.lock().get(hash).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Blobs> {
        // A panic while holding this lock cannot leave the map half-updated; keep serving.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The response to one chunk request.
    pub(crate) fn serve(&self, request: &[u8]) -> Vec<u8> {
        let Some((hash, index)) = decode_request(request) else {
            return header(BAD_REQUEST, 0);
        };
        let Some(blob) = self.get(&hash) else {
            return header(NOT_FOUND, 0);
        };
        let total = blob.len() as u64;
        let Some(range) = chunk_range(total, index) else {
            return header(BAD_REQUEST, total);
        };
        // chunk_range only returns ranges inside the blob.
        let (start, end) = (range.0 as usize, range.1 as usize);
        let mut out = header(OK, total);
        out.extend_from_slice(&blob[start..end]);
        out
    }
}

fn header(status: u8, total: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.push(status);
    out.extend_from_slice(&total.to_be_bytes());
    out
}

pub(crate) fn encode_request(hash: &[u8; 32], index: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(REQUEST_LEN);
    out.extend_from_slice(hash);
    out.extend_from_slice(&index.to_be_bytes());
    out
}

fn decode_request(bytes: &[u8]) -> Option<([u8; 32], u64)> {
    if bytes.len() != REQUEST_LEN {
        return None;
    }
    let hash: [u8; 32] = bytes[..32].try_into().ok()?;
    let index = u64::from_be_bytes(bytes[32..].try_into().ok()?);
    Some((hash, index))
}

/// Number of chunks of a blob of `total` bytes (an empty blob is one empty chunk).
fn chunk_count(total: u64) -> u64 {
    total.div_ceil(CHUNK_SIZE as u64).max(1)
}

/// Byte range `[start, end)` of chunk `index`, or `None` past the end.
fn chunk_range(total: u64, index: u64) -> Option<(u64, u64)> {
    if index >= chunk_count(total) {
        return None;
    }
    let start = index * CHUNK_SIZE as u64;
    Some((start, start.saturating_add(CHUNK_SIZE as u64).min(total)))
}

/// Checks one response against what chunk `index` must look like; returns the total length
/// and the chunk bytes.
fn decode_response(
    bytes: &[u8],
    index: u64,
    expect_total: Option<u64>,
) -> Result<(u64, &[u8]), NetError> {
    if bytes.len() < HEADER_LEN {
        return Err(NetError::Protocol(
            "blob response shorter than its header".into(),
        ));
    }
    let total = u64::from_be_bytes(bytes[1..HEADER_LEN].try_into().unwrap_or([0; 8]));
    match bytes[0] {
        OK => {}
        NOT_FOUND => return Err(NetError::BlobNotFound),
        BAD_REQUEST => return Err(NetError::Protocol("peer refused the chunk request".into())),
        other => return Err(NetError::Protocol(format!("unknown blob status {other}"))),
    }
    if expect_total.is_some_and(|t| t != total) {
        return Err(NetError::Protocol(
            "blob length changed between chunks".into(),
        ));
    }
    let data = &bytes[HEADER_LEN..];
    let Some((start, end)) = chunk_range(total, index) else {
        return Err(NetError::Protocol("chunk index past the end".into()));
    };
    if data.len() as u64 != end - start {
        return Err(NetError::Protocol(format!(
            "chunk {index} has {} bytes, expected {}",
            data.len(),
            end - start
        )));
    }
    Ok((total, data))
}

/// Fetches a blob with `send` (one chunk request in, its response out), refusing blobs longer
/// than `max_len` before downloading them, and checks the whole blob against `hash`.
pub(crate) async fn fetch<F, Fut>(
    send: F,
    hash: [u8; 32],
    max_len: usize,
) -> Result<Vec<u8>, NetError>
where
    F: Fn(Vec<u8>) -> Fut,
    Fut: Future<Output = Result<Vec<u8>, NetError>>,
{
    let first = send(encode_request(&hash, 0)).await?;
    let (total, data) = decode_response(&first, 0, None)?;
    if total > max_len as u64 {
        return Err(NetError::BlobTooLarge {
            len: total,
            max: max_len,
        });
    }
    // Grow with the chunks actually received: a first response that merely claims `max_len`
    // must not make us allocate it. (total <= max_len, so it fits in usize.)
    let mut out = Vec::with_capacity((total as usize).min(PARALLEL_CHUNKS * CHUNK_SIZE));
    out.extend_from_slice(data);
    drop(first);

    let mut rest = stream::iter(1..chunk_count(total))
        .map(|index| {
            let fut = send(encode_request(&hash, index));
            async move { (index, fut.await) }
        })
        .buffered(PARALLEL_CHUNKS);
    while let Some((index, response)) = rest.next().await {
        let response = response?;
        let (_, data) = decode_response(&response, index, Some(total))?;
        out.extend_from_slice(data);
    }
    if blake3::hash(&out).as_bytes() != &hash {
        return Err(NetError::HashMismatch);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetch_from(store: &BlobStore, hash: [u8; 32], max_len: usize) -> Result<Vec<u8>, NetError> {
        let send = |req: Vec<u8>| {
            let resp = store.serve(&req);
            async move { Ok(resp) }
        };
        futures::executor::block_on(fetch(send, hash, max_len))
    }

    #[test]
    fn fetches_blobs_of_awkward_sizes() {
        let store = BlobStore::default();
        for len in [
            0,
            1,
            CHUNK_SIZE - 1,
            CHUNK_SIZE,
            CHUNK_SIZE + 1,
            3 * CHUNK_SIZE + 17,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let hash = store.insert(Arc::new(data.clone()));
            assert_eq!(fetch_from(&store, hash, len).unwrap(), data, "len {len}");
        }
    }

    #[test]
    fn unknown_too_large_and_tampered() {
        let store = BlobStore::default();
        assert!(matches!(
            fetch_from(&store, [1; 32], 10),
            Err(NetError::BlobNotFound)
        ));
        let hash = store.insert(Arc::new(vec![5; 2 * CHUNK_SIZE]));
        assert!(matches!(
            fetch_from(&store, hash, 2 * CHUNK_SIZE - 1),
            Err(NetError::BlobTooLarge { .. })
        ));
        // A peer serving other bytes under the hash is caught by the whole-blob check.
        let other = store.insert(Arc::new(vec![6; 2 * CHUNK_SIZE]));
        let data = store.get(&other).unwrap();
        store.0.lock().unwrap().insert(hash, data);
        assert!(matches!(
            fetch_from(&store, hash, usize::MAX),
            Err(NetError::HashMismatch)
        ));
        store.remove(&hash);
        assert!(matches!(
            fetch_from(&store, hash, usize::MAX),
            Err(NetError::BlobNotFound)
        ));
    }

    #[test]
    fn malformed_messages_are_errors() {
        let store = BlobStore::default();
        let hash = store.insert(Arc::new(vec![1; 10]));
        assert_eq!(store.serve(&[1, 2, 3])[0], BAD_REQUEST);
        assert_eq!(store.serve(&encode_request(&hash, 1))[0], BAD_REQUEST);
        assert_eq!(
            store.serve(&encode_request(&hash, u64::MAX))[0],
            BAD_REQUEST
        );
        for bad in [vec![], vec![0; 8], vec![9; 9], header(OK, 10)] {
            assert!(decode_response(&bad, 0, None).is_err());
        }
        let mut long = header(OK, 10);
        long.extend_from_slice(&[0; 11]);
        assert!(decode_response(&long, 0, None).is_err());
        assert!(decode_response(&header(OK, u64::MAX), u64::MAX, None).is_err());
    }

    /// A fetch from a peer that answers the i-th chunk request with `responses[i]`.
    fn fetch_scripted(
        responses: &[Vec<u8>],
        hash: [u8; 32],
        max_len: usize,
    ) -> Result<Vec<u8>, NetError> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let send = |_req: Vec<u8>| {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let resp = responses.get(i).cloned().unwrap_or_default();
            async move { Ok(resp) }
        };
        futures::executor::block_on(fetch(send, hash, max_len))
    }

    #[test]
    fn a_claimed_length_is_not_allocated_up_front() {
        // 10 bytes of response claim a 1 GiB blob the cap allows.
        let max = 1 << 30;
        let mut first = header(OK, max as u64);
        first.extend_from_slice(&[0; CHUNK_SIZE]);
        let (result, largest) = neuroshard_mutate::largest_allocation(|| {
            fetch_scripted(&[first.clone()], [3; 32], max)
        });
        assert!(result.is_err());
        assert!(largest <= 8 * CHUNK_SIZE, "{largest} bytes allocated");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// Valid chunk requests and responses of a small and a multi-chunk blob, mutated: the
        /// server answers within one chunk, a fetch returns the blob or an error, and nothing
        /// allocates beyond a few chunks.
        #[test]
        fn mutated_requests_and_responses(
            len in proptest::prop_oneof![0usize..100, (CHUNK_SIZE - 2)..(CHUNK_SIZE + 3)],
            which in 0usize..3,
            m in neuroshard_mutate::mutations(),
        ) {
            let store = BlobStore::default();
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let hash = store.insert(Arc::new(data.clone()));
            let count = chunk_count(len as u64);
            let bad_request = neuroshard_mutate::apply(&encode_request(&hash, count - 1), &m);
            let served = store.serve(&bad_request);
            proptest::prop_assert!(served.len() >= HEADER_LEN);
            proptest::prop_assert!(served.len() <= MAX_RESPONSE);
            if served[0] == OK {
                proptest::prop_assert!(bad_request.starts_with(&hash));
            }
            let mut responses: Vec<Vec<u8>> =
                (0..count).map(|i| store.serve(&encode_request(&hash, i))).collect();
            let i = which % responses.len();
            responses[i] = neuroshard_mutate::apply(&responses[i], &m);
            let (fetched, largest) = neuroshard_mutate::largest_allocation(|| {
                fetch_scripted(&responses, hash, 4 * CHUNK_SIZE)
            });
            proptest::prop_assert!(largest <= 8 * CHUNK_SIZE, "{largest} bytes");
            if let Ok(blob) = fetched {
                proptest::prop_assert_eq!(blob, data);
            }
        }
    }
}
