//! Where the embedding stage's tokens came from. A replay only shows that a job's outputs
//! follow from its inputs; a driver that trains on text of its own choosing (a backdoor, a
//! poisoned corpus) passes it. So the first stage commits, with its tokens, the genesis
//! window each row was read from ([`GenesisTokens`]; the input hash binds both), and anyone
//! holding the genesis dataset checks the rows against those windows ([`check_provenance`]).
//! Every node holds it: the network is named by its genesis.

use neuroshard_proof::{CodecError, Hash32, Reader, Writer};

use crate::tensor::{JobInputs, StageData, TokenIds, UpstreamData};

/// A genesis training window, as the data crate names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRef {
    pub shard: u32,
    pub window: u64,
}

/// The first stage's tokens with the genesis window of each row (row `i`: window `i`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenesisTokens {
    pub tokens: TokenIds,
    pub windows: Vec<WindowRef>,
}

impl GenesisTokens {
    /// The tokens' input hash extended by the window names, under a domain of its own.
    pub fn hash(&self) -> Hash32 {
        let mut h = blake3::Hasher::new();
        h.update(b"neuroshard/audit/genesis-tokens");
        h.update(&self.tokens.hash("tokens"));
        h.update(&(self.windows.len() as u64).to_le_bytes());
        for w in &self.windows {
            h.update(&w.shard.to_le_bytes());
            h.update(&w.window.to_le_bytes());
        }
        *h.finalize().as_bytes()
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        self.tokens.encode(w);
        w.len(self.windows.len());
        for win in &self.windows {
            w.u32(win.shard);
            w.u64(win.window);
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let tokens = TokenIds::decode(r)?;
        // One window per row: more is malformed, and bounded by the rows already read.
        let n = r.len(tokens.batch as usize)?;
        if n != tokens.batch as usize {
            return Err(CodecError::Invalid {
                field: "genesis windows",
                reason: format!("{n} windows for {} rows", tokens.batch),
            });
        }
        let windows = (0..n)
            .map(|_| {
                Ok(WindowRef {
                    shard: r.u32()?,
                    window: r.u64()?,
                })
            })
            .collect::<Result<_, CodecError>>()?;
        Ok(Self { tokens, windows })
    }
}

/// The genesis dataset's training text, as a checker reads it.
pub trait GenesisText {
    /// The `seq + 1` tokens of training window `window` of shard `shard` (a row's inputs are
    /// the first `seq`, its targets the last `seq`); None when there is no such window.
    fn window(&self, shard: u32, window: u64, seq: u32) -> Option<Vec<u32>>;
}

/// Why a first-stage job's tokens are not the genesis text they name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvenanceError {
    #[error("the first stage's input names no genesis windows")]
    Unnamed,
    #[error("{windows} genesis windows named for {rows} rows")]
    Count { windows: usize, rows: u32 },
    #[error("genesis window {shard}:{window} does not exist")]
    NoSuchWindow { shard: u32, window: u64 },
    #[error("row {row}'s {what} differ from genesis window {shard}:{window}")]
    Differs {
        row: usize,
        what: &'static str,
        shard: u32,
        window: u64,
    },
}

/// Checks that a first-stage job's input rows (and its targets, when the stage is also the
/// last) are the genesis windows they name. Which windows a driver should have read is not
/// checked: that depends on the driver set it saw.
pub fn check_provenance(inputs: &JobInputs, text: &dyn GenesisText) -> Result<(), ProvenanceError> {
    let StageData::Genesis(g) = &inputs.input else {
        return Err(ProvenanceError::Unnamed);
    };
    let (rows, seq) = (g.tokens.batch, g.tokens.seq);
    if g.windows.len() != rows as usize {
        return Err(ProvenanceError::Count {
            windows: g.windows.len(),
            rows,
        });
    }
    let targets = match &inputs.upstream {
        UpstreamData::Targets(t) => Some(t),
        _ => None,
    };
    let width = seq as usize;
    for (row, w) in g.windows.iter().enumerate() {
        let text = text
            .window(w.shard, w.window, seq)
            .filter(|t| t.len() == width + 1)
            .ok_or(ProvenanceError::NoSuchWindow {
                shard: w.shard,
                window: w.window,
            })?;
        let span = row * width..(row + 1) * width;
        let differs = |what| ProvenanceError::Differs {
            row,
            what,
            shard: w.shard,
            window: w.window,
        };
        if g.tokens.ids.get(span.clone()) != Some(&text[..width]) {
            return Err(differs("inputs"));
        }
        if let Some(t) = targets
            && t.ids.get(span) != Some(&text[1..])
        {
            return Err(differs("targets"));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Window `w` of shard `s` is `s·1000 + w + i` for `i` in `0..=seq` (windows 0..100).
    pub struct Counting;

    impl GenesisText for Counting {
        fn window(&self, shard: u32, window: u64, seq: u32) -> Option<Vec<u32>> {
            (window < 100).then(|| {
                (0..=seq)
                    .map(|i| shard * 1000 + window as u32 + i)
                    .collect()
            })
        }
    }

    /// Honest first-stage inputs over the named windows (with targets when `last`).
    pub fn genesis_inputs(windows: &[(u32, u64)], seq: u32, last: bool) -> JobInputs {
        let rows: Vec<Vec<u32>> = windows
            .iter()
            .map(|&(s, w)| Counting.window(s, w, seq).unwrap())
            .collect();
        let ids = |from: usize| -> Vec<u32> {
            rows.iter()
                .flat_map(|r| r[from..from + seq as usize].to_vec())
                .collect()
        };
        let tokens = |ids| TokenIds {
            batch: windows.len() as u32,
            seq,
            ids,
        };
        JobInputs {
            input: StageData::Genesis(GenesisTokens {
                tokens: tokens(ids(0)),
                windows: windows
                    .iter()
                    .map(|&(shard, window)| WindowRef { shard, window })
                    .collect(),
            }),
            upstream: if last {
                UpstreamData::Targets(tokens(ids(1)))
            } else {
                UpstreamData::None
            },
        }
    }

    #[test]
    fn genesis_rows_pass_and_any_other_text_fails() {
        let honest = genesis_inputs(&[(1, 5), (2, 7)], 4, true);
        assert_eq!(check_provenance(&honest, &Counting), Ok(()));

        let mut other = honest.clone();
        if let StageData::Genesis(g) = &mut other.input {
            g.tokens.ids[5] += 1;
        }
        assert!(matches!(
            check_provenance(&other, &Counting),
            Err(ProvenanceError::Differs {
                row: 1,
                what: "inputs",
                ..
            })
        ));

        let mut targets = honest.clone();
        if let UpstreamData::Targets(t) = &mut targets.upstream {
            t.ids[0] = 0;
        }
        assert!(matches!(
            check_provenance(&targets, &Counting),
            Err(ProvenanceError::Differs {
                row: 0,
                what: "targets",
                ..
            })
        ));

        let mut renamed = honest.clone();
        if let StageData::Genesis(g) = &mut renamed.input {
            g.windows[0].window = 6;
        }
        assert!(check_provenance(&renamed, &Counting).is_err());

        let mut missing = honest.clone();
        if let StageData::Genesis(g) = &mut missing.input {
            g.windows[0].window = 500;
        }
        assert_eq!(
            check_provenance(&missing, &Counting),
            Err(ProvenanceError::NoSuchWindow {
                shard: 1,
                window: 500
            })
        );
    }

    #[test]
    fn unnamed_tokens_fail() {
        let g = genesis_inputs(&[(0, 1)], 3, false);
        let StageData::Genesis(gt) = g.input else {
            unreachable!()
        };
        let plain = JobInputs {
            input: StageData::Tokens(gt.tokens),
            upstream: UpstreamData::None,
        };
        assert_eq!(
            check_provenance(&plain, &Counting),
            Err(ProvenanceError::Unnamed)
        );
    }

    #[test]
    fn the_hash_binds_the_window_names() {
        let a = genesis_inputs(&[(1, 5)], 4, false);
        let mut b = a.clone();
        if let StageData::Genesis(g) = &mut b.input {
            g.windows[0].window = 6;
        }
        assert_ne!(a.input.hash(), b.input.hash());
        let StageData::Genesis(g) = &a.input else {
            unreachable!()
        };
        assert_ne!(a.input.hash(), StageData::Tokens(g.tokens.clone()).hash());
    }

    #[test]
    fn codec_round_trips_and_refuses_a_window_count_other_than_the_rows() {
        let a = genesis_inputs(&[(1, 5), (3, 9)], 4, false);
        let StageData::Genesis(g) = &a.input else {
            unreachable!()
        };
        let mut w = Writer::new();
        g.encode(&mut w);
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        assert_eq!(&GenesisTokens::decode(&mut r).unwrap(), g);

        let mut short = g.clone();
        short.windows.pop();
        let mut w = Writer::new();
        short.encode(&mut w);
        let bytes = w.into_bytes();
        assert!(GenesisTokens::decode(&mut Reader::new(&bytes)).is_err());
    }
}
