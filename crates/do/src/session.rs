//! A request's hold on one object: its transaction stays open on the object's actor thread
//! while the request's code runs elsewhere and sends it storage calls, one at a time. Ending
//! the session commits everything the request wrote, or rolls it all back. Dropping it
//! rolls back.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use kura_sqlite::Database;
use tokio::sync::oneshot;

use crate::error::{DoError, Result};
use crate::storage::{AlarmChange, Storage};

type Call = Box<dyn FnOnce(&mut Storage<'_>) + Send>;

pub(crate) enum Message {
    Call(Call),
    /// End the request: roll back, or commit unless the alarm changed, in which case the
    /// answer is the change and the session waits for [`Message::Decide`].
    Finish {
        commit: bool,
        reply: oneshot::Sender<Result<Option<AlarmChange>>>,
    },
    /// Commit or roll back, after the owner has seen the alarm change.
    Decide {
        commit: bool,
        reply: oneshot::Sender<Result<()>>,
    },
}

/// The async side of a session.
pub(crate) struct SessionLink {
    tx: Sender<Message>,
}

impl SessionLink {
    pub(crate) fn new(tx: Sender<Message>) -> Self {
        SessionLink { tx }
    }

    /// Runs `f` on the object's storage, inside the request's transaction.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Storage<'_>) -> T + Send + 'static,
    ) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        let call: Call = Box::new(move |storage| {
            let _ = reply.send(f(storage));
        });
        self.tx.send(Message::Call(call)).map_err(|_| DoError::Closed)?;
        answer.await.map_err(|_| DoError::Closed)
    }

    pub(crate) async fn finish(&self, commit: bool) -> Result<Option<AlarmChange>> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Message::Finish { commit, reply }).map_err(|_| DoError::Closed)?;
        answer.await.map_err(|_| DoError::Closed)?
    }

    pub(crate) async fn decide(&self, commit: bool) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Message::Decide { commit, reply }).map_err(|_| DoError::Closed)?;
        answer.await.map_err(|_| DoError::Closed)?
    }
}

/// The actor side: opens the transaction, serves calls until the request ends, and commits
/// or rolls back. A session idle for longer than `idle_limit` is rolled back.
pub(crate) fn serve(
    db: &mut Database,
    rx: Receiver<Message>,
    ready: oneshot::Sender<Result<()>>,
    idle_limit: Duration,
) {
    if let Err(e) = db.begin() {
        let _ = ready.send(Err(DoError::from_sql(e)));
        return;
    }
    let _ = ready.send(Ok(()));
    let mut storage = Storage::new(db);
    let outcome = serve_calls(&mut storage, &rx, idle_limit);
    let used_pragma = storage.used_pragma;
    let outcome = match outcome {
        Ended::RolledBack => {
            db.rollback();
            None
        }
        Ended::Commit(reply) => {
            let _ = reply.send(commit(db).map(|()| None));
            None
        }
        Ended::Decided(reply) => Some((commit(db), reply)),
    };
    if let Some((committed, reply)) = outcome {
        let _ = reply.send(committed);
    }
    if used_pragma {
        db.reset_connection_pragmas();
    }
}

enum Ended {
    RolledBack,
    Commit(oneshot::Sender<Result<Option<AlarmChange>>>),
    Decided(oneshot::Sender<Result<()>>),
}

fn serve_calls(storage: &mut Storage<'_>, rx: &Receiver<Message>, idle_limit: Duration) -> Ended {
    loop {
        match rx.recv_timeout(idle_limit) {
            Ok(Message::Call(call)) => call(storage),
            Ok(Message::Finish { commit: false, reply }) => {
                let _ = reply.send(Ok(None));
                return Ended::RolledBack;
            }
            Ok(Message::Finish { commit: true, reply }) => match storage.alarm_change() {
                None => return Ended::Commit(reply),
                Some(change) => {
                    let _ = reply.send(Ok(Some(change)));
                    return match rx.recv_timeout(idle_limit) {
                        Ok(Message::Decide { commit: true, reply }) => Ended::Decided(reply),
                        Ok(Message::Decide { commit: false, reply }) => {
                            let _ = reply.send(Ok(()));
                            Ended::RolledBack
                        }
                        _ => Ended::RolledBack,
                    };
                }
            },
            Ok(Message::Decide { reply, .. }) => {
                let _ = reply.send(Err(DoError::Invalid("the request has not finished".into())));
            }
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!(path = %storage_path(storage), "a request held its object too long; rolling it back");
                return Ended::RolledBack;
            }
            Err(RecvTimeoutError::Disconnected) => return Ended::RolledBack,
        }
    }
}

fn storage_path(storage: &Storage<'_>) -> String {
    storage.path().display().to_string()
}

fn commit(db: &mut Database) -> Result<()> {
    if !db.in_transaction() {
        return Err(DoError::Reset("Cannot commit transaction due to an earlier SQL critical error".into()));
    }
    db.commit().map_err(|e| match e {
        // A deferred constraint left violated is the request's fault, reported as workerd does.
        kura_sqlite::Error::Sql { message, code } if code == libsqlite3_sys::SQLITE_CONSTRAINT => {
            DoError::Reset(format!(
                "Durable Object was reset and rolled back to its last known good state because the application left \
             the database in a state where constraints were violated: {message}"
            ))
        }
        other => DoError::from_sql(other),
    })
}
