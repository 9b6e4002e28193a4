//! The one account every suite and the benchmark act as, with its admin API token and S3 key:
//! whichever harness starts kura, a request signed with these reaches it.

/// The account kura is started with.
pub const ACCOUNT: &str = "test-account";
/// That account's admin API token.
pub const TOKEN: &str = "test-admin-token-0123456789abcdef";
/// That account's read-write S3 access key id.
pub const S3_ACCESS_KEY_ID: &str = "test-s3-key";
/// Its secret.
pub const S3_SECRET_ACCESS_KEY: &str = "test-s3-secret-0123456789abcdef";
