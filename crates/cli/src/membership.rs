//! Which kind of kura a data directory belongs to: a cluster node marks its directory
//! (`cluster-node.json`, its node's name and store), so that nothing writes that directory as
//! a kura of its own — a local `kura tokens create` would write a catalog copy the cluster
//! replaces — and no directory of a single kura is taken into a cluster, where the cluster's
//! catalog would replace its own.

use std::path::Path;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

const MARKER: &str = "cluster-node.json";

/// What a cluster node's directory records of it.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    node: String,
    store: String,
}

fn read(data: &Path) -> anyhow::Result<Option<Marker>> {
    let path = data.join(MARKER);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Refuses a command that would run on `data` as a kura of its own when a cluster node owns it.
pub fn refuse_if_clustered(data: &Path) -> anyhow::Result<()> {
    if let Some(marker) = read(data)? {
        bail!(
            "{} is the data directory of cluster node {} (data in {}): its catalog is the cluster's, and what a \
             command wrote here would be lost; talk to the cluster with --remote instead",
            data.display(),
            marker.node,
            marker.store
        );
    }
    Ok(())
}

/// Before `kura serve` opens `data`: as the cluster node `node` (with its store), or alone
/// (`None`). Marks a new cluster node's directory.
pub fn claim_directory(data: &Path, node: Option<(&str, &str)>) -> anyhow::Result<()> {
    let marker = read(data)?;
    match (node, marker) {
        (None, None) => Ok(()),
        (None, Some(marker)) => bail!(
            "{} is the data directory of cluster node {} (data in {}): start it with that node's cluster flags, or \
             start this kura on another directory",
            data.display(),
            marker.node,
            marker.store
        ),
        (Some((node, _)), Some(marker)) if marker.node != node => bail!(
            "{} is the data directory of cluster node {}, not {node}: give each node a directory of its own",
            data.display(),
            marker.node
        ),
        (Some(_), Some(_)) => Ok(()),
        (Some((node, store)), None) => {
            if data.join("catalog.sqlite").exists() {
                bail!(
                    "{} holds a kura of its own: a cluster node starts on an empty directory (the cluster's catalog \
                     would replace this one's)",
                    data.display()
                );
            }
            std::fs::create_dir_all(data).with_context(|| format!("creating {}", data.display()))?;
            let marker = Marker { node: node.to_owned(), store: store.to_owned() };
            let path = data.join(MARKER);
            std::fs::write(&path, serde_json::to_vec_pretty(&marker)?)
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(())
        }
    }
}
