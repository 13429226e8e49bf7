//! SVMRegressor over `[N, F]` float32 features, `[N, 1]` float32 out, as ORT's CPU EP computes
//! it: with support vectors, `sum_j coefficients[j] * K(x, sv_j) + rho` for the kernel
//! LINEAR (`x . sv`), POLY (`(gamma * x . sv + coef0) ^ degree`), RBF
//! (`exp(-gamma * |x - sv|^2)`) or SIGMOID (`tanh(gamma * x . sv + coef0)`), `kernel_params`
//! being `[gamma, coef0, degree]`; without (`n_supports` 0), the linear `x . coefficients +
//! rho`; with `one_class`, 1 where that is positive and -1 elsewhere. `post_transform` NONE.

use crate::{ML, floats};
use ep_core::lowering::{FnLowering, require_input_rank, require_inputs, require_types};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    Linear,
    Poly,
    Rbf,
    Sigmoid,
}

/// An SVM's kernel and its `kernel_params` (`[gamma, coef0, degree]`, zeros when empty).
#[derive(Clone, Copy)]
pub(crate) struct KernelOf {
    pub kernel: Kernel,
    gamma: f32,
    coef0: f32,
    degree: f32,
}

impl KernelOf {
    /// `kernel_type` and `kernel_params` as ORT reads them (the attribute is required; an
    /// empty list keeps its zeros, a shorter one is refused).
    pub(crate) fn of(node: &NodeInfo) -> std::result::Result<KernelOf, String> {
        let kernel = match node.attr("kernel_type") {
            None => Kernel::Linear,
            Some(AttrValue::String(k)) => match k.as_str() {
                "LINEAR" => Kernel::Linear,
                "POLY" => Kernel::Poly,
                "RBF" => Kernel::Rbf,
                "SIGMOID" => Kernel::Sigmoid,
                other => return Err(format!("kernel_type={other} is unknown")),
            },
            Some(other) => return Err(format!("kernel_type={other:?} is not a string")),
        };
        let params = match node.attr("kernel_params") {
            Some(AttrValue::Floats(p)) if p.is_empty() || p.len() >= 3 => p.as_slice(),
            other => return Err(format!("kernel_params={other:?} (three values, [gamma, coef0, degree], are needed)")),
        };
        let param = |i: usize| params.get(i).copied().unwrap_or(0.0);
        Ok(KernelOf { kernel, gamma: param(0), coef0: param(1), degree: param(2) })
    }

    /// `K(x_n, sv_v)`, `[N, vectors]`, for `x` `[N, F]` and the support vectors `[vectors, F]`.
    pub(crate) fn matrix(&self, x: &Array, sv: &Array, s: &Stream) -> Result<Array> {
        let (rows, vectors, features) = (x.shape()[0], sv.shape()[0], x.shape()[1]);
        Ok(match self.kernel {
            Kernel::Rbf => {
                // Differences first (as ORT sums them) while `[N, vectors, F]` stays small;
                // larger, |x|^2 + |sv|^2 - 2 x . sv (a few ulps apart where x is near sv).
                let sq = if rows.saturating_mul(vectors).saturating_mul(features) <= RBF_DIFFERENCES_MAX {
                    let d = ops::subtract(&ops::expand_dims(x, 1, s)?, &ops::expand_dims(sv, 0, s)?, s)?;
                    ops::sum_axes(&ops::multiply(&d, &d, s)?, &[2], false, s)?
                } else {
                    let xx = ops::sum_axes(&ops::multiply(x, x, s)?, &[1], true, s)?;
                    let vv = ops::sum_axes(&ops::multiply(sv, sv, s)?, &[1], false, s)?;
                    let dot = ops::matmul(x, &ops::transpose_axes(sv, &[1, 0], s)?, s)?;
                    let sq = ops::subtract(&ops::add(&xx, &vv, s)?, &ops::multiply(&dot, &scalar(2.0, s)?, s)?, s)?;
                    ops::maximum(&sq, &scalar(0.0, s)?, s)?
                };
                ops::exp(&ops::multiply(&sq, &scalar(-self.gamma, s)?, s)?, s)?
            }
            kernel => {
                let dot = ops::matmul(x, &ops::transpose_axes(sv, &[1, 0], s)?, s)?;
                let affine = || -> Result<Array> {
                    Ok(ops::add(&ops::multiply(&dot, &scalar(self.gamma, s)?, s)?, &scalar(self.coef0, s)?, s)?)
                };
                match kernel {
                    Kernel::Poly => ops::power(&affine()?, &scalar(self.degree, s)?, s)?,
                    Kernel::Sigmoid => ops::tanh(&affine()?, s)?,
                    _ => dot,
                }
            }
        })
    }
}

struct Svm<'a> {
    kernel: KernelOf,
    vectors: i64,
    support: &'a [f32],
    coefficients: &'a [f32],
    rho: f32,
    one_class: bool,
}

fn svm(node: &NodeInfo) -> std::result::Result<Svm<'_>, String> {
    match node.attr("post_transform") {
        None => {}
        Some(AttrValue::String(t)) if t == "NONE" => {}
        Some(other) => return Err(format!("post_transform={other:?} is not supported (NONE is)")),
    }
    let mut kernel = KernelOf::of(node)?;
    let vectors = node.attr_int("n_supports", 0)?;
    let (support, coefficients) = (floats(node, "support_vectors"), floats(node, "coefficients"));
    let rho = floats(node, "rho");
    if vectors < 0 || rho.len() != 1 || coefficients.is_empty() {
        return Err(format!(
            "n_supports={vectors}, {} rho value(s) and {} coefficients (one rho and some coefficients are needed)",
            rho.len(),
            coefficients.len()
        ));
    }
    if vectors > 0
        && (support.is_empty() || support.len() % vectors as usize != 0 || coefficients.len() != vectors as usize)
    {
        return Err(format!(
            "{} support vector values and {} coefficients for {vectors} vectors",
            support.len(),
            coefficients.len()
        ));
    }
    // Without support vectors the model is linear whatever the kernel named.
    if vectors == 0 {
        kernel.kernel = Kernel::Linear;
    }
    Ok(Svm { kernel, vectors, support, coefficients, rho: rho[0], one_class: node.attr_int("one_class", 0)? != 0 })
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_types(node, &[ElemType::F32])?;
    require_input_rank(node, 0, 2..=2)?;
    let m = svm(node).map_err(Decline)?;
    // A declared feature count the model does not take: ORT's CPU EP says why.
    let wanted = if m.vectors == 0 { m.coefficients.len() as i64 } else { m.support.len() as i64 / m.vectors };
    if let Some(Some(f)) = node.input(0).and_then(|v| v.shape.as_ref()).and_then(|s| s.get(1).copied())
        && f != wanted
    {
        return Err(Decline(format!("the input has {f} features, the model {wanted}")));
    }
    Ok(())
}

/// The most elements of RBF's `[rows, vectors, features]` differences built at once (64 MiB of
/// float32).
const RBF_DIFFERENCES_MAX: i64 = 1 << 24;

pub(crate) fn scalar(v: f32, s: &Stream) -> Result<Array> {
    Ok(ops::scalar(f64::from(v), Dtype::F32, s)?)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let m = svm(node).map_err(ep_core::Error::new)?;
    let (x, s) = (ctx.input(0)?, ctx.stream());
    let features = x.shape()[1];
    let sum = if m.vectors == 0 {
        if m.coefficients.len() as i64 != features {
            return Err(ep_core::Error::new(format!("{} coefficients for {features} features", m.coefficients.len())));
        }
        ops::matmul(x, &Array::from_slice(m.coefficients, &[features, 1])?, s)?
    } else {
        let per = m.support.len() as i64 / m.vectors;
        if per != features {
            return Err(ep_core::Error::new(format!("support vectors of {per} features, the input has {features}")));
        }
        let sv = Array::from_slice(m.support, &[m.vectors, features])?;
        // [N, vectors]
        let k = m.kernel.matrix(x, &sv, s)?;
        ops::matmul(&k, &Array::from_slice(m.coefficients, &[m.vectors, 1])?, s)?
    };
    let y = ops::add(&sum, &scalar(m.rho, s)?, s)?;
    if !m.one_class {
        return Ok(vec![y]);
    }
    let positive = ops::greater(&y, &scalar(0.0, s)?, s)?;
    Ok(vec![ops::where_(&positive, &scalar(1.0, s)?, &scalar(-1.0, s)?, s)?])
}

ep_core::register_lowering!(
    SVM_REGRESSOR = FnLowering {
        domain: ML,
        op: "SVMRegressor",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, register_spec};

    register_spec!(super::SVM_REGRESSOR, || {
        (
            (1..=6i64, 1..=5i64, 0..=6i64),
            select(&["LINEAR", "POLY", "RBF", "SIGMOID"][..]),
            (any::<bool>(), 0..4u8),
            seed(),
        )
            .prop_map(|((n, features, vectors), kernel, (one_class, degree), seed)| {
                let mut r = seed.wrapping_add(0x5851_f42d_4c95_7f2d);
                let mut next = move || {
                    r = r.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    ((r >> 40) % 17) as f32 * 0.125 - 1.0
                };
                let support: Vec<f32> = (0..vectors * features).map(|_| next()).collect();
                let coefficients: Vec<f32> =
                    (0..vectors.max(1) * if vectors == 0 { features } else { 1 }).map(|_| next()).collect();
                let mut case = Case::domain_op("ai.onnx.ml", "SVMRegressor", 1)
                    .input("x", DType::F32, &[n, features])
                    .attr_str("kernel_type", kernel)
                    .attr("kernel_params", Attr::Floats(vec![0.5, 0.25, f32::from(degree) + 1.0]))
                    .attr_int("n_supports", vectors)
                    .attr("coefficients", Attr::Floats(coefficients))
                    .attr("rho", Attr::Floats(vec![next()]))
                    .attr_int("one_class", i64::from(one_class));
                if vectors > 0 {
                    case = case.attr("support_vectors", Attr::Floats(support));
                }
                case.output("y", DType::F32, &[n, 1]).with_seed(seed)
            })
            .boxed()
    });
}
