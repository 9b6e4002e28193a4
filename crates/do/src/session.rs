//! A request's hold on one object ([`Session`]): its transaction stays open on the object's
//! actor thread while the request's code runs elsewhere and sends it storage calls, one at a
//! time. Ending the session commits everything the request wrote, or rolls it all back.
//! Dropping it rolls back.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use kura_sqlite::Database;
use tokio::sync::oneshot;

use crate::error::{DoError, Result};
use crate::storage::{CommitNotice, Storage, now_ms};
use crate::{DurableObjects, Namespace, ObjectId, index};

/// A request in progress on one object: storage calls run in its transaction, in order.
pub struct Session {
    pub(crate) link: SessionLink,
    pub(crate) engine: DurableObjects,
    pub(crate) namespace: Namespace,
    pub(crate) id: ObjectId,
}

impl Session {
    /// The object's id.
    pub fn id(&self) -> &ObjectId {
        &self.id
    }

    /// Runs `f` on the object's storage, inside the request's transaction.
    pub async fn call<T: Send + 'static>(&self, f: impl FnOnce(&mut Storage<'_>) -> T + Send + 'static) -> Result<T> {
        self.link.call(f).await
    }

    /// Commits what the request wrote; answers once it is durable (and the namespace's index
    /// lists the object, and its alarm schedule follows any alarm change).
    pub async fn commit(self) -> Result<()> {
        let Some(notice) = self.link.finish(true).await? else { return Ok(()) };
        let (ns, hex, name) = (&self.namespace, self.id.to_string(), self.id.name().map(str::to_owned));
        let alarm_at = notice.alarm.and_then(|change| change.after);
        if notice.first_write || alarm_at.is_some() {
            // Before the commit: the object is listed, and the schedule may only move earlier,
            // so it never runs late.
            let (hex, name, now) = (hex.clone(), name.clone(), now_ms());
            let listed = self
                .engine
                .index_write(ns, move |c| {
                    if notice.first_write {
                        index::register(c, &hex, name.as_deref(), now)?;
                    }
                    if let Some(at) = alarm_at {
                        index::schedule_no_later(c, &hex, name.as_deref(), at)?;
                    }
                    Ok(())
                })
                .await;
            if let Err(e) = listed {
                let _ = self.link.decide(false).await;
                return Err(e);
            }
        }
        self.link.decide(true).await?;
        if let Some(change) = notice.alarm {
            // After it, exactly; should this fail, the schedule runs early and is corrected then.
            let outcome =
                self.engine.index_write(ns, move |c| index::schedule(c, &hex, name.as_deref(), change.after, 0)).await;
            if let Err(e) = outcome {
                tracing::warn!(error = %e, "could not update the alarm schedule after a commit");
            }
            self.engine.inner.alarm_wake.notify_one();
        }
        Ok(())
    }

    /// Undoes everything the request wrote.
    pub async fn rollback(self) {
        let _ = self.link.finish(false).await;
    }
}

type Call = Box<dyn FnOnce(&mut Storage<'_>) + Send>;

pub(crate) enum Message {
    Call(Call),
    /// End the request: roll back, or commit unless the alarm changed, in which case the
    /// answer is the change and the session waits for [`Message::Decide`].
    Finish {
        commit: bool,
        reply: oneshot::Sender<Result<Option<CommitNotice>>>,
    },
    /// Commit or roll back, after the owner has seen the alarm change.
    Decide {
        commit: bool,
        reply: oneshot::Sender<Result<()>>,
    },
}

/// The async side of a session: calls travel to the object's thread over a channel
/// ([`SessionLink::Remote`]), or, when the request itself runs on that thread
/// ([`serve_local`]), go straight to its storage ([`SessionLink::Local`]).
pub(crate) enum SessionLink {
    Remote(Sender<Message>),
    /// The request lent under this token (so a session of one object, carried into another
    /// object's request, cannot reach that object's storage).
    Local(u64),
}

impl SessionLink {
    /// Runs `f` on the object's storage, inside the request's transaction.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Storage<'_>) -> T + Send + 'static,
    ) -> Result<T> {
        let tx = match self {
            SessionLink::Local(token) => return local::with_storage(*token, f),
            SessionLink::Remote(tx) => tx,
        };
        let (reply, answer) = oneshot::channel();
        let call: Call = Box::new(move |storage| {
            let _ = reply.send(f(storage));
        });
        tx.send(Message::Call(call)).map_err(|_| DoError::Closed)?;
        answer.await.map_err(|_| DoError::Closed)
    }

    pub(crate) async fn finish(&self, commit: bool) -> Result<Option<CommitNotice>> {
        let tx = match self {
            SessionLink::Local(token) => return local::with_storage(*token, |storage| finish_local(storage, commit))?,
            SessionLink::Remote(tx) => tx,
        };
        let (reply, answer) = oneshot::channel();
        tx.send(Message::Finish { commit, reply }).map_err(|_| DoError::Closed)?;
        answer.await.map_err(|_| DoError::Closed)?
    }

    pub(crate) async fn decide(&self, commit: bool) -> Result<()> {
        let tx = match self {
            SessionLink::Local(token) => {
                return local::with_storage(*token, |storage| {
                    if commit {
                        self::commit(storage.database())
                    } else {
                        storage.database().rollback();
                        Ok(())
                    }
                })?;
            }
            SessionLink::Remote(tx) => tx,
        };
        let (reply, answer) = oneshot::channel();
        tx.send(Message::Decide { commit, reply }).map_err(|_| DoError::Closed)?;
        answer.await.map_err(|_| DoError::Closed)?
    }
}

/// Ends a local request: rolls back, or commits unless the alarm changed (the change is then
/// the answer, and [`SessionLink::decide`] commits once the owner has seen it).
fn finish_local(storage: &mut Storage<'_>, commit: bool) -> Result<Option<CommitNotice>> {
    if !commit {
        storage.database().rollback();
        return Ok(None);
    }
    match storage.prepare_commit() {
        Ok(None) => self::commit(storage.database()).map(|()| None),
        Ok(Some(notice)) => Ok(Some(notice)),
        Err(e) => {
            storage.database().rollback();
            Err(e)
        }
    }
}

/// Runs `request` on this thread (the object's own) as one request: the transaction opens
/// first, the request's storage calls go straight to it, and whatever the request did not
/// commit is rolled back when it returns.
pub(crate) fn serve_local<T>(db: &mut Database, request: impl FnOnce(SessionLink) -> T) -> Result<T> {
    db.begin().map_err(DoError::from_sql)?;
    let mut storage = Storage::new(db);
    let token = local::next_token();
    let output = local::lend(&mut storage, token, || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| request(SessionLink::Local(token))))
    });
    let used_pragma = storage.used_pragma;
    let db = storage.database();
    if db.in_transaction() {
        db.rollback();
    }
    if used_pragma {
        db.reset_connection_pragmas();
    }
    output.map_err(|_| DoError::Reset("the request panicked; what it wrote was rolled back".into()))
}

/// Drives `future` to completion on this thread, parking it while the future waits.
pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

/// The storage a local request reaches, lent to this thread while the request runs.
mod local {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};

    use crate::error::{DoError, Result};
    use crate::storage::Storage;

    /// A lent storage and the token of the request it was lent to.
    type Lent = (*mut Storage<'static>, u64);

    thread_local! {
        /// The storage of the request running on this thread; null when none is, or while a
        /// call is using it (so a call cannot reach it again from inside itself).
        static CURRENT: Cell<Lent> = const { Cell::new((std::ptr::null_mut(), 0)) };
    }

    /// A token no other request has had.
    pub(super) fn next_token() -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    /// Puts the lent storage back when a call ends, even by a panic.
    struct Restore(Lent);

    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }

    /// Lends `storage` to this thread's calls under `token` while `body` runs.
    pub(super) fn lend<R>(storage: &mut Storage<'_>, token: u64, body: impl FnOnce() -> R) -> R {
        let ptr = (storage as *mut Storage<'_>).cast::<Storage<'static>>();
        let previous = CURRENT.with(|c| c.replace((ptr, token)));
        let _restore = Restore(previous);
        body()
    }

    /// Runs `f` on the storage lent under `token`; `Closed` from any other thread, from another
    /// request's thread, or from inside a call.
    pub(super) fn with_storage<T>(token: u64, f: impl FnOnce(&mut Storage<'_>) -> T) -> Result<T> {
        let (ptr, lent_to) = CURRENT.with(|c| c.get());
        if ptr.is_null() || lent_to != token {
            return Err(DoError::Closed);
        }
        CURRENT.with(|c| c.set((std::ptr::null_mut(), 0)));
        let _restore = Restore((ptr, lent_to));
        // SAFETY: `ptr` was lent by `lend` on this thread, whose frame (and so the storage,
        // borrowed mutably for it) outlives every call made while `body` runs; the cell is
        // null while this call holds the only reference, so no other can alias it.
        Ok(f(unsafe { &mut *ptr }))
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
    Commit(oneshot::Sender<Result<Option<CommitNotice>>>),
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
            Ok(Message::Finish { commit: true, reply }) => match storage.prepare_commit() {
                Ok(None) => return Ended::Commit(reply),
                Err(e) => {
                    let _ = reply.send(Err(e));
                    return Ended::RolledBack;
                }
                Ok(Some(notice)) => {
                    let _ = reply.send(Ok(Some(notice)));
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
    // What the commit makes due in the history follows the answer (the actor's round ends so).
    db.commit_answered_first().map_err(|e| match e {
        // A deferred constraint left violated is the request's fault, reported as workerd does.
        kura_sqlite::Error::Sql { message, code, .. } if code == libsqlite3_sys::SQLITE_CONSTRAINT => {
            DoError::Reset(format!(
                "Durable Object was reset and rolled back to its last known good state because the application left \
             the database in a state where constraints were violated: {message}"
            ))
        }
        other => DoError::from_sql(other),
    })
}
