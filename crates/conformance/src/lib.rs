//! Differential testing of the MLX EP against ONNX Runtime's CPU EP.
//!
//! Every op crate registers a [`conformance_spec::OpSpec`] per lowering (behind its
//! `conformance` feature). [`suite::run`] draws cases from each spec's `proptest` strategy,
//! builds each as a model ([`model`]), runs it on the CPU EP and on the MLX EP, asserts through
//! ORT's assignment info that the MLX EP ran every node (a declined case is reported as
//! *declined*, never as passed), and compares outputs within [`tolerance`]. A failing case is
//! shrunk and saved under `target/conformance/failures/` with a command that replays it.

pub mod chains;
pub mod fuzz;
pub mod model;
pub mod suite;

pub use conformance_spec::{Case, DType};

use mlx_ep_host::ort::value::TensorElementType;
use mlx_ep_host::values::{self, HostTensor};
use mlx_ep_host::{Ep, MLX_EP, assignment, ep_of, session_builder};

/// References every op crate, so the linker keeps their registrations (lowerings and specs)
/// in a binary that only reads the registries.
pub fn link_op_crates() {
    ep_core::registry::keep_families(onnxruntime_mlx_ep::families());
}

/// Tolerance `(atol, rtol)` per element type: a value passes when
/// `|mlx - cpu| <= atol` or `|mlx - cpu| <= rtol * max(|mlx|, |cpu|)` (`approx::relative_eq`;
/// NaN matches NaN, infinities match exactly).
/// Integers and bools are exact; shapes and element types are always exact.
pub fn tolerance(t: DType) -> (f64, f64) {
    match t {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (1e-3, 2e-3),
        DType::BF16 => (8e-3, 1.6e-2),
        DType::F64 => (1e-12, 1e-12),
        _ => (0.0, 0.0),
    }
}

/// What happened to one case.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// MLX ran every node and matched the CPU EP; the largest differences seen.
    Passed { max_abs: f64, max_rel: f64 },
    /// A node of the case ran on another EP.
    Declined(String),
    /// Outputs differ, or the MLX session failed where the CPU EP did not.
    Failed(String),
    /// The CPU EP itself rejects the case: a defect of the spec, not of the lowering.
    Invalid(String),
}

impl Outcome {
    pub fn is_pass(&self) -> bool {
        matches!(self, Outcome::Passed { .. })
    }
}

/// Runs `case` on both EPs and compares.
/// A session builder for `ep` that computes exactly where ORT's CPU EP runs a node: ORT
/// rewrites a DequantizeLinear of a constant weight feeding a MatMul into MatMulNBits, which by
/// default quantizes the activations to 8 bits (`session.qdq_matmulnbits_accuracy_level` 4,
/// about 0.3% off); level 0 keeps them float (in the reference, and in an MLX session's nodes
/// left to the CPU EP).
pub fn builder_for(ep: Ep) -> mlx_ep_host::Result<mlx_ep_host::ort::session::builder::SessionBuilder> {
    Ok(session_builder(ep)?
        .with_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
        .map_err(mlx_ep_host::ort::Error::<()>::from)?)
}

/// The builder for ORT's CPU EP running `case`: a reference graph runs as written (ORT's
/// optimizer would fold its casts around a float32 op back into the float16 kernel it stands
/// in for).
pub fn cpu_builder_for(case: &Case) -> mlx_ep_host::Result<mlx_ep_host::ort::session::builder::SessionBuilder> {
    let builder = builder_for(Ep::Cpu)?;
    if case.reference.is_empty() {
        return Ok(builder);
    }
    Ok(builder
        .with_optimization_level(mlx_ep_host::ort::session::builder::GraphOptimizationLevel::Disable)
        .map_err(mlx_ep_host::ort::Error::<()>::from)?)
}

pub fn check(case: &Case) -> Outcome {
    if std::env::var_os("MLX_EP_CONFORMANCE_TRACE").is_some() {
        eprintln!("case: {}", serde_json::to_string(case).unwrap_or_default());
    }
    let inputs = match model::input_values(case) {
        Ok(v) => v,
        Err(e) => return Outcome::Invalid(format!("input values: {e}")),
    };
    let expected = match model::build_reference(case)
        .and_then(|m| Ok(m.into_session(&cpu_builder_for(case)?)?))
        .and_then(|mut s| values::run(&mut s, &inputs))
    {
        Ok(v) => v,
        Err(e) => return Outcome::Invalid(format!("the CPU EP rejects the case: {e}")),
    };
    let mut mlx = match model::build(case).and_then(|m| Ok(m.into_session(&builder_for(Ep::Mlx)?)?)) {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(format!("creating the MLX session: {e}")),
    };
    let placed = match assignment(&mlx) {
        Ok(a) => a,
        Err(e) => return Outcome::Failed(format!("reading ORT's assignment info: {e}")),
    };
    for node in &case.nodes {
        let ep = ep_of(&placed, &node.name);
        if ep.as_deref() != Some(MLX_EP) {
            return Outcome::Declined(format!(
                "node '{}' ({}) ran on {}",
                node.name,
                node.op,
                ep.as_deref().unwrap_or("no EP")
            ));
        }
    }
    match values::run(&mut mlx, &inputs) {
        Ok(got) => compare(case, &got, &expected),
        Err(e) => Outcome::Failed(format!("the MLX session failed: {e}")),
    }
}

/// Compares MLX's outputs with the CPU EP's, output by output.
pub fn compare(case: &Case, got: &[HostTensor], expected: &[HostTensor]) -> Outcome {
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    if got.len() != expected.len() {
        return Outcome::Failed(format!("MLX gave {} outputs, CPU {}", got.len(), expected.len()));
    }
    // Identities hold everywhere, on both EPs. One that fails on the CPU EP is the case's
    // defect (or a fuzzer's mutation of the values it is computed from), not the lowering's.
    let identity = |name: &str| case.identities.iter().any(|n| n == name);
    let broken = |outputs: &[HostTensor]| {
        outputs.iter().filter(|t| identity(&t.name)).find_map(|t| {
            t.values.iter().position(|&v| v == 0.0).map(|i| format!("identity '{}' is false at element {i}", t.name))
        })
    };
    if let Some(e) = broken(expected) {
        return Outcome::Invalid(format!("{e} on the CPU EP"));
    }
    if let Some(e) = broken(got) {
        return Outcome::Failed(format!("{e} on MLX"));
    }
    if case.compare == conformance_spec::Compare::Distribution {
        let pick = |v: &[HostTensor]| v.iter().filter(|t| !identity(&t.name)).cloned().collect::<Vec<_>>();
        return compare_distributions(&pick(got), &pick(expected));
    }
    for (g, e) in got.iter().zip(expected) {
        if g.shape != e.shape || g.elem_type != e.elem_type {
            return Outcome::Failed(format!(
                "output '{}' is {:?}{:?} on MLX, {:?}{:?} on CPU",
                g.name, g.elem_type, g.shape, e.elem_type, e.shape
            ));
        }
        let dtype = case.outputs.iter().find(|o| o.0 == g.name).map(|o| o.1).unwrap_or(DType::F32);
        let (atol, rtol) = tolerance(dtype);
        let atol = match case.compare {
            conformance_spec::Compare::Summed(k) => atol * f64::from(k.max(1)),
            _ => atol,
        };
        for (i, (&x, &y)) in g.values.iter().zip(&e.values).enumerate() {
            if (x.is_nan() && y.is_nan()) || x == y {
                continue;
            }
            let abs = (x - y).abs();
            let rel = abs / y.abs().max(f64::MIN_POSITIVE);
            let ok = abs.is_finite() && approx::relative_eq!(x, y, epsilon = atol, max_relative = rtol);
            if !ok {
                return Outcome::Failed(format!(
                    "output '{}' element {i} (of shape {:?}): MLX {x} vs CPU {y} (tolerance atol {atol}, rtol {rtol})",
                    g.name, g.shape
                ));
            }
            max_abs = max_abs.max(abs);
            max_rel = max_rel.max(rel);
        }
    }
    Outcome::Passed { max_abs, max_rel }
}

/// Mean and variance of `v`.
fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    (mean, v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n)
}

/// Outputs of random generators: equal shapes and types, as many NaNs and infinities, the CPU
/// EP's support where it is 0/1 or non-negative integers, and with enough finite samples (30;
/// 200 for the spread) means within five standard errors of each other and standard
/// deviations within 30%.
pub fn compare_distributions(got: &[HostTensor], expected: &[HostTensor]) -> Outcome {
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    for (g, e) in got.iter().zip(expected) {
        if g.shape != e.shape || g.elem_type != e.elem_type {
            return Outcome::Failed(format!(
                "output '{}' is {:?}{:?} on MLX, {:?}{:?} on CPU",
                g.name, g.elem_type, g.shape, e.elem_type, e.shape
            ));
        }
        // As many NaNs and infinities; the moments of the finite values.
        let kinds = |v: &[f64]| {
            [f64::is_nan, |x: f64| x == f64::INFINITY, |x: f64| x == f64::NEG_INFINITY]
                .map(|is| v.iter().filter(|&&x| is(x)).count())
        };
        // The infinities' signs split alike within five standard errors (an infinite scale
        // draws each sign at random; a sign drawn wrong everywhere fails from a few dozen).
        let ([gn, gp, gm], [en, ep, em]) = (kinds(&g.values), kinds(&e.values));
        let spread = 5.0 * ((gp + gm) as f64 * 0.25).sqrt() + 1.0;
        if gn != en || gp + gm != ep + em || (gp as f64 - ep as f64).abs() > spread {
            return Outcome::Failed(format!(
                "output '{}': NaN, +inf and -inf counts {:?} on MLX, {:?} on CPU",
                g.name,
                kinds(&g.values),
                kinds(&e.values)
            ));
        }
        // The support: 0/1 draws of a float type (Bernoulli's) stay 0/1, non-negative integer
        // draws (indices) stay so. (Integer draws are not held to 0/1: a few draws of class
        // indices may all be 0 or 1 on one side and not on the other.)
        let within = |v: &[f64], p: &dyn Fn(f64) -> bool| v.iter().all(|&x| p(x));
        let binary = |x: f64| x == 0.0 || x == 1.0;
        let index = |x: f64| x >= 0.0 && x.fract() == 0.0;
        let float = matches!(
            e.elem_type,
            TensorElementType::Float32
                | TensorElementType::Float64
                | TensorElementType::Float16
                | TensorElementType::Bfloat16
        );
        let supports: &[(&str, &dyn Fn(f64) -> bool)] = if float {
            &[("0 or 1", &binary), ("a non-negative integer", &index)]
        } else {
            &[("a non-negative integer", &index)]
        };
        for &(name, p) in supports {
            if within(&e.values, p) && !within(&g.values, p) {
                return Outcome::Failed(format!(
                    "output '{}': a value that is not {name} on MLX, unlike the CPU EP's",
                    g.name
                ));
            }
        }
        let finite = |v: &[f64]| v.iter().copied().filter(|x| x.is_finite()).collect::<Vec<f64>>();
        let (gf, ef) = (finite(&g.values), finite(&e.values));
        if gf.len() < 30 {
            continue;
        }
        let ((gm, gv), (em, ev)) = (moments(&gf), moments(&ef));
        let n = gf.len() as f64;
        let se = ((gv + ev) / n).sqrt();
        let gap = (gm - em).abs();
        if gap > 5.0 * se + 1e-6 * (1.0 + em.abs()) {
            return Outcome::Failed(format!(
                "output '{}': mean {gm} on MLX, {em} on CPU ({n} samples, standard error {se})",
                g.name
            ));
        }
        let (gs, es) = (gv.sqrt(), ev.sqrt());
        if n >= 200.0 && (gs - es).abs() > 0.3 * es.max(gs) + 1e-6 {
            return Outcome::Failed(format!("output '{}': standard deviation {gs} on MLX, {es} on CPU", g.name));
        }
        max_abs = max_abs.max(gap);
        max_rel = max_rel.max(gap / em.abs().max(f64::MIN_POSITIVE));
    }
    Outcome::Passed { max_abs, max_rel }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(values: Vec<f64>) -> Vec<HostTensor> {
        vec![HostTensor {
            name: "y".into(),
            elem_type: TensorElementType::Float32,
            shape: vec![values.len() as i64],
            values,
        }]
    }

    /// `n` evenly spread values of `[lo, hi)`, shuffled by a stride (a uniform sample without a
    /// generator).
    fn spread(n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|i| lo + (hi - lo) * ((i * 7919) % n) as f64 / n as f64).collect()
    }

    #[test]
    fn distributions_compare_by_mean_and_spread() {
        let cpu = samples(spread(512, 0.0, 1.0));
        assert!(compare_distributions(&samples(spread(512, 0.001, 1.001)), &cpu).is_pass());
        // Shifted by a tenth of the range, or twice as wide: different distributions.
        assert!(!compare_distributions(&samples(spread(512, 0.1, 1.1)), &cpu).is_pass());
        assert!(!compare_distributions(&samples(spread(512, -0.5, 1.5)), &cpu).is_pass());
        let mut nan = spread(512, 0.0, 1.0);
        nan[3] = f64::NAN;
        assert!(!compare_distributions(&samples(nan.clone()), &cpu).is_pass());
        assert!(compare_distributions(&samples(nan.clone()), &samples(nan)).is_pass());
        assert!(!compare_distributions(&samples(spread(511, 0.0, 1.0)), &cpu).is_pass());
        // Outside the CPU EP's support: a 2 among 0/1 draws of a float type, however few; among
        // integer draws (class indices) a 2 is another class, but -1 is outside.
        assert!(!compare_distributions(&samples(vec![0.0, 2.0, 1.0]), &samples(vec![1.0, 0.0, 1.0])).is_pass());
        let ints = |v: Vec<f64>| {
            let mut t = samples(v);
            t[0].elem_type = TensorElementType::Int64;
            t
        };
        assert!(compare_distributions(&ints(vec![0.0, 2.0, 1.0]), &ints(vec![1.0, 0.0, 1.0])).is_pass());
        assert!(!compare_distributions(&ints(vec![0.0, -1.0, 1.0]), &ints(vec![1.0, 0.0, 1.0])).is_pass());
    }

    #[test]
    fn identities_must_hold_everywhere_on_both_eps() {
        let case = Case::op("Dropout", 13).output("y", DType::F32, &[3]).identity_output("ok", &[3]).distribution();
        let outputs = |ok: [f64; 3]| {
            let mut v = samples(vec![0.5, 0.0, 2.0]);
            v.push(HostTensor {
                name: "ok".into(),
                elem_type: TensorElementType::Bool,
                shape: vec![3],
                values: ok.to_vec(),
            });
            v
        };
        let all = outputs([1.0; 3]);
        assert!(compare(&case, &all, &all).is_pass());
        // False anywhere on MLX fails the case; false on the CPU EP (even where both agree)
        // makes it invalid.
        assert!(matches!(compare(&case, &outputs([1.0, 0.0, 1.0]), &all), Outcome::Failed(_)));
        assert!(matches!(compare(&case, &all, &outputs([1.0, 1.0, 0.0])), Outcome::Invalid(_)));
        let both = outputs([0.0, 1.0, 1.0]);
        assert!(matches!(compare(&case, &both, &both), Outcome::Invalid(_)));
    }
}
