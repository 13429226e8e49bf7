//! Intentionally empty: this manifest exists only to let cargo fetch mlx-c's sources.
