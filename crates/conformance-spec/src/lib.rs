//! The conformance contract between op crates and the differential suite.
//!
//! Each op crate, behind its `conformance` cargo feature, registers one [`OpSpec`] per lowering
//! with [`register_spec!`]: a `proptest` strategy that generates [`Case`]s the lowering claims
//! (ranks, shapes with broadcasting and size-0/size-1 dims, dtypes, attributes and their legal
//! ranges, value ranges). `crates/conformance` collects every registered spec, builds each case
//! as a model, runs it on ORT's CPU EP and on the MLX EP, and compares. A lowering registered
//! without a spec fails the suite by name.
//!
//! ```ignore
//! #[cfg(feature = "conformance")]
//! conformance_spec::register_spec!(RELU, || {
//!     use conformance_spec::{strategy::*, Case};
//!     (float_dtype(), shape(0..=4)).prop_map(|(t, s)| Case::unary("Relu", 14, t, &s)).boxed()
//! });
//! ```

pub mod case;
pub mod strategy;

pub use case::{Attr, Case, Compare, DType, NodeSpec, TensorSpec, Values};
pub use inventory;
pub use proptest;

/// One lowering's conformance spec.
pub struct OpSpec {
    /// The (domain, op type) of the lowering the spec is for, read from the lowering itself
    /// (see [`register_spec!`]) so the key is written once, in the registration.
    pub key: fn() -> (&'static str, &'static str),
    /// Generates the cases; each must be a form the lowering claims (a declined case fails).
    pub cases: fn() -> proptest::strategy::BoxedStrategy<Case>,
    /// Where the spec was registered, for messages.
    pub file: &'static str,
}

inventory::collect!(OpSpec);

impl OpSpec {
    /// ONNX domain of the op (`""` for `ai.onnx`).
    pub fn domain(&self) -> &'static str {
        (self.key)().0
    }

    pub fn op(&self) -> &'static str {
        (self.key)().1
    }
}

/// Every registered spec, in registration-independent order (domain, op).
pub fn specs() -> Vec<&'static OpSpec> {
    let mut v: Vec<&'static OpSpec> = inventory::iter::<OpSpec>.into_iter().collect();
    v.sort_by_key(|s| (s.key)());
    v
}

/// Registers an [`OpSpec`] for a registered lowering: `register_spec!(GATHER, || strategy)`,
/// where `GATHER` is the static `ep_core::register_lowering!` defined (`super::GATHER` from a
/// `mod spec` beside it). The op's domain and type come from the lowering.
#[macro_export]
macro_rules! register_spec {
    ($lowering:path, $cases:expr) => {
        $crate::inventory::submit! {
            $crate::OpSpec {
                key: || (::ep_core::Lowering::domain($lowering), ::ep_core::Lowering::op_type($lowering)),
                cases: $cases,
                file: file!(),
            }
        }
    };
}
