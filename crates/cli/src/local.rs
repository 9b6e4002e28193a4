//! The data directory opened in this process, for commands that run without a server: the
//! node and the account they act for (created, with an admin token, on first use).

use kura_server::{CredentialsConfig, Node, NodeSettings};

use crate::DataArgs;

/// The data directory, opened in this process.
pub struct Local {
    pub node: Node,
    pub account: String,
}

impl Local {
    /// Opens (and locks) the data directory; `KURA_ACCOUNT_ID` picks the account.
    pub fn open(data: &DataArgs) -> anyhow::Result<Local> {
        crate::membership::refuse_if_clustered(&data.data)?;
        let node = match Node::open(&data.data, NodeSettings::default()) {
            Err(busy @ kura_server::NodeError::Busy { .. }) => {
                anyhow::bail!("{busy}: stop it, or talk to it with --remote")
            }
            opened => opened?,
        };
        let credentials =
            CredentialsConfig { account_id: std::env::var("KURA_ACCOUNT_ID").ok(), api_token: None, s3_key: None };
        let boot = node.bootstrap(&credentials)?;
        if let Some(secret) = boot.new_token {
            eprintln!(
                "Created account {} in {} with an admin API token (shown only this once): {secret}",
                boot.account.id,
                data.data.display()
            );
        }
        Ok(Local { node, account: boot.account.id })
    }
}
