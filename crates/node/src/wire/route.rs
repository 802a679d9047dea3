//! Hand-offs: which replica may pass a micro-batch on.
//!
//! A stage takes input from any replica registered for the stage before it, since routing and
//! failover pick among them. Registration alone would let a replica that was never given a
//! micro-batch send activations for it (holding the driver's stamp, which any receiver on the
//! way could hand it) and have them trained in and tallied as its work. So each sender signs a
//! hand-off naming the replica it sends to, and a forward carries every hand-off since its
//! driver: a chain from the driver to its sender, ending at the receiver. Only a replica some
//! sender of this micro-batch actually chose can extend it; a failover is one more choice,
//! signed by the replica that made it.

use neuroshard_proof::{
    Canonical, CodecError, EnvelopeError, Hash32, NodeId, Reader, Signed, Writer,
};

use super::MicroBatchId;

/// A replica's signature that it passed micro-batch `mb` (of `version`, in `network`) to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handoff {
    pub network: Hash32,
    pub mb: MicroBatchId,
    pub version: u32,
    pub to: NodeId,
}

impl Canonical for Handoff {
    const DOMAIN: &'static str = "neuroshard/handoff/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        self.mb.encode(w);
        w.u32(self.version);
        w.fixed(&self.to.0);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            network: r.array()?,
            mb: MicroBatchId::decode(r)?,
            version: r.u32()?,
            to: NodeId(r.array()?),
        })
    }
}

/// One signed hand-off is a couple of hundred bytes; 1 KiB bounds it.
const MAX_HANDOFF: usize = 1024;
/// No layout has more stages than this, so no route more hand-offs.
const MAX_HOPS: usize = 256;

pub(super) fn put_route(w: &mut Writer, route: &[Signed<Handoff>]) {
    w.len(route.len());
    for h in route {
        w.bytes(&h.to_bytes());
    }
}

pub(super) fn get_route(r: &mut Reader<'_>) -> Result<Vec<Signed<Handoff>>, CodecError> {
    let n = r.len(MAX_HOPS)?;
    (0..n)
        .map(|_| {
            Signed::from_bytes(r.bytes(MAX_HANDOFF)?).map_err(|e| CodecError::Invalid {
                field: "hand-off",
                reason: e.to_string(),
            })
        })
        .collect()
}

/// Why a forward's route is refused.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("{got} hand-offs where this stage is hop {expected}")]
    Length { expected: usize, got: usize },
    #[error("hand-off {hop}: {source}")]
    Signature { hop: usize, source: EnvelopeError },
    #[error("hand-off {hop} is for another network, micro-batch or version")]
    Mismatch { hop: usize },
    #[error("hand-off {hop} is not signed by the replica the one before it named")]
    Broken { hop: usize },
    #[error("the last hand-off is not its sender's")]
    NotTheSender,
    #[error("the last hand-off names another replica")]
    NotToUs,
}

/// Checks that `route` passes micro-batch `mb` of `version` from its driver, one signed
/// choice at a time, to `from` and from it to `me`, the receiver at hop `hops` of its layout.
pub fn check_route(
    network: &Hash32,
    (me, from): (NodeId, NodeId),
    (mb, version): (MicroBatchId, u32),
    route: &[Signed<Handoff>],
    hops: usize,
) -> Result<(), RouteError> {
    if route.len() != hops {
        return Err(RouteError::Length {
            expected: hops,
            got: route.len(),
        });
    }
    let mut holder = NodeId(mb.origin);
    for (hop, signed) in route.iter().enumerate() {
        if signed.signer().node_id() != holder {
            return Err(RouteError::Broken { hop });
        }
        let h = signed
            .verify()
            .map_err(|source| RouteError::Signature { hop, source })?;
        if h.network != *network || h.mb != mb || h.version != version {
            return Err(RouteError::Mismatch { hop });
        }
        if hop + 1 == route.len() && holder != from {
            return Err(RouteError::NotTheSender);
        }
        holder = h.to;
    }
    if holder != me {
        return Err(RouteError::NotToUs);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use neuroshard_proof::fixtures::test_identity;

    use super::*;

    const NETWORK: Hash32 = [9; 32];

    fn id(k: u64) -> NodeId {
        test_identity(k).node_id()
    }

    fn mb() -> MicroBatchId {
        MicroBatchId {
            origin: id(1).0,
            step: 5,
            index: 0,
        }
    }

    fn handoff(by: u64, to: u64) -> Signed<Handoff> {
        let h = Handoff {
            network: NETWORK,
            mb: mb(),
            version: 2,
            to: id(to),
        };
        Signed::sign(&test_identity(by), &h)
    }

    /// Driver 1 → 2 → 3 → 4: what 4 receives from 3 at the fourth stage.
    fn honest() -> Vec<Signed<Handoff>> {
        vec![handoff(1, 2), handoff(2, 3), handoff(3, 4)]
    }

    fn check(route: &[Signed<Handoff>], me: u64, from: u64) -> Result<(), RouteError> {
        check_route(&NETWORK, (id(me), id(from)), (mb(), 2), route, route.len())
    }

    #[test]
    fn a_chain_of_signed_choices_from_the_driver_passes() {
        check(&honest(), 4, 3).unwrap();
        check(&honest()[..1], 2, 1).unwrap();
        // A failover at the second hop is one more signed choice: 2 sent it to 5 instead.
        check(&[handoff(1, 2), handoff(2, 5), handoff(5, 4)], 4, 5).unwrap();
    }

    /// Replica 6 of the third stage was never given the micro-batch but holds its stamp and
    /// the route to 3: nothing it can sign or reuse makes it the one the second stage chose.
    #[test]
    fn a_replica_no_one_passed_the_micro_batch_to_cannot_send_it_on() {
        // 3's own route to 4, sent by 6.
        assert!(matches!(
            check(&honest(), 4, 6),
            Err(RouteError::NotTheSender)
        ));
        // 6 signs the last hand-off itself.
        let forged = [handoff(1, 2), handoff(2, 3), handoff(6, 4)];
        assert!(matches!(
            check(&forged, 4, 6),
            Err(RouteError::Broken { hop: 2 })
        ));
        // 6 claims the second stage's hand-off to itself, signed by itself.
        let forged = [handoff(1, 2), handoff(6, 6), handoff(6, 4)];
        assert!(matches!(
            check(&forged, 4, 6),
            Err(RouteError::Broken { hop: 1 })
        ));
        // 3's route replayed to another replica of the fourth stage.
        assert!(matches!(check(&honest(), 7, 3), Err(RouteError::NotToUs)));
        // A shortened route (skipping the hop the receiver is at).
        assert!(matches!(
            check_route(&NETWORK, (id(4), id(3)), (mb(), 2), &honest()[1..], 3),
            Err(RouteError::Length {
                expected: 3,
                got: 2
            })
        ));
    }

    #[test]
    fn a_hand_off_of_another_micro_batch_version_or_network_is_refused() {
        let other = |f: &dyn Fn(&mut Handoff)| {
            let mut h = Handoff {
                network: NETWORK,
                mb: mb(),
                version: 2,
                to: id(3),
            };
            f(&mut h);
            vec![handoff(1, 2), Signed::sign(&test_identity(2), &h)]
        };
        for route in [
            other(&|h| h.mb.step = 6),
            other(&|h| h.version = 1),
            other(&|h| h.network = [8; 32]),
        ] {
            assert!(matches!(
                check(&route, 3, 2),
                Err(RouteError::Mismatch { hop: 1 })
            ));
        }
        // A hand-off whose signature does not cover its bytes.
        let mut bytes = handoff(1, 2).to_bytes();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let bad = Signed::<Handoff>::from_bytes(&bytes).unwrap();
        assert!(matches!(
            check(&[bad], 2, 1),
            Err(RouteError::Signature { hop: 0, .. })
        ));
    }

    #[test]
    fn routes_round_trip_and_oversized_ones_are_refused() {
        let mut w = Writer::new();
        put_route(&mut w, &honest());
        let bytes = w.into_bytes();
        let back = get_route(&mut Reader::new(&bytes)).unwrap();
        assert_eq!(back, honest());
        let mut w = Writer::new();
        w.len(MAX_HOPS + 1);
        let bytes = w.into_bytes();
        assert!(get_route(&mut Reader::new(&bytes)).is_err());
    }
}
