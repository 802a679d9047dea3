//! Outer-state and AdamW blobs a joining replica fetches from a peer. First byte even: an
//! outer state (θ₀, velocity, previous aggregate); odd: AdamW moments. An accepted blob
//! re-encodes to its input and holds only finite values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_fuzz::node::{PARAMS, diloco_config};
use neuroshard_model::AdamWConfig;
use neuroshard_node::replica::{Diloco, decode_adamw, encode_adamw, outer_theta};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let len = PARAMS.numel();
    if mode % 2 == 0 {
        let head = outer_theta(rest, len);
        if let Ok((_, theta)) = &head {
            assert_eq!(theta.len(), len);
            assert!(theta.iter().all(|x| x.is_finite()));
        }
        let Some(cfg) = diloco_config(if mode % 4 == 0 { "mean" } else { "median" }) else {
            return;
        };
        if let Ok(replica) = Diloco::restore(cfg, rest, len) {
            assert!(head.is_ok());
            assert_eq!(replica.outer_bytes(), rest);
            assert!(replica.theta().iter().all(|x| x.is_finite()));
        }
    } else if let Ok(opt) = decode_adamw(rest, AdamWConfig::default(), &PARAMS) {
        assert_eq!(encode_adamw(&opt), rest);
        let (m, v) = opt.moments();
        assert!(m.iter().chain(v).flatten().all(|x| x.is_finite()));
    }
});
