//! Kademlia: our puts and lookups (results collected until each query ends) and the filter on
//! what peers ask us to store.

use std::collections::HashSet;

use libp2p::PeerId;
use libp2p::kad::store::RecordStore;
use libp2p::kad::{self, GetProvidersOk, GetRecordOk, QueryId, QueryResult};

use super::{Reply, Task};
use crate::NetError;
use crate::codec::CounterSet;

/// A Kademlia query the task is waiting on, with what it has collected so far.
pub(super) enum Query {
    Put(Reply<()>),
    Get {
        reply: Reply<Vec<Vec<u8>>>,
        values: Vec<Vec<u8>>,
    },
    Provide(Reply<()>),
    Providers {
        reply: Reply<HashSet<PeerId>>,
        found: HashSet<PeerId>,
        /// What was looked up: found providers are checked against it.
        key: Vec<u8>,
    },
}

impl Task {
    pub(super) fn put_record(&mut self, key: Vec<u8>, value: Vec<u8>, reply: Reply<()>) {
        let local = self.book.learn(&self.local());
        if !(self.config.record_validator)(&key, &value, local.as_ref()) {
            let _ = reply.send(Err(NetError::InvalidRecord));
            return;
        }
        // No local expiry: we keep our own record, and every publication gives the copies on
        // other peers a fresh `record_ttl`.
        let record = kad::Record::new(kad::RecordKey::new(&key), value);
        let kad = &mut self.swarm.behaviour_mut().kad;
        match kad.put_record(record, kad::Quorum::One) {
            Ok(id) => self.query_started(id, Query::Put(reply)),
            Err(e) => {
                let _ = reply.send(Err(NetError::Record(e.to_string())));
            }
        }
    }

    pub(super) fn get_record(&mut self, key: Vec<u8>, reply: Reply<Vec<Vec<u8>>>) {
        let kad = &mut self.swarm.behaviour_mut().kad;
        let id = kad.get_record(kad::RecordKey::new(&key));
        let values = Vec::new();
        self.query_started(id, Query::Get { reply, values });
    }

    pub(super) fn start_providing(&mut self, key: Vec<u8>, reply: Reply<()>) {
        let kad = &mut self.swarm.behaviour_mut().kad;
        match kad.start_providing(kad::RecordKey::new(&key)) {
            Ok(id) => self.query_started(id, Query::Provide(reply)),
            Err(e) => {
                let _ = reply.send(Err(NetError::Record(e.to_string())));
            }
        }
    }

    pub(super) fn get_providers(&mut self, key: Vec<u8>, reply: Reply<HashSet<PeerId>>) {
        let kad = &mut self.swarm.behaviour_mut().kad;
        let id = kad.get_providers(kad::RecordKey::new(&key));
        let found = HashSet::new();
        self.query_started(id, Query::Providers { reply, found, key });
    }

    fn query_started(&mut self, id: QueryId, query: Query) {
        CounterSet::bump(&self.counters.kad_queries);
        self.queries.insert(id, query);
    }

    pub(super) fn kad_event(&mut self, event: kad::Event) {
        match event {
            kad::Event::InboundRequest { request } => self.kad_inbound(request),
            kad::Event::OutboundQueryProgressed {
                id, result, step, ..
            } => self.kad_progress(id, result, step.last),
            _ => {}
        }
    }

    /// With `StoreInserts::FilterBoth` nothing a peer sends is stored until we store it here.
    fn kad_inbound(&mut self, request: kad::InboundRequest) {
        let validator = &self.config.record_validator;
        let book = &self.book;
        let kad = &mut self.swarm.behaviour_mut().kad;
        match request {
            kad::InboundRequest::PutRecord {
                source,
                record: Some(record),
                ..
            } => {
                let publisher = record.publisher.as_ref().and_then(|p| book.learn(p));
                if !validator(record.key.as_ref(), &record.value, publisher.as_ref()) {
                    tracing::debug!(peer = %source, "inbound record refused by the validator");
                } else if let Err(e) = kad.store_mut().put(record) {
                    tracing::debug!(peer = %source, error = %e, "inbound record not stored");
                }
            }
            kad::InboundRequest::AddProvider {
                record: Some(record),
            } => {
                // libp2p only hands us entries whose provider is the sending peer.
                let provider = book.learn(&record.provider);
                let valid = provider
                    .is_some_and(|p| (self.config.provider_validator)(record.key.as_ref(), &p));
                if !valid {
                    CounterSet::bump(&self.counters.providers_refused);
                    tracing::debug!(peer = %record.provider, "provider entry refused by the validator");
                } else if let Err(e) = kad.store_mut().add_provider(record) {
                    tracing::debug!(error = %e, "provider record not stored");
                }
            }
            _ => {}
        }
    }

    fn kad_progress(&mut self, id: QueryId, result: QueryResult, last: bool) {
        let Some(mut query) = self.queries.remove(&id) else {
            return;
        };
        match (&mut query, result) {
            (
                Query::Get { values, .. },
                QueryResult::GetRecord(Ok(GetRecordOk::FoundRecord(r))),
            ) => {
                let record = r.record;
                let publisher = record.publisher.as_ref().and_then(|p| self.book.learn(p));
                let valid = (self.config.record_validator)(
                    record.key.as_ref(),
                    &record.value,
                    publisher.as_ref(),
                );
                if !valid {
                    tracing::debug!(from = ?r.peer, "record refused by the validator");
                } else if !values.contains(&record.value) {
                    values.push(record.value);
                }
            }
            (Query::Get { .. }, QueryResult::GetRecord(Err(e))) => {
                tracing::debug!(error = %e, "get_record finished");
            }
            (
                Query::Providers { found, key, .. },
                QueryResult::GetProviders(Ok(GetProvidersOk::FoundProviders { providers, .. })),
            ) => {
                for p in providers {
                    let valid = self
                        .book
                        .learn(&p)
                        .is_some_and(|n| (self.config.provider_validator)(key, &n));
                    if !valid {
                        CounterSet::bump(&self.counters.providers_refused);
                    } else if !self.scores.is_banned(&p) {
                        found.insert(p);
                    }
                }
            }
            (Query::Providers { .. }, QueryResult::GetProviders(Err(e))) => {
                tracing::debug!(error = %e, "get_providers finished");
            }
            // The record or provider entry is stored locally whatever the network said.
            (Query::Put(_), QueryResult::PutRecord(Err(e))) => {
                tracing::debug!(error = %e, "record stored locally only");
            }
            (Query::Provide(_), QueryResult::StartProviding(Err(e))) => {
                tracing::debug!(error = %e, "providing locally only");
            }
            _ => {}
        }
        if !last {
            self.queries.insert(id, query);
            return;
        }
        match query {
            Query::Put(reply) | Query::Provide(reply) => {
                let _ = reply.send(Ok(()));
            }
            Query::Get { reply, values } => {
                let _ = reply.send(Ok(values));
            }
            Query::Providers { reply, found, .. } => {
                let _ = reply.send(Ok(found));
            }
        }
    }
}
