//! MatMul (NumPy semantics, any batch rank) and Gemm (`alpha * A' @ B' + beta * C`).
//! Both are shape-agnostic and compile shapeless.
//! ORT rewrites MatMul followed by Add into Gemm before the EP sees the graph.

use ep_core::lowering::{FLOATS, require_input_rank, require_inputs, require_types};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, Lowering, NodeInfo, Result, bail};
use std::ops::RangeInclusive;

/// Whether `a @ b`'s batch dimensions broadcast as ORT's CPU EP allows: where every batch
/// dimension of a matrix `b` is 1 (or it has none) and `fold` (`a` not transposed), `a`'s rows
/// are multiplied as one matrix, whatever its batch (an empty one too); otherwise each pair
/// of dimensions must be equal, or one of them 1 and the other not 0 (an empty batch does
/// not broadcast against a batch of one, nor the other way round).
pub(crate) fn check_batch_broadcast(a: &[i64], b: &[i64], fold: bool) -> Result<()> {
    if fold && a.len() >= 2 && b.len() >= 2 && b[..b.len() - 2].iter().all(|&d| d == 1) {
        return Ok(());
    }
    let a_batch = if b.len() == 1 { &a[..a.len().saturating_sub(1)] } else { &a[..a.len().saturating_sub(2)] };
    let a_batch = if a.len() == 1 { &[][..] } else { a_batch };
    let b_batch = &b[..b.len().saturating_sub(2)];
    let n = a_batch.len().max(b_batch.len());
    let dim = |v: &[i64], i: usize| if i + v.len() < n { 1 } else { v[i + v.len() - n] };
    for i in 0..n {
        let (l, r) = (dim(a_batch, i), dim(b_batch, i));
        if !(l == r || (l == 1 && r != 0) || (r == 1 && l != 0)) {
            bail!("the batch dims of {a:?} and {b:?} do not broadcast (axis {i}: {l} and {r})");
        }
    }
    Ok(())
}

pub struct MatMul;

impl Lowering for MatMul {
    fn op_type(&self) -> &'static str {
        "MatMul"
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        1..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 2, 2)?;
        // (float64 on MLX's CPU backend; on a GPU the engine leaves float64 nodes to ORT.)
        require_types(node, &[ElemType::F32, ElemType::F16, ElemType::BF16, ElemType::F64])?;
        // MLX's matmul has NumPy's semantics at every rank: an unknown rank (a dynamic Reshape
        // in front) is fine; a known one must be at least 1.
        for i in 0..2 {
            if ep_core::lowering::input_rank(node, i) == Some(0) {
                return Err(Decline::new("MatMul of a scalar"));
            }
        }
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<Array>> {
        let (a, b) = (ctx.input(0)?.shape(), ctx.input(1)?.shape());
        check_batch_broadcast(&a, &b, true)?;
        // A weight its producer published in MLX's quantized form (a DequantizeLinear of a
        // constant): multiplied as it is stored, not dequantized.
        if let Some(w) = ctx.affine_weight(1, false)
            && b == [w.k, w.n]
            && a.last() == Some(&w.k)
        {
            return Ok(vec![w.matmul(ctx.input(0)?, ctx.stream())?]);
        }
        Ok(vec![ops::matmul(ctx.input(0)?, ctx.input(1)?, ctx.stream())?])
    }

    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Shapeless
    }
}

pub struct Gemm;

impl Lowering for Gemm {
    fn op_type(&self) -> &'static str {
        "Gemm"
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        7..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 2, 3)?;
        require_types(node, FLOATS)?;
        require_input_rank(node, 0, 2..=2)?;
        require_input_rank(node, 1, 2..=2)?;
        if node.input(2).is_some() {
            require_input_rank(node, 2, 0..=2)?;
        }
        for flag in ["transA", "transB"] {
            let v = node.attr_int(flag, 0)?;
            if v != 0 && v != 1 {
                return Err(Decline(format!("attribute {flag}={v} is not 0 or 1")));
            }
        }
        node.attr_float("alpha", 1.0)?;
        node.attr_float("beta", 1.0)?;
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let s = ctx.stream();
        let alpha = node.attr_float("alpha", 1.0).map_err(ep_core::Error::new)?;
        let beta = node.attr_float("beta", 1.0).map_err(ep_core::Error::new)?;
        // A transposed weight is computed once per session (derived constant), not per run.
        let transposed = |i: usize, flag: &str| -> Result<Array> {
            if node.attr_int(flag, 0).map_err(ep_core::Error::new)? == 1 {
                ctx.derived(i, "transpose", |x, s| Ok(ops::transpose(x, s)?))
            } else {
                Ok(ctx.input(i)?.clone())
            }
        };
        let a = transposed(0, "transA")?;
        // A weight its producer published in MLX's quantized form (a DequantizeLinear of a
        // constant, for B or, with transB, for B's transpose): multiplied as it is stored.
        let trans_b = node.attr_int("transB", 0).map_err(ep_core::Error::new)? == 1;
        let b_shape = ctx.input(1)?.shape();
        let quantized = ctx.affine_weight(1, trans_b).filter(|w| {
            let kn = if trans_b { [w.n, w.k] } else { [w.k, w.n] };
            b_shape == kn && a.shape().last() == Some(&w.k)
        });
        // `alpha * (A' @ B') + beta * C` as a product and a broadcasting add, not MLX's fused
        // addmm: compiled shapeless, addmm keeps the trace's shape for C and corrupts memory
        // when a later call has fewer rows (MLX 0.32.2).
        let mut out = match quantized {
            Some(w) => w.matmul(&a, s)?,
            None => ops::matmul(&a, &transposed(1, "transB")?, s)?,
        };
        if alpha != 1.0 {
            out = ops::scale(&out, alpha, s)?;
        }
        // C broadcasts to [M, N] one way only (each dim 1 or equal), as ORT's CPU EP requires,
        // whatever beta is.
        if let Some(c) = ctx.optional_input(2) {
            let (cs, ys) = (c.shape(), out.shape());
            if cs.len() > 2 || cs.iter().rev().zip(ys.iter().rev()).any(|(&d, &y)| d != 1 && d != y) {
                ep_core::bail!("C {cs:?} does not broadcast to the product's {ys:?}");
            }
        }
        if let Some(c) = ctx.optional_input(2).filter(|_| beta != 0.0) {
            let c = if beta == 1.0 { c.clone() } else { ops::scale(c, beta, s)? };
            out = ops::add(&out, &c, s)?;
        }
        Ok(vec![out])
    }

    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Shapeless
    }
}

ep_core::register_lowering!(MATMUL = MatMul);
ep_core::register_lowering!(GEMM = Gemm);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec, strategy::broadcast_shape};

    const UNIT: Values = Values::Uniform { lo: -1.0, hi: 1.0 };

    /// Batched, broadcast and 1-D operands; `k` up to 8.
    fn matmul() -> BoxedStrategy<Case> {
        let dims = (1..=5i64, 1..=8i64, 1..=5i64);
        let types = prop_oneof![6 => float_dtype(), 1 => Just(DType::F64)];
        (types, broadcast_pair(0..=2), dims, 0..4u8, opset(7..=22), seed())
            .prop_map(|(t, (ba, bb, _), (m, k, n), vector, v, seed)| {
                // ORT's CPU MatMul rejects empty batch dims.
                let ba: Vec<i64> = ba.iter().map(|&d| d.max(1)).collect();
                // ORT's CPU MatMul broadcasts batch dims only one way round: `b`'s batch dims are
                // none, or a suffix of `a`'s.
                let bb = if bb.len() <= ba.len() && bb.iter().all(|&d| d == 1) {
                    vec![]
                } else {
                    ba[ba.len().saturating_sub(bb.len())..].to_vec()
                };
                // vector: 1 = a is 1-D, 2 = b is 1-D, 3 = both.
                let a: Vec<i64> = if vector & 1 != 0 { vec![k] } else { [ba.clone(), vec![m, k]].concat() };
                let b: Vec<i64> = if vector & 2 != 0 { vec![k] } else { [bb.clone(), vec![k, n]].concat() };
                let batch = match vector {
                    0 => broadcast_shape(&ba, &bb).expect("broadcastable"),
                    1 => bb.clone(),
                    2 => ba.clone(),
                    _ => vec![],
                };
                let mut y = batch;
                if vector & 1 == 0 {
                    y.push(m);
                }
                if vector & 2 == 0 {
                    y.push(n);
                }
                Case::op("MatMul", v)
                    .input_with("a", t, &a, UNIT)
                    .input_with("b", t, &b, UNIT)
                    .output("y", t, &y)
                    .with_seed(seed)
            })
            .boxed()
    }

    /// Transposes, alpha/beta, and every broadcastable form of C (absent from opset 11).
    fn gemm() -> BoxedStrategy<Case> {
        let scale = || select(&[1.0f32, 0.5, 2.0, -1.0][..]);
        (
            float_dtype(),
            (1..=6i64, 1..=8i64, 1..=6i64),
            any::<(bool, bool)>(),
            (scale(), scale()),
            0..6u8,
            opset(7..=22),
            seed(),
        )
            .prop_map(|(t, (m, k, n), (ta, tb), (alpha, beta), c_form, v, seed)| {
                let a = if ta { [k, m] } else { [m, k] };
                let b = if tb { [n, k] } else { [k, n] };
                let mut case = Case::op("Gemm", v).input_with("a", t, &a, UNIT).input_with("b", t, &b, UNIT);
                let c: Option<Vec<i64>> = match c_form {
                    0 if v >= 11 => None,
                    0 | 1 => Some(vec![n]),
                    2 => Some(vec![]),
                    3 => Some(vec![1, n]),
                    4 => Some(vec![m, 1]),
                    _ => Some(vec![m, n]),
                };
                if let Some(c) = c {
                    case = case.input_with("c", t, &c, UNIT);
                }
                case.output("y", t, &[m, n])
                    .attr_int("transA", ta as i64)
                    .attr_int("transB", tb as i64)
                    .attr_float("alpha", alpha)
                    .attr_float("beta", beta)
                    .with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::MATMUL, matmul);
    register_spec!(super::GEMM, gemm);
}

#[cfg(test)]
mod tests {
    use super::check_batch_broadcast;

    /// What ORT 1.31's CPU EP answers (MatMul, and FusedMatMul with `transA`: no folding).
    #[test]
    fn empty_batches_broadcast_as_the_cpu_ep_has_them() {
        let fine = |a: &[i64], b: &[i64], fold: bool| check_batch_broadcast(a, b, fold).is_ok();
        // b's batch all ones (or none): a's rows as one matrix, an empty batch too.
        assert!(fine(&[0, 1, 3], &[1, 3, 2], true));
        assert!(fine(&[0, 1, 3], &[3, 2], true));
        assert!(fine(&[2, 0, 1, 3], &[1, 1, 3, 2], true));
        assert!(fine(&[2, 0, 1, 3], &[1, 3, 2], true));
        // Otherwise 0 against 1 is refused, either way round, and a transposed a never folds.
        assert!(!fine(&[2, 0, 1, 3], &[2, 1, 3, 2], true));
        assert!(!fine(&[5, 1, 1, 3], &[5, 0, 3, 2], true));
        assert!(!fine(&[0, 2, 1, 3], &[1, 2, 3, 2], true));
        assert!(!fine(&[0, 1, 3], &[3], true));
        assert!(!fine(&[0, 1, 3], &[1, 3, 2], false));
        assert!(!fine(&[0, 1, 3], &[3, 2], false));
        // Ordinary broadcasting.
        assert!(fine(&[2, 1, 4, 3], &[1, 5, 3, 2], false));
        assert!(!fine(&[2, 4, 3], &[3, 3, 2], true));
    }
}
