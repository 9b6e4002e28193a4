//! The gate requests to Workers pass: open, they go straight through and are counted; closed
//! (while workerd restarts), new requests wait at it, and the one closing it waits for the
//! requests already through to finish. So a redeploy delays requests instead of dropping them.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Debug, Default)]
struct State {
    closed: bool,
    through: usize,
}

/// The gate.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<State>,
    changed: Notify,
}

/// A request through the gate; dropping it says the request finished.
#[derive(Debug)]
pub struct Pass {
    gate: Arc<Gate>,
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.gate.lock().through -= 1;
        self.gate.changed.notify_waiters();
    }
}

impl Gate {
    /// A gate closed until [`Gate::open`]: requests that arrive before the first start wait.
    pub fn closed() -> Gate {
        Gate { state: Mutex::new(State { closed: true, through: 0 }), changed: Notify::new() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits (at most `patience`) for the gate to be open and goes through.
    pub async fn enter(self: &Arc<Self>, patience: Duration) -> Option<Pass> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.lock();
                if !state.closed {
                    state.through += 1;
                    return Some(Pass { gate: Arc::clone(self) });
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }

    /// Goes through at once if the gate is open, or closing with requests still through it
    /// (workerd still runs for them): for a request one of them is waiting on, which would
    /// otherwise hold up the closing that waits for it. Else waits as [`Gate::enter`] does.
    pub async fn join(self: &Arc<Self>, patience: Duration) -> Option<Pass> {
        {
            let mut state = self.lock();
            if !state.closed || state.through > 0 {
                state.through += 1;
                return Some(Pass { gate: Arc::clone(self) });
            }
        }
        self.enter(patience).await
    }

    /// Closes the gate and waits (at most `patience`) for every request through it to finish;
    /// answers how many were still running when patience ran out.
    pub async fn close(&self, patience: Duration) -> usize {
        self.lock().closed = true;
        self.changed.notify_waiters();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let through = self.lock().through;
            if through == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.lock().through;
            }
        }
    }

    /// Opens the gate: waiting requests go through.
    pub fn open(&self) {
        self.lock().closed = false;
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closing_waits_for_requests_through_and_holds_new_ones() {
        let gate = Arc::new(Gate::default());
        let pass = gate.enter(Duration::from_secs(1)).await.unwrap();
        let closer = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.close(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!closer.is_finished(), "closing waits for the request through the gate");
        let waiter = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.enter(Duration::from_secs(5)).await.is_some() })
        };
        drop(pass);
        assert_eq!(closer.await.unwrap(), 0);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a new request waits while the gate is closed");
        gate.open();
        assert!(waiter.await.unwrap());
        gate.close(Duration::from_secs(1)).await;
        assert!(gate.enter(Duration::from_millis(20)).await.is_none(), "patience runs out");
    }
}
