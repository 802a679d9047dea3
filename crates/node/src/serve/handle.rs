//! How a front end (the HTTP API) reaches a running node's serving path: commands into the
//! runtime's loop, one channel of [`ServeEvent`]s per stream back out. The queue of commands
//! is bounded, so a flood of requests waits at the front end instead of in the node.

use tokio::sync::{mpsc, oneshot};

use super::{Completion, OpenError, ServeEvent};

/// A command for the runtime's loop.
#[derive(Debug)]
pub enum ServeCmd {
    Open {
        req: Completion,
        reply: oneshot::Sender<Result<(u64, mpsc::UnboundedReceiver<ServeEvent>), OpenError>>,
    },
    Cancel {
        stream: u64,
    },
}

/// Why a front end could not open a stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("the node's request queue is full")]
    Queue,
    #[error("the node stopped")]
    Stopped,
}

/// A cloneable handle on a node's serving path.
#[derive(Debug, Clone)]
pub struct ServeHandle {
    tx: mpsc::Sender<ServeCmd>,
}

/// A stream being generated; dropping it cancels the stream at the node.
#[derive(Debug)]
pub struct StreamRx {
    pub id: u64,
    pub events: mpsc::UnboundedReceiver<ServeEvent>,
    tx: mpsc::Sender<ServeCmd>,
}

impl Drop for StreamRx {
    fn drop(&mut self) {
        // Best effort: a stream that ended is no longer known and the command is a no-op.
        let _ = self.tx.try_send(ServeCmd::Cancel { stream: self.id });
    }
}

impl ServeHandle {
    /// A handle and the receiver the runtime reads; at most `queue` commands wait.
    pub fn new(queue: usize) -> (Self, mpsc::Receiver<ServeCmd>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        (Self { tx }, rx)
    }

    /// Opens a stream; refused at once when the command queue is full.
    pub async fn open(&self, req: Completion) -> Result<StreamRx, HandleError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .try_send(ServeCmd::Open { req, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => HandleError::Queue,
                mpsc::error::TrySendError::Closed(_) => HandleError::Stopped,
            })?;
        let (id, events) = answer.await.map_err(|_| HandleError::Stopped)??;
        Ok(StreamRx {
            id,
            events,
            tx: self.tx.clone(),
        })
    }
}
