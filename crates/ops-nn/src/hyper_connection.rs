//! `com.microsoft` hyper-connection ops: a residual stream held as `C` parallel branches of
//! width `H`, either grouped `(..., C, H)` or flattened `(..., C * H)` (the `num_branches`
//! attribute set). Arithmetic in float32, rounded once to the stream's type, as ORT's CPU EP:
//! - BranchwiseRMSNorm: an RMS norm over each branch's `H` values, scaled by `(H)`, `(C * H)`
//!   or `(C, H)`;
//! - HyperConnectionPreMix: `y[..., h] = reduction_scale * sum_c x[..., c, h] * g[..., c, h]`;
//! - HyperConnectionPostMix: `y[..., c, h] = mix(x)[..., c, h] + g[..., c, h] * b[..., h]`,
//!   `mix(x)` the streams themselves or `sum_s m[..., s, c] * x[..., s, h]` with the optional
//!   `(..., C, C)` stream mix.
//!
//! A gate `g` is `(..., C)`, `(..., C, 1)` (one value per branch) or `(..., C, H)` (the
//! pre-mix's of flattened streams also `(..., C * H)`), its leading dimensions the streams'.

use crate::norm::{f32_of, rms_normalize};
use ep_core::lowering::{FLOATS, FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Stream, ops};
use ep_core::{CompileSafety, Decline, LowerCtx, NodeInfo, Result};

const MS: &str = "com.microsoft";

/// The streams' layout: the leading dimensions, the branch count and the branch width.
#[derive(Debug, PartialEq)]
struct Streams {
    prefix: Vec<i64>,
    branches: i64,
    hidden: i64,
    /// Read from `(..., C * H)`.
    flattened: bool,
}

impl Streams {
    /// As ORT resolves it: `num_branches` 0 reads `(..., C, H)`, a positive one splits the last
    /// dimension into `C` branches.
    fn resolve(shape: &[i64], num_branches: i64) -> std::result::Result<Streams, String> {
        let r = shape.len();
        if num_branches != 0 {
            if num_branches < 0 {
                return Err(format!("num_branches {num_branches} must be positive"));
            }
            let Some((&width, prefix)) = shape.split_last() else {
                return Err("flattened streams must have rank 1 or more".into());
            };
            if width <= 0 || width % num_branches != 0 {
                return Err(format!(
                    "the stream width {width} is not a positive multiple of num_branches {num_branches}"
                ));
            }
            let (branches, hidden) = (num_branches, width / num_branches);
            return Ok(Streams { prefix: prefix.to_vec(), branches, hidden, flattened: true });
        }
        if r < 2 {
            return Err(format!("grouped streams {shape:?} must have rank 2 or more"));
        }
        let (branches, hidden) = (shape[r - 2], shape[r - 1]);
        if branches <= 0 || hidden <= 0 {
            return Err(format!("the streams {shape:?} have an empty branch or hidden dimension"));
        }
        Ok(Streams { prefix: shape[..r - 2].to_vec(), branches, hidden, flattened: false })
    }

    /// `prefix + tail`.
    fn with(&self, tail: &[i64]) -> Vec<i64> {
        self.prefix.iter().chain(tail).copied().collect()
    }

    /// The streams as `(..., C, H)` in float32.
    fn grouped(&self, x: &Array, s: &Stream) -> Result<Array> {
        Ok(ops::reshape(&f32_of(x, s)?, &self.with(&[self.branches, self.hidden]), s)?)
    }

    /// A gate as `(..., C, 1)` or `(..., C, H)` in float32, after ORT's shape check;
    /// `flat_feature`: flattened streams also take a `(..., C * H)` gate (the pre-mix's).
    fn gate(&self, g: &Array, flat_feature: bool, s: &Stream) -> Result<Array> {
        let shape = g.shape();
        let p = self.prefix.len();
        let (c, h) = (self.branches, self.hidden);
        let tail = if shape.len() >= p && shape[..p] == self.prefix[..] { &shape[p..] } else { &[][..] };
        let per_branch = tail == [c] || tail == [c, 1];
        let flat = flat_feature && self.flattened && tail == [c * h];
        if !per_branch && !flat && tail != [c, h] {
            ep_core::bail!(
                "the gate {shape:?} must be the streams' leading dimensions followed by (C), (C, 1){} or (C, H) with C {c}, H {h}",
                if flat_feature && self.flattened { ", (C * H)" } else { "" }
            );
        }
        Ok(ops::reshape(&f32_of(g, s)?, &self.with(&[c, if per_branch { 1 } else { h }]), s)?)
    }
}

fn num_branches(node: &NodeInfo) -> Result<i64> {
    Ok(node.attr_int("num_branches", 0)?)
}

fn claim_floats(node: &NodeInfo, min: usize, max: usize) -> std::result::Result<(), Decline> {
    require_inputs(node, min, max)?;
    for i in 0..max {
        require_input_type(node, i, FLOATS)?;
    }
    if node.attr_int("num_branches", 0)? < 0 {
        return Err(Decline("num_branches is negative".into()));
    }
    Ok(())
}

fn claim_branchwise(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_floats(node, 1, 2)
}

fn lower_branchwise(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let shape = x.shape();
    let st = Streams::resolve(&shape, num_branches(node)?).map_err(ep_core::Error::new)?;
    let (c, h) = (st.branches, st.hidden);
    let scale = match ctx.optional_input(1) {
        None => None,
        Some(k) => {
            let ks = k.shape();
            let to = match ks[..] {
                [n] if n == h => vec![h],
                [n] if n == c * h => vec![c, h],
                [a, b] if a == c && b == h => vec![c, h],
                _ => ep_core::bail!("the scale {ks:?} must have shape (H), (C * H) or (C, H) with C {c}, H {h}"),
            };
            Some(ops::reshape(&f32_of(k, s)?, &to, s)?)
        }
    };
    let eps = node.attr_float("epsilon", 1e-5)? as f64;
    let (y, _) = rms_normalize(&st.grouped(x, s)?, scale.as_ref(), &[-1], eps, s)?;
    Ok(vec![ops::reshape(&ops::astype(&y, x.dtype(), s)?, &shape, s)?])
}

ep_core::register_lowering!(
    BRANCHWISE_RMS_NORM = FnLowering {
        domain: MS,
        op: "BranchwiseRMSNorm",
        opsets: 1..=i32::MAX,
        claim: claim_branchwise,
        lower: lower_branchwise,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_pre_mix(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_floats(node, 2, 2)
}

fn lower_pre_mix(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let st = Streams::resolve(&x.shape(), num_branches(node)?).map_err(ep_core::Error::new)?;
    let gate = st.gate(ctx.input(1)?, true, s)?;
    let mixed = ops::sum_axes(&ops::multiply(&st.grouped(x, s)?, &gate, s)?, &[-2], false, s)?;
    let scale = node.attr_float("reduction_scale", 1.0)? as f64;
    let y = ops::multiply(&mixed, &ops::scalar(scale, mixed.dtype(), s)?, s)?;
    Ok(vec![ops::astype(&y, x.dtype(), s)?])
}

ep_core::register_lowering!(
    PRE_MIX = FnLowering {
        domain: MS,
        op: "HyperConnectionPreMix",
        opsets: 1..=i32::MAX,
        claim: claim_pre_mix,
        lower: lower_pre_mix,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_post_mix(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim_floats(node, 3, 4)
}

fn lower_post_mix(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let shape = x.shape();
    let st = Streams::resolve(&shape, num_branches(node)?).map_err(ep_core::Error::new)?;
    let (c, h) = (st.branches, st.hidden);
    let branch = ctx.input(1)?;
    if branch.shape() != st.with(&[h]) {
        ep_core::bail!("the branch output {:?} must have shape {:?}", branch.shape(), st.with(&[h]));
    }
    let gate = st.gate(ctx.input(2)?, false, s)?;
    let grouped = st.grouped(x, s)?;
    let streams = match ctx.optional_input(3) {
        None => grouped,
        Some(m) => {
            if m.shape() != st.with(&[c, c]) {
                ep_core::bail!("the stream mix {:?} must have shape {:?}", m.shape(), st.with(&[c, c]));
            }
            // sum over the source branch s of m[..., s, c] * x[..., s, h]: (..., S, C, 1) times
            // (..., S, 1, H), summed over S: float32 products on every device (a matrix product
            // could run in TF32 on a GPU), summed in MLX's order rather than ORT's loop's.
            let m = ops::reshape(&f32_of(m, s)?, &st.with(&[c, c, 1]), s)?;
            let x = ops::reshape(&grouped, &st.with(&[c, 1, h]), s)?;
            ops::sum_axes(&ops::multiply(&m, &x, s)?, &[-3], false, s)?
        }
    };
    let b = ops::reshape(&f32_of(branch, s)?, &st.with(&[1, h]), s)?;
    let y = ops::add(&streams, &ops::multiply(&gate, &b, s)?, s)?;
    Ok(vec![ops::reshape(&ops::astype(&y, x.dtype(), s)?, &shape, s)?])
}

ep_core::register_lowering!(
    POST_MIX = FnLowering {
        domain: MS,
        op: "HyperConnectionPostMix",
        opsets: 1..=i32::MAX,
        claim: claim_post_mix,
        lower: lower_post_mix,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(test)]
mod tests {
    use super::Streams;

    #[test]
    fn streams_resolve_as_ort_reads_them() {
        let grouped = Streams::resolve(&[2, 3, 4, 8], 0).unwrap();
        assert_eq!(grouped, Streams { prefix: vec![2, 3], branches: 4, hidden: 8, flattened: false });
        let flat = Streams::resolve(&[2, 32], 4).unwrap();
        assert_eq!(flat, Streams { prefix: vec![2], branches: 4, hidden: 8, flattened: true });
        assert!(Streams::resolve(&[8], 0).is_err(), "grouped streams need rank 2");
        assert!(Streams::resolve(&[2, 30], 4).is_err(), "a width not a multiple of the branches");
        assert!(Streams::resolve(&[2, 0, 8], 0).is_err(), "no branches");
        assert!(Streams::resolve(&[2, 8], -2).is_err(), "a negative branch count");
    }
}

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    /// Streams `(prefix, C, H)`, grouped or flattened (`num_branches` then set), of a float type.
    fn streams() -> impl Strategy<Value = (DType, Vec<i64>, i64, i64, bool)> {
        (dtype_of(&[DType::F32, DType::F16, DType::BF16]), nonempty_shape(0..=2), 1..=4i64, 1..=8i64, any::<bool>())
    }

    fn stream_shape(prefix: &[i64], c: i64, h: i64, flat: bool) -> Vec<i64> {
        let tail = if flat { vec![c * h] } else { vec![c, h] };
        prefix.iter().copied().chain(tail).collect()
    }

    /// A gate of each accepted layout: `(C)`, `(C, 1)` or `(C, H)` after the prefix, and
    /// `(C * H)` where `flat` (the pre-mix's, of flattened streams).
    fn gate_shape(prefix: &[i64], c: i64, h: i64, pick: u8, flat: bool) -> Vec<i64> {
        let tail = match pick % 4 {
            0 => vec![c],
            1 => vec![c, 1],
            3 if flat => vec![c * h],
            _ => vec![c, h],
        };
        prefix.iter().copied().chain(tail).collect()
    }

    fn base(op: &str, c: i64, flat: bool) -> Case {
        let case = Case::domain_op("com.microsoft", op, 1);
        if flat { case.attr_int("num_branches", c) } else { case }
    }

    register_spec!(super::BRANCHWISE_RMS_NORM, || {
        (streams(), 0..4u8, seed())
            .prop_map(|((t, prefix, c, h, flat), pick, seed)| {
                let x = stream_shape(&prefix, c, h, flat);
                let case = base("BranchwiseRMSNorm", c, flat).input("x", t, &x);
                let case = match pick {
                    0 => case,
                    1 => case.input("scale", DType::F32, &[h]),
                    2 => case.input("scale", t, &[c * h]),
                    _ => case.input("scale", t, &[c, h]),
                };
                case.attr_float("epsilon", 1e-5).output("y", t, &x).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::PRE_MIX, || {
        (streams(), 0..4u8, any::<bool>(), seed())
            .prop_map(|((t, prefix, c, h, flat), pick, scaled, seed)| {
                let x = stream_shape(&prefix, c, h, flat);
                let y: Vec<i64> = prefix.iter().copied().chain([h]).collect();
                let case = base("HyperConnectionPreMix", c, flat).input("streams", t, &x).input(
                    "pre_mix",
                    DType::F32,
                    &gate_shape(&prefix, c, h, pick, flat),
                );
                let case = if scaled { case.attr_float("reduction_scale", 0.25) } else { case };
                case.output("y", t, &y).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::POST_MIX, || {
        (streams(), 0..3u8, any::<bool>(), seed())
            .prop_map(|((t, prefix, c, h, flat), pick, mix, seed)| {
                let x = stream_shape(&prefix, c, h, flat);
                let b: Vec<i64> = prefix.iter().copied().chain([h]).collect();
                let case = base("HyperConnectionPostMix", c, flat)
                    .input("streams", t, &x)
                    .input("branch_output", t, &b)
                    .input("post_mix", DType::F32, &gate_shape(&prefix, c, h, pick, false));
                // (The stream mix shares the post-mix's type, M.)
                let m: Vec<i64> = prefix.iter().copied().chain([c, c]).collect();
                let case = if mix {
                    case.input_with("stream_mix", DType::F32, &m, Values::Uniform { lo: 0.0, hi: 1.0 })
                } else {
                    case
                };
                case.output("y", t, &x).with_seed(seed)
            })
            .boxed()
    });
}
