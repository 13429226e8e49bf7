//! Core of the MLX execution provider for ONNX Runtime.
//!
//! - [`mlx`]: the safe RAII layer over mlx-c (arrays, streams, closures, ops, error handling).
//! - [`lowering`]: **the extension contract**. An op crate implements [`Lowering`] for each op
//!   it supports and registers it with [`register_lowering!`]; nothing else is needed.
//! - [`registry`]: the index of registered lowerings, built once.
//! - [`graph`]: a safe, owned description of the ONNX graph ORT hands the EP.
//! - [`growth`]: how a lowering answers the decode slot (inputs that grow between runs).
//! - [`options`]: the provider options and environment variables the EP reads, declared once.
//! - [`partition`]: which claimed nodes are fused together.
//! - [`exec`]: the compiled form of one partition and how it runs.
//! - `ort_abi`: the ORT plugin C ABI (factory, EP, compute callbacks); the only other home of
//!   `unsafe` besides `mlx`.

pub mod activation;
mod claims;
pub mod error;
pub mod exec;
pub mod float4;
pub mod float8;
pub mod graph;
pub mod growth;
pub mod lowering;
pub mod mlx;
pub mod options;
pub mod partition;
pub mod quant;
pub mod registry;
pub mod shared;
pub mod stats;
pub mod trace;

#[doc(hidden)]
pub mod ort_abi;

pub use error::{Error, Result};
pub use graph::{AttrValue, ElemType, NodeInfo, Subgraph, TensorData, ValueInfo};
pub use lowering::{CompileSafety, Decline, LowerCtx, Lowering, TakesFloat8};

#[doc(hidden)]
pub use linkme;
#[doc(hidden)]
pub use ort_sys;

/// The execution provider's name as ORT reports it.
pub const EP_NAME: &str = "MLXExecutionProvider";
/// The oldest ORT C API version the plugin accepts (ONNX Runtime 1.31).
pub const MIN_ORT_API_VERSION: u32 = 31;
