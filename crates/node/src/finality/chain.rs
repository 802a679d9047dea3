//! Finalized epochs between nodes: a node behind checks what a peer serves from its own head
//! on (each certificate against the committee the previous value named, each body against
//! its value's contents and state), and serves what it holds.

use std::time::Instant;

use neuroshard_finality::{CertifiedEpoch, verify_chain};
use neuroshard_proof::{Canonical, NodeId};

use super::{
    BodyError, ChainLink, FinalityAnswer, FinalityOut, FinalityRequest, LedgerFinality,
    MAX_CHAIN_LINKS,
};

#[derive(Debug, thiserror::Error)]
pub enum ChainRefused {
    #[error("certificates: {0}")]
    Chain(#[from] neuroshard_finality::ChainError),
    #[error("epoch {epoch}: body: {source}")]
    Body { epoch: u64, source: BodyError },
    #[error("epoch {epoch}: the body is not the one the value names")]
    Contents { epoch: u64 },
    #[error("epoch {epoch}: applying the body gives another state")]
    State { epoch: u64 },
}

impl LedgerFinality {
    /// Certified epochs a peer served: checked from our head on (certificates against the
    /// committees the values name, bodies against the values), then applied.
    pub fn on_chain(&mut self, from: NodeId, links: Vec<ChainLink>, now: Instant) {
        let before = self.head.epoch;
        match self.apply_links(&links) {
            Ok(()) => {}
            Err(e) => self.out.push_back(FinalityOut::Penalize {
                peer: from,
                reason: format!("finalized chain: {e}"),
            }),
        }
        if self.head.epoch > before {
            for link in self
                .links
                .iter()
                .filter(|l| l.certified.value.epoch > before)
            {
                self.out.push_back(FinalityOut::Finalized {
                    link: link.clone(),
                    applied: link.body.items.len(),
                    latency: None,
                });
            }
            self.decided = None;
            // Back in step: the next epoch starts at once, more may follow from the peer.
            self.next_start = Some(now);
            if links.len() >= MAX_CHAIN_LINKS {
                self.last_chain_ask = None;
                self.ask_chain(Some(from), now);
            }
        }
    }

    pub(super) fn apply_links(&mut self, links: &[ChainLink]) -> Result<(), ChainRefused> {
        let links: Vec<&ChainLink> = links
            .iter()
            .filter(|l| l.certified.value.epoch > self.head.epoch)
            .collect();
        let certs: Vec<CertifiedEpoch> = links.iter().map(|l| l.certified.clone()).collect();
        verify_chain(&self.head, &certs)?;
        for link in links {
            let epoch = link.certified.value.epoch;
            let finalized = &self.finalized;
            let items = link
                .body
                .verify(&mut self.verifier, &|n| finalized.key(n))
                .map_err(|source| ChainRefused::Body { epoch, source })?;
            self.advance((*link).clone(), items)?;
        }
        Ok(())
    }

    /// What a peer asked for, as far as this node holds it (within `max_bytes`).
    pub fn answer(&self, request: &FinalityRequest, max_bytes: usize) -> FinalityAnswer {
        match request {
            FinalityRequest::Body { contents, .. } => {
                FinalityAnswer::Body(self.bodies.get(contents).map(|k| k.body.clone()).or_else(
                    || {
                        self.links
                            .iter()
                            .rev()
                            .find(|l| l.certified.value.contents == *contents)
                            .map(|l| l.body.clone())
                    },
                ))
            }
            FinalityRequest::Chain { from, max, .. } => {
                let max = (*max as usize).min(MAX_CHAIN_LINKS);
                let mut out = Vec::new();
                let mut bytes = 0usize;
                for l in self
                    .links
                    .iter()
                    .filter(|l| l.certified.value.epoch >= *from)
                {
                    let size = l.to_canonical_bytes().len();
                    if out.len() >= max || bytes.saturating_add(size) > max_bytes {
                        break;
                    }
                    bytes += size;
                    out.push((**l).clone());
                }
                FinalityAnswer::Chain(out)
            }
        }
    }
}
