//! The transport's integration tests, one binary: each of these modules linked on its own
//! took 16 s to build (libp2p's generics instantiated six times over).

mod common;

mod blob;
mod flood;
mod gossip;
mod ids;
mod kad;
mod request;
