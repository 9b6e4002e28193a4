//! A database actor's queue of commands: bounded as `sync_channel` is, but holding memory for
//! what is queued rather than for every slot from the start (512 slots were 8 KiB for each open
//! database, most of them never filled).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError, TrySendError};
use std::time::Duration;

/// A queue that takes at most `depth` items at once (at least one).
pub(crate) fn bounded<T>(depth: usize) -> (QueueSender<T>, QueueReceiver<T>) {
    let (tx, rx) = mpsc::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (QueueSender { tx, queued: Arc::clone(&queued), depth: depth.max(1) }, QueueReceiver { rx, queued })
}

pub(crate) struct QueueSender<T> {
    tx: mpsc::Sender<T>,
    /// Sent and not yet received; never below the true count (a sender counts before it
    /// sends, the receiver after it receives).
    queued: Arc<AtomicUsize>,
    depth: usize,
}

impl<T> QueueSender<T> {
    /// Queues `item`, unless `depth` items wait already (`Full`) or the receiver is gone
    /// (`Disconnected`); either way the item comes back.
    pub(crate) fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.depth {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(TrySendError::Full(item));
        }
        self.tx.send(item).map_err(|mpsc::SendError(item)| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            TrySendError::Disconnected(item)
        })
    }
}

pub(crate) struct QueueReceiver<T> {
    rx: mpsc::Receiver<T>,
    queued: Arc<AtomicUsize>,
}

impl<T> QueueReceiver<T> {
    pub(crate) fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.rx.recv_timeout(timeout).inspect(|_| self.taken())
    }

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        self.rx.try_recv().inspect(|_| self.taken())
    }

    fn taken(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_takes_depth_items_then_refuses_until_one_is_received() {
        let (tx, rx) = bounded(2);
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert!(matches!(tx.try_send(3), Err(TrySendError::Full(3))));
        assert_eq!(rx.try_recv().unwrap(), 1);
        tx.try_send(3).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_millis(10)).unwrap(), 2);
        assert_eq!(rx.try_recv().unwrap(), 3);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        drop(rx);
        assert!(matches!(tx.try_send(4), Err(TrySendError::Disconnected(4))));
        // A refused send leaves the count as it was: the queue is not full of nothing.
        let (tx, rx) = bounded(1);
        assert!(tx.try_send(1).is_ok() && tx.try_send(2).is_err());
        rx.try_recv().unwrap();
        tx.try_send(2).unwrap();
    }
}
