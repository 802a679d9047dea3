//! Loader, batches, assignment, single-shard inclusion proofs and the synthetic loss floor.

mod common;

use std::collections::HashMap;

use common::{build_ok, small_synthetic, synthetic_opts};
use neuroshard_data::{
    DataError, Genesis, HexHash, MarkovSource, SignedManifest, Split, assign, batch_token_hash,
    rotate, rotation_window, verify_shard_inclusion,
};

#[test]
fn windows_are_slices_of_the_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let g = Genesis::open(&small_synthetic(tmp.path())).unwrap();
    let seq = 32;
    for split in [Split::Train, Split::Val] {
        assert!(g.shard_count(split) >= 1);
        for s in 0..g.shard_count(split) {
            let all = g.shard_tokens(split, s).unwrap();
            let n = g.windows_per_shard(split, seq)[s];
            assert_eq!(n, (all.len() as u64 - 1) / seq as u64);
            for w in [0, n / 2, n - 1] {
                let win = g.window(split, s, w, seq).unwrap();
                let at = w as usize * seq;
                assert_eq!(win, all[at..at + seq + 1]);
            }
            assert!(matches!(
                g.window(split, s, n, seq),
                Err(DataError::NoSuchWindow { .. })
            ));
        }
    }
    assert!(matches!(
        g.window(Split::Val, 99, 0, seq),
        Err(DataError::NoSuchShard { .. })
    ));
    assert!(g.vocab_size() > 259);
    assert!(g.tokenizer_path().ends_with("tokenizer.json"));
    assert!(g.tokenizer_path().is_file());
}

#[test]
fn batches_are_deterministic_and_shifted() {
    let tmp = tempfile::tempdir().unwrap();
    let g = Genesis::open(&small_synthetic(tmp.path())).unwrap();
    let (rows, seq) = (4, 16);
    let b = g.batch(Split::Train, 7, 3, rows, seq).unwrap();
    assert_eq!(b, g.batch(Split::Train, 7, 3, rows, seq).unwrap());
    assert_ne!(
        b.token_hash,
        g.batch(Split::Train, 7, 4, rows, seq).unwrap().token_hash
    );
    assert_ne!(
        b.token_hash,
        g.batch(Split::Train, 8, 3, rows, seq).unwrap().token_hash
    );
    assert_eq!(
        (b.inputs.len(), b.targets.len(), b.rows),
        (rows * seq, rows * seq, rows)
    );
    let mut windows = Vec::new();
    for (r, w) in b.windows.iter().enumerate() {
        let win = g.window(w.split, w.shard, w.window, seq).unwrap();
        assert_eq!(b.inputs[r * seq..(r + 1) * seq], win[..seq]);
        assert_eq!(b.targets[r * seq..(r + 1) * seq], win[1..]);
        windows.push(win);
    }
    // The commitment is recomputable from the windows alone.
    assert_eq!(
        b.token_hash,
        batch_token_hash(seq, windows.iter().map(Vec::as_slice))
    );
    assert!(matches!(
        g.batch(Split::Train, 0, 0, 0, seq),
        Err(DataError::BadShape { .. })
    ));
}

#[test]
fn train_batches_follow_the_assignment() {
    let tmp = tempfile::tempdir().unwrap();
    let g = Genesis::open(&small_synthetic(tmp.path())).unwrap();
    let seq = 16;
    let node = [42u8; 32];
    let a = g.assign(&node, 5, seq).unwrap();
    let layout = g.windows_per_shard(Split::Train, seq);
    assert_eq!(Some(a), assign(&g.root(), &node, 5, &layout));
    let b = g.train_batch(&node, 5, 0, 4, seq).unwrap();
    assert_eq!(b, g.train_batch(&node, 5, 0, 4, seq).unwrap());
    assert!(
        b.windows
            .iter()
            .all(|w| w.shard == a.shard && w.split == Split::Train)
    );
    assert_eq!(b.windows[0].window, a.window);
    let next = g.train_batch(&node, 5, 1, 4, seq).unwrap();
    assert_eq!(next.windows[0].window, (a.window + 1) % layout[a.shard]);
    // Other nodes and rounds land elsewhere (not all on this one window).
    let spots: std::collections::HashSet<_> = (0..20u8)
        .map(|n| g.assign(&[n; 32], 5, seq).unwrap())
        .chain((0..20).map(|r| g.assign(&node, r, seq).unwrap()))
        .collect();
    assert!(
        spots.len() > 30,
        "only {} distinct assignments",
        spots.len()
    );
}

#[test]
fn validation_batches_walk_the_split_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let g = Genesis::open(&small_synthetic(tmp.path())).unwrap();
    let seq = 64;
    let per_shard = g.windows_per_shard(Split::Val, seq);
    let total: u64 = per_shard.iter().sum();
    let all = g.val_batches(5, seq, usize::MAX).unwrap();
    assert_eq!(all.iter().map(|b| b.rows as u64).sum::<u64>(), total);
    assert!(all[..all.len() - 1].iter().all(|b| b.rows == 5));
    let order: Vec<_> = all.iter().flat_map(|b| b.windows.clone()).collect();
    let mut expected = Vec::new();
    for (s, &n) in per_shard.iter().enumerate() {
        for w in 0..n {
            expected.push((s, w));
        }
    }
    assert_eq!(
        order
            .iter()
            .map(|w| (w.shard, w.window))
            .collect::<Vec<_>>(),
        expected
    );
    let capped = g.val_batches(5, seq, 2).unwrap();
    assert_eq!(capped.len(), 2);
    assert_eq!(capped[..], all[..2]);
    assert_eq!(all, g.val_batches(5, seq, usize::MAX).unwrap());
}

#[test]
fn a_peer_with_only_its_shard_can_prove_inclusion() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_synthetic(tmp.path());
    let g = Genesis::open(&dir).unwrap();
    let root = HexHash(g.root());
    for split in [Split::Train, Split::Val] {
        for s in 0..g.shard_count(split) {
            let inclusion = g.shard_inclusion(split, s).unwrap();
            // The peer's whole world: one shard file, the proof (as JSON) and the root.
            let lonely = tmp.path().join(format!("peer-{split}-{s}"));
            std::fs::create_dir(&lonely).unwrap();
            std::fs::copy(g.shard_path(split, s).unwrap(), lonely.join("shard.bin")).unwrap();
            let wire = serde_json::to_string(&inclusion).unwrap();
            let bytes = std::fs::read(lonely.join("shard.bin")).unwrap();
            let proof = serde_json::from_str(&wire).unwrap();
            verify_shard_inclusion(&bytes, &proof, &root).unwrap();
            // A flipped byte or another root fails.
            let mut bad = bytes.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            assert!(verify_shard_inclusion(&bad, &proof, &root).is_err());
            assert!(verify_shard_inclusion(&bytes, &proof, &HexHash([0; 32])).is_err());
        }
    }
    // A shard cannot claim another shard's place.
    let a = g.shard_inclusion(Split::Train, 0).unwrap();
    let other = std::fs::read(g.shard_path(Split::Train, 1).unwrap()).unwrap();
    assert!(verify_shard_inclusion(&other, &a, &root).is_err());
}

/// The manifest's floor is the true entropy rate per model token: the shards' mean negative
/// log-likelihood under the generating chain and the plug-in conditional entropy of the
/// token stream given the two previous tokens both match it.
#[test]
fn synthetic_floor_matches_the_token_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("floor");
    let signed: SignedManifest = build_ok(&synthetic_opts(&out, 300_000, 1 << 20));
    let m = &signed.manifest;
    let cfg = m.params.synthetic.unwrap();
    let floor = m.entropy_floor.unwrap().nats_per_token;
    let g = Genesis::open(&out).unwrap();
    assert_eq!(g.entropy_floor(), Some(floor));
    // Learnable: far below a uniform guess over the vocabulary.
    assert!(floor < 0.5 * (g.vocab_size() as f64).ln(), "floor {floor}");

    let src = MarkovSource::new(cfg).unwrap();
    let eos = g.tokenizer().eos_id();
    let word_of: HashMap<u32, u32> = src
        .words()
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let ids = g.tokenizer().encode(&format!(" {w}")).unwrap();
            assert_eq!(ids.len(), 1, "word {w:?} is {} tokens", ids.len());
            (ids[0], i as u32)
        })
        .collect();
    let mut stream = Vec::new();
    for s in 0..g.shard_count(Split::Train) {
        stream.extend(g.shard_tokens(Split::Train, s).unwrap());
    }

    // Mean NLL under the true model.
    let (mut nll, mut older, mut newer) = (0.0f64, src.start(), src.start());
    for &t in &stream {
        let sym = if t == eos { None } else { Some(word_of[&t]) };
        let p = src
            .next_distribution(older, newer)
            .iter()
            .find(|x| x.0 == sym)
            .map(|x| x.1)
            .unwrap_or_else(|| panic!("token {t} impossible in context ({older}, {newer})"));
        nll -= p.ln();
        match sym {
            Some(w) => (older, newer) = (newer, w),
            None => (older, newer) = (src.start(), src.start()),
        }
    }
    let mean = nll / stream.len() as f64;
    assert!((mean - floor).abs() < 0.02, "NLL {mean} vs floor {floor}");

    // Plug-in H(X_t | X_{t-2}, X_{t-1}) from counts (biased slightly low by the number of
    // contexts, hence the looser bound).
    let mut counts: HashMap<(u32, u32), HashMap<u32, u64>> = HashMap::new();
    for w in stream.windows(3) {
        *counts
            .entry((w[0], w[1]))
            .or_default()
            .entry(w[2])
            .or_default() += 1;
    }
    let n = (stream.len() - 2) as f64;
    let mut h = 0.0;
    for next in counts.values() {
        let c: u64 = next.values().sum();
        for &k in next.values() {
            h -= k as f64 / n * (k as f64 / c as f64).ln();
        }
    }
    assert!((h - floor).abs() < 0.06, "plug-in {h} vs floor {floor}");
}

#[test]
fn rotated_batches_split_the_shards_among_drivers_and_rotate() {
    let tmp = tempfile::tempdir().unwrap();
    let g = Genesis::open(&small_synthetic(tmp.path())).unwrap();
    let seq = 16;
    let layout = g.windows_per_shard(Split::Train, seq);
    let shards = layout.iter().filter(|&&w| w > 0).count();
    assert!(
        shards >= 2,
        "the fixture needs two train shards, has {layout:?}"
    );
    let drivers: Vec<[u8; 32]> = (0..shards as u8).map(|n| [n; 32]).collect();
    for round in 0..shards as u64 {
        let mut used = std::collections::HashSet::new();
        for d in &drivers {
            let b = g
                .rotated_train_batch(&drivers, d, round, 7, 4, seq)
                .unwrap();
            assert_eq!(
                b,
                g.rotated_train_batch(&drivers, d, round, 7, 4, seq)
                    .unwrap()
            );
            let rot = rotate(&g.root(), &drivers, d, round, &layout).unwrap();
            assert!(b.windows.iter().all(|w| w.shard == rot.shard));
            assert!(
                used.insert(rot.shard),
                "round {round}: shard {} twice",
                rot.shard
            );
            for (r, w) in b.windows.iter().enumerate() {
                let want = rotation_window(&rot, layout[rot.shard], 7, r as u64, 4).unwrap();
                assert_eq!(w.window, want);
                assert_eq!(
                    &b.inputs[r * seq..(r + 1) * seq],
                    &g.window(Split::Train, w.shard, w.window, seq).unwrap()[..seq]
                );
            }
        }
    }
    assert!(matches!(
        g.rotated_train_batch(&drivers, &[200; 32], 0, 0, 4, seq),
        Err(DataError::NotADriver { count, .. }) if count == shards
    ));
    assert!(matches!(
        g.rotated_train_batch(&drivers, &drivers[0], 0, 0, 0, seq),
        Err(DataError::BadShape { .. })
    ));
}
