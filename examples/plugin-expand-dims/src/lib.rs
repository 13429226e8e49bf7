//! The MLX EP plugin library with the project's elementwise and nn families plus the
//! third-party example crate: bundling op crates is one macro call.

ep_core::export_plugin!(ops_elementwise::link(), ops_nn::link(), example_ops_expand_dims::link());
