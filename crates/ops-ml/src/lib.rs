//! `ai.onnx.ml` lowerings (the classical machine-learning operators scikit-learn exporters
//! emit), where inputs and outputs are tensors: Binarizer, Scaler, Normalizer,
//! ArrayFeatureExtractor, LinearRegressor, LinearClassifier (int64 labels), Imputer, OneHotEncoder, LabelEncoder,
//! FeatureVectorizer, TreeEnsembleRegressor, TreeEnsembleClassifier (int64 labels, three classes or more), TreeEnsemble,
//! SVMRegressor, SVMClassifier (int64 labels, no probability estimates).
//! Ops with string inputs or outputs stay on ORT's CPU EP.
//!
//! # Adding a lowering
//! Write one file with a type implementing [`ep_core::Lowering`] and end it with
//! `ep_core::register_lowering!(NAME = Value);`, then add its `mod` line below. List it in
//! `crates/plugin/registered-ops.txt` and register its conformance spec next to it
//! (`conformance_spec::register_spec!`, behind the `conformance` feature).
#![forbid(unsafe_code)]

mod encode;
mod feature_extractor;
mod linear;
mod scale;
mod svm;
mod svm_classifier;
mod tree;
mod tree_classifier;
mod tree_v5;

/// The operator domain of this crate's ops.
pub(crate) const ML: &str = "ai.onnx.ml";

/// A float-list attribute, empty when absent (or of another kind).
pub(crate) fn floats<'a>(node: &'a ep_core::NodeInfo, name: &str) -> &'a [f32] {
    match node.attr(name) {
        Some(ep_core::AttrValue::Floats(v)) => v,
        _ => &[],
    }
}

/// An int-list attribute, empty when absent (or of another kind).
pub(crate) fn ints<'a>(node: &'a ep_core::NodeInfo, name: &str) -> &'a [i64] {
    match node.attr(name) {
        Some(ep_core::AttrValue::Ints(v)) => v,
        _ => &[],
    }
}

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() -> ep_core::registry::Family {
    ep_core::registry::Family { name: "ml" }
}
