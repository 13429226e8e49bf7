//! Benchmarks of the EP on the generated decoders: the native-MLX floor (`native`), and the
//! runner behind `cargo xtask bench` (`mlx-ep-bench`).

pub mod native;
