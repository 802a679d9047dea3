//! The transport's own decoders. First byte 0: a stream of length-prefixed request frames
//! (cap from the second byte); 1: a blob chunk request to a server holding two blobs;
//! 2: a blob fetch whose chunk responses are the frames that follow; otherwise a peer id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_fuzz::net::{BLOB, BLOB_MAX};
use neuroshard_net::fuzzing::{
    fetch_blob, frame_too_large, node_of_peer_bytes, read_frames, serve_blob, write_frame,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode {
        0 => {
            let Some((&cap, stream)) = rest.split_first() else {
                return;
            };
            let max = usize::from(cap) * 16;
            let mut used = 0;
            for frame in read_frames(stream, max) {
                match frame {
                    Ok(f) => {
                        assert!(f.len() <= max);
                        let wire = write_frame(&f, max).ok();
                        assert_eq!(wire.as_deref(), stream.get(used..used + 4 + f.len()));
                        used += 4 + f.len();
                    }
                    Err(e) => {
                        if let Some((len, m)) = frame_too_large(&e) {
                            assert!(len > m && m == max);
                        }
                    }
                }
            }
        }
        1 => {
            let (hashes, response) = serve_blob(&[BLOB.to_vec(), Vec::new()], rest);
            assert!(response.len() >= 9);
            if response[0] == 0 {
                // Only known blobs are served, one chunk at most.
                assert!(hashes.iter().any(|h| rest.starts_with(h)));
                assert!(response.len() - 9 <= neuroshard_net::CHUNK_SIZE);
            }
        }
        2 => {
            let responses: Vec<Vec<u8>> = read_frames(rest, usize::MAX)
                .into_iter()
                .map_while(Result::ok)
                .collect();
            let hash = *blake3::hash(BLOB).as_bytes();
            if let Ok(blob) = fetch_blob(&responses, hash, BLOB_MAX) {
                assert_eq!(blob, BLOB);
            }
        }
        _ => {
            let _ = node_of_peer_bytes(rest);
        }
    }
});
