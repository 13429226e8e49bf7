//! Building blocks for specs: shapes (with size-0 and size-1 dims and scalars), broadcasting
//! pairs, dtypes, axes and opsets.

pub use proptest::collection;
pub use proptest::prelude::*;
pub use proptest::sample::select;

use crate::DType;
use std::ops::RangeInclusive;

/// A dimension: mostly 2..=5, sometimes 1, rarely 0.
pub fn dim() -> BoxedStrategy<i64> {
    prop_oneof![6 => 2..=5i64, 2 => Just(1i64), 1 => Just(0i64)].boxed()
}

/// A dimension of at least 1.
pub fn nonzero_dim() -> BoxedStrategy<i64> {
    prop_oneof![4 => 2..=5i64, 1 => Just(1i64)].boxed()
}

/// A shape of rank in `rank` (rank 0 is a scalar).
pub fn shape(rank: RangeInclusive<usize>) -> BoxedStrategy<Vec<i64>> {
    proptest::collection::vec(dim(), rank).boxed()
}

/// A shape of rank in `rank` without size-0 dims.
pub fn nonempty_shape(rank: RangeInclusive<usize>) -> BoxedStrategy<Vec<i64>> {
    proptest::collection::vec(nonzero_dim(), rank).boxed()
}

/// NumPy-style broadcast of two shapes, or `None` where they do not broadcast.
pub fn broadcast_shape(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Two shapes that broadcast together, with their broadcast result: the operands drop leading
/// dims and turn dims into 1 at random (scalars included).
pub fn broadcast_pair(rank: RangeInclusive<usize>) -> BoxedStrategy<(Vec<i64>, Vec<i64>, Vec<i64>)> {
    shape(rank)
        .prop_flat_map(|out| {
            let n = out.len();
            let operand = move |out: Vec<i64>| {
                (0..=n, proptest::collection::vec(any::<bool>(), n)).prop_map(move |(drop, ones)| {
                    out.iter().zip(&ones).skip(drop).map(|(&d, &one)| if one { 1 } else { d }).collect::<Vec<i64>>()
                })
            };
            (operand(out.clone()), operand(out.clone()), Just(out))
        })
        .prop_map(|(a, b, _)| {
            let y = broadcast_shape(&a, &b).expect("operands of one shape broadcast");
            (a, b, y)
        })
        .boxed()
}

/// float32 (mostly) or float16.
pub fn float_dtype() -> BoxedStrategy<DType> {
    prop_oneof![3 => Just(DType::F32), 1 => Just(DType::F16)].boxed()
}

/// One of `dtypes`.
pub fn dtype_of(dtypes: &'static [DType]) -> BoxedStrategy<DType> {
    select(dtypes).boxed()
}

/// An axis of a rank-`rank` tensor, negative half the time.
pub fn axis(rank: usize) -> BoxedStrategy<i64> {
    let r = rank.max(1) as i64;
    (-r..r).boxed()
}

/// An opset version in `range`.
pub fn opset(range: RangeInclusive<u32>) -> BoxedStrategy<u32> {
    range.boxed()
}

/// A seed for the input values.
pub fn seed() -> BoxedStrategy<u64> {
    (0..1_000_000u64).boxed()
}

/// Distinct axes (a subset of `0..rank`, each possibly written negative), in random order.
pub fn axes_subset(rank: usize) -> BoxedStrategy<Vec<i64>> {
    let r = rank as i64;
    (proptest::collection::vec(any::<bool>(), rank), proptest::collection::vec(any::<bool>(), rank))
        .prop_map(move |(keep, neg)| {
            (0..r).filter(|&i| keep[i as usize]).map(|i| if neg[i as usize] { i - r } else { i }).collect()
        })
        .boxed()
}

/// ONNX's float8 types for specs: (TensorProto code, largest finite value, the largest
/// magnitude whose non-saturating conversion ORT 1.31's CPU EP performs as ONNX defines it;
/// `ep_core::float8` says where it departs beyond that).
pub const FLOAT8: &[(i64, f64, f64)] =
    &[(17, 448.0, 470.0), (18, 240.0, 1e6), (19, 57344.0, 61000.0), (20, 57344.0, 1e6)];
