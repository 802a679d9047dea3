//! [`Address`]: a transport address, so that no libp2p type crosses this crate's boundary.

use std::fmt;
use std::str::FromStr;

use libp2p::Multiaddr;

use crate::NetError;

/// Where a peer listens: multiaddr text such as `/ip4/127.0.0.1/tcp/4001/p2p/<peer id>` or
/// `/ip4/10.0.0.2/udp/4001/quic-v1`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Address(pub(crate) Multiaddr);

impl FromStr for Address {
    type Err = NetError;

    fn from_str(s: &str) -> Result<Self, NetError> {
        s.parse::<Multiaddr>()
            .map(Address)
            .map_err(|e| NetError::InvalidAddress {
                addr: s.to_string(),
                reason: e.to_string(),
            })
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_garbage_is_a_clear_error() {
        let text = "/ip4/127.0.0.1/tcp/4001";
        let a: Address = text.parse().unwrap();
        assert_eq!(a.to_string(), text);
        let err = "not an address".parse::<Address>().unwrap_err();
        assert!(err.to_string().contains("not an address"), "{err}");
    }
}
