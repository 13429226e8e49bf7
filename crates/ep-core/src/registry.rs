//! The registry of lowerings: every [`Lowering`] registered through [`register_lowering!`](crate::register_lowering),
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

/// The ONNX ops whose inputs or outputs are sequences or optionals, which no lowering takes.
const NOT_TENSOR_OPS: &[&str] = &[
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceInsert",
    "SequenceAt",
    "SequenceErase",
    "SequenceLength",
    "SequenceMap",
    "SplitToSequence",
    "ConcatFromSequence",
    "Optional",
    "OptionalGetElement",
    "OptionalHasElement",
];

/// Why: the reason given for every op of [`NOT_TENSOR_OPS`].
const NOT_TENSORS: &str = "the MLX EP's values are tensors: ORT 1.31's plugin API writes a fused node's \
    outputs only as tensors (KernelContext_GetOutput takes a shape), so a partition cannot produce or pass \
    on a sequence, and reading one as a partition input is not implemented";

impl Registry {
    /// Builds an index, rejecting two lowerings whose (domain, op, opset range) overlap.
    pub fn build(entries: &[&'static dyn Lowering]) -> Result<Registry> {
        let mut by_op: HashMap<(String, String), Vec<&'static dyn Lowering>> = HashMap::new();
        for &l in entries {
            let key = (normalize(l.domain()).to_owned(), l.op_type().to_owned());
            let list = by_op.entry(key).or_default();
            if let Some(other) =
                list.iter().find(|o| o.opsets().start() <= l.opsets().end() && l.opsets().start() <= o.opsets().end())
            {
                return Err(Error::new(format!(
                    "duplicate lowering registration for {}{} opsets {:?}: `{}` and `{}` overlap ({:?})",
                    if l.domain().is_empty() { String::new() } else { format!("{}:", l.domain()) },
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
            if key.0.is_empty() && NOT_TENSOR_OPS.contains(&key.1.as_str()) {
                Decline(format!("{} works on sequence or optional values; {NOT_TENSORS}", node.op_type))
            } else {
                Decline(format!("no lowering registered for {}", node.qualified_op()))
            }
        })?;
        list.iter().copied().find(|l| l.opsets().contains(&node.since_version)).ok_or_else(|| {
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
            .map(|l| (normalize(l.domain()).to_owned(), l.op_type().to_owned(), l.opsets()))
            .collect();
        v.sort_by(|a, b| (&a.0, &a.1, a.2.start()).cmp(&(&b.0, &b.1, b.2.start())));
        v
    }
}

/// The process-wide registry over [`LOWERINGS`], built on first use.
pub fn global() -> Result<&'static Registry> {
    static REGISTRY: OnceLock<std::result::Result<Registry, Error>> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry::build(&LOWERINGS)).as_ref().map_err(Clone::clone)
}

/// An op crate's family of lowerings, returned by its `link()`. A plugin library passes every
/// family it bundles to [`export_plugin!`](crate::export_plugin), which records them: the
/// reference keeps the crate, and so its registrations, in the library, and the verbose
/// summary names them.
#[must_use = "pass it to ep_core::export_plugin! so the linker keeps the crate's lowerings"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    pub name: &'static str,
}

/// One family or several (what `export_plugin!` takes).
pub struct Families(pub Vec<Family>);

impl From<Family> for Families {
    fn from(f: Family) -> Families {
        Families(vec![f])
    }
}

impl From<Vec<Family>> for Families {
    fn from(f: Vec<Family>) -> Families {
        Families(f)
    }
}

/// Records the families a library bundles (called by `export_plugin!`'s entry point).
pub fn keep_families(families: impl Into<Families>) {
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    for f in families.into().0 {
        if !kept.contains(&f) {
            kept.push(f);
        }
    }
}

/// The families recorded so far.
pub fn kept_families() -> Vec<Family> {
    KEPT.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

static KEPT: std::sync::Mutex<Vec<Family>> = std::sync::Mutex::new(Vec::new());

/// Registers a [`Lowering`] value in the EP's registry:
/// `ep_core::register_lowering!(ADD = Binary::new("Add", ...));`
#[macro_export]
macro_rules! register_lowering {
    ($name:ident = $value:expr) => {
        #[$crate::linkme::distributed_slice($crate::registry::LOWERINGS)]
        #[linkme(crate = $crate::linkme)]
        static $name: &'static dyn $crate::Lowering = &$value;
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LowerCtx;
    use crate::graph::NodeInfo;
    use crate::mlx::Array;

    struct Fake(&'static str, std::ops::RangeInclusive<i32>, &'static str);
    impl Lowering for Fake {
        fn op_type(&self) -> &'static str {
            self.0
        }
        fn opsets(&self) -> std::ops::RangeInclusive<i32> {
            self.1.clone()
        }
        fn claim(&self, _: &NodeInfo) -> std::result::Result<(), Decline> {
            Ok(())
        }
        fn lower(&self, _: &mut LowerCtx<'_>, _: &NodeInfo) -> Result<Vec<Array>> {
            Ok(vec![])
        }
        fn name(&self) -> &'static str {
            self.2
        }
    }

    static ADD_7: Fake = Fake("Add", 7..=12, "first Add");
    static ADD_13: Fake = Fake("Add", 13..=i32::MAX, "second Add");
    static ADD_10: Fake = Fake("Add", 10..=i32::MAX, "overlapping Add");

    fn node(op: &str, opset: i32) -> NodeInfo {
        NodeInfo {
            name: "n".into(),
            op_type: op.into(),
            domain: "".into(),
            since_version: opset,
            inputs: vec![],
            outputs: vec![],
            attributes: Default::default(),
            implicit_inputs: vec![],
        }
    }

    #[test]
    fn overlapping_registrations_fail_naming_both() {
        let err = Registry::build(&[&ADD_7, &ADD_10]).err().expect("overlap must be rejected");
        assert!(err.0.contains("first Add") && err.0.contains("overlapping Add"), "{err}");
    }

    #[test]
    fn opsets_select_the_lowering() {
        let r = Registry::build(&[&ADD_13, &ADD_7]).unwrap();
        assert_eq!(r.find(&node("Add", 7)).unwrap().name(), "first Add");
        assert_eq!(r.find(&node("Add", 14)).unwrap().name(), "second Add");
        let decline = r.find(&node("Add", 6)).err().unwrap();
        assert!(decline.0.contains("opset 6"), "{decline}");
        assert!(r.find(&node("Shrink", 9)).err().unwrap().0.contains("no lowering"));
        let why = r.find(&node("SequenceAt", 11)).err().unwrap().0;
        assert!(why.contains("sequence or optional values") && why.contains("KernelContext_GetOutput"), "{why}");
    }

    #[test]
    fn the_onnx_domain_has_two_spellings() {
        let r = Registry::build(&[&ADD_7]).unwrap();
        let mut n = node("Add", 7);
        n.domain = "ai.onnx".into();
        assert!(r.find(&n).is_ok());
    }
}
