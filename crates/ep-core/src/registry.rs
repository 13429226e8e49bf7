//! The registry of lowerings: every [`Lowering`] registered through [`register_lowering!`],
//! indexed once by (domain, op type). Claim and lowering read the same entry.

use crate::graph::{NodeInfo, is_onnx_domain};
use crate::lowering::{Decline, Lowering};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::OnceLock;

/// Every registered lowering of every linked op crate.
#[linkme::distributed_slice]
pub static LOWERINGS: [&'static dyn Lowering];

/// Lowerings indexed by (domain, op type), each list sorted by opset.
pub struct Registry {
    by_op: HashMap<(String, String), Vec<&'static dyn Lowering>>,
}

fn normalize(domain: &str) -> &str {
    if is_onnx_domain(domain) { "" } else { domain }
}

impl Registry {
    /// Builds an index, rejecting two lowerings whose (domain, op, opset range) overlap.
    pub fn build(entries: &[&'static dyn Lowering]) -> Result<Registry> {
        let mut by_op: HashMap<(String, String), Vec<&'static dyn Lowering>> = HashMap::new();
        for &l in entries {
            let key = (normalize(l.domain()).to_owned(), l.op_type().to_owned());
            let list = by_op.entry(key).or_default();
            if let Some(other) = list.iter().find(|o| {
                o.opsets().start() <= l.opsets().end() && l.opsets().start() <= o.opsets().end()
            }) {
                return Err(Error::new(format!(
                    "duplicate lowering registration for {}{} opsets {:?}: `{}` and `{}` overlap ({:?})",
                    if l.domain().is_empty() {
                        String::new()
                    } else {
                        format!("{}:", l.domain())
                    },
                    l.op_type(),
                    l.opsets(),
                    other.name(),
                    l.name(),
                    other.opsets(),
                )));
            }
            list.push(l);
            list.sort_by_key(|l| *l.opsets().start());
        }
        Ok(Registry { by_op })
    }

    /// The lowering for this node's domain, op and opset, or the reason there is none.
    pub fn find(&self, node: &NodeInfo) -> std::result::Result<&'static dyn Lowering, Decline> {
        let key = (normalize(&node.domain).to_owned(), node.op_type.clone());
        let list = self.by_op.get(&key).ok_or_else(|| {
            Decline(format!(
                "no lowering registered for {}",
                node.qualified_op()
            ))
        })?;
        list.iter()
            .copied()
            .find(|l| l.opsets().contains(&node.since_version))
            .ok_or_else(|| {
                let ranges: Vec<_> = list.iter().map(|l| l.opsets()).collect();
                Decline(format!(
                    "opset {} of {} is not supported (supported: {ranges:?})",
                    node.since_version,
                    node.qualified_op()
                ))
            })
    }

    /// Finds the lowering and asks it to claim the node.
    pub fn claim(&self, node: &NodeInfo) -> std::result::Result<&'static dyn Lowering, Decline> {
        let l = self.find(node)?;
        l.claim(node)?;
        Ok(l)
    }

    /// `(domain, op_type, opsets)` of every registered lowering, sorted.
    pub fn entries(&self) -> Vec<(String, String, std::ops::RangeInclusive<i32>)> {
        let mut v: Vec<_> = self
            .by_op
            .values()
            .flatten()
            .map(|l| {
                (
                    normalize(l.domain()).to_owned(),
                    l.op_type().to_owned(),
                    l.opsets(),
                )
            })
            .collect();
        v.sort_by(|a, b| (&a.0, &a.1, a.2.start()).cmp(&(&b.0, &b.1, b.2.start())));
        v
    }
}

/// The process-wide registry over [`LOWERINGS`], built on first use.
pub fn global() -> Result<&'static Registry> {
    static REGISTRY: OnceLock<std::result::Result<Registry, Error>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| Registry::build(&LOWERINGS))
        .as_ref()
        .map_err(Clone::clone)
}
