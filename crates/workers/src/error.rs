//! What can go wrong in the Workers layer, grouped by what the caller must do; the server gives
//! each its Cloudflare code in one place.

/// The Workers layer's errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkersError {
    /// The upload is malformed or asks for something kura does not do.
    #[error("{0}")]
    InvalidUpload(String),
    /// A binding names something the account does not have: Cloudflare's code for that kind
    /// (10181 D1, 10085 R2, 10061 Durable Object class, 10144 service).
    #[error("{message}")]
    MissingTarget {
        /// Cloudflare's code.
        code: u32,
        /// Cloudflare's message.
        message: String,
    },
    /// workerd refused the script (a syntax error, a missing export, a bad flag).
    #[error("{0}")]
    ScriptRejected(String),
    /// The account has no such script.
    #[error("This Worker does not exist on your account.")]
    ScriptNotFound,
    /// The script has no such version, deployment or secret.
    #[error("{0}")]
    NotFound(String),
    /// A migration's `old_tag` is not the script's tag.
    #[error("{0}")]
    MigrationConflict(String),
    /// A Cron Trigger's expression that does not parse, or never fires.
    #[error("{0}")]
    InvalidCron(String),
    /// An asset upload or an `[assets]` configuration kura refuses.
    #[error("{0}")]
    InvalidAssets(String),
    /// A tail's filters kura cannot read, or one tail too many.
    #[error("{0}")]
    InvalidTail(String),
    /// No workerd binary: Workers cannot run until one is installed.
    #[error(
        "kura runs Workers in workerd, and none was found ({searched}); install it with `{install}`, or name one with --workerd or KURA_WORKERD"
    )]
    NoWorkerd {
        /// Where kura looked.
        searched: String,
        /// The one command that installs it.
        install: String,
    },
    /// workerd would not run the new configuration; the previous one serves on.
    #[error("workerd could not start the Workers: {0}")]
    Runtime(String),
    /// Files of the Workers layer failed.
    #[error("{0}")]
    Storage(String),
    /// The cluster's shared store failed; nothing changed, and the request may be retried.
    #[error("{0}")]
    Unavailable(String),
    /// The file system failed (the chain keeps the `io::Error`, so a full disk is told by type).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The catalog failed or refused the change.
    #[error(transparent)]
    Catalog(#[from] kura_catalog::Error),
}

impl WorkersError {
    /// An upload kura refuses.
    pub fn invalid_upload(message: impl Into<String>) -> WorkersError {
        WorkersError::InvalidUpload(message.into())
    }

    pub(crate) fn io(context: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> WorkersError {
        move |source| WorkersError::Io { context: context.to_string(), source }
    }
}

/// Results of the Workers layer.
pub type Result<T, E = WorkersError> = std::result::Result<T, E>;
