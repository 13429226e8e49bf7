//! The attention op family. It registers no lowerings yet; it exists so the plugin's
//! `attention` feature, the registry and the trimmed builds are wired from the start.
//!
//! # Adding a lowering
//! Write one file with a type implementing [`ep_core::Lowering`], end it with
//! `ep_core::register_lowering!(NAME = Value);`, and add its `mod` line here.
#![forbid(unsafe_code)]

/// Referenced by the plugin so the linker keeps this crate's registrations.
pub fn link() {}
