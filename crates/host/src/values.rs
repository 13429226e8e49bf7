//! Input generation and output extraction for tensors of the common element types.

use crate::Result;
use half::f16;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, Tensor, TensorElementType, ValueType};
use std::collections::HashMap;

/// A tensor's values widened to f64 for comparison, with its shape and element type.
#[derive(Debug, Clone)]
pub struct HostTensor {
    pub name: String,
    pub elem_type: TensorElementType,
    pub shape: Vec<i64>,
    pub values: Vec<f64>,
}

/// Random inputs for every model input: floats in [-1, 1), integers in [0, 4), random bools.
/// Symbolic or unknown dimensions take the value given in `dims` (by symbol name), else 1.
pub fn random_inputs(session: &Session, dims: &HashMap<String, i64>, seed: u64) -> Result<Vec<(String, DynValue)>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Vec::new();
    for input in session.inputs() {
        let ValueType::Tensor { ty, shape, dimension_symbols } = input.dtype() else {
            return Err(format!("input '{}' is not a tensor; only tensor inputs can be generated", input.name()).into());
        };
        let shape: Vec<i64> = shape
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if d >= 0 {
                    d
                } else {
                    dimension_symbols.get(i).and_then(|s| dims.get(s.as_str())).copied().unwrap_or(1)
                }
            })
            .collect();
        let n: usize = shape.iter().map(|&d| d as usize).product();
        let value = tensor_of(*ty, &shape, n, &mut rng).map_err(|e| format!("input '{}': {e}", input.name()))?;
        out.push((input.name().to_owned(), value));
    }
    Ok(out)
}

/// A tensor of `ty` filled from `rng`.
pub fn tensor_of(ty: TensorElementType, shape: &[i64], n: usize, rng: &mut fastrand::Rng) -> Result<DynValue> {
    let shape = shape.to_vec();
    Ok(match ty {
        TensorElementType::Float32 => {
            Tensor::from_array((shape, (0..n).map(|_| rng.f32() * 2.0 - 1.0).collect::<Vec<_>>()))?.into_dyn()
        }
        TensorElementType::Float64 => {
            Tensor::from_array((shape, (0..n).map(|_| rng.f64() * 2.0 - 1.0).collect::<Vec<_>>()))?.into_dyn()
        }
        TensorElementType::Float16 => {
            Tensor::from_array((shape, (0..n).map(|_| f16::from_f32(rng.f32() * 2.0 - 1.0)).collect::<Vec<_>>()))?
                .into_dyn()
        }
        TensorElementType::Int64 => {
            Tensor::from_array((shape, (0..n).map(|_| rng.i64(0..4)).collect::<Vec<_>>()))?.into_dyn()
        }
        TensorElementType::Int32 => {
            Tensor::from_array((shape, (0..n).map(|_| rng.i32(0..4)).collect::<Vec<_>>()))?.into_dyn()
        }
        TensorElementType::Bool => {
            Tensor::from_array((shape, (0..n).map(|_| rng.bool()).collect::<Vec<_>>()))?.into_dyn()
        }
        other => return Err(format!("element type {other:?} is not generated").into()),
    })
}

/// Runs the session and widens every output to f64.
pub fn run(session: &mut Session, inputs: &[(String, DynValue)]) -> Result<Vec<HostTensor>> {
    let feed: Vec<(String, SessionInputValue<'_>)> =
        inputs.iter().map(|(n, v)| (n.clone(), SessionInputValue::from(v.view()))).collect();
    let outputs = session.run(feed)?;
    let mut out = Vec::new();
    for (name, value) in outputs.iter() {
        out.push(widen(name, &value)?);
    }
    Ok(out)
}

fn widen(name: &str, value: &ort::value::DynValueRef<'_>) -> Result<HostTensor> {
    let ValueType::Tensor { ty, .. } = value.dtype() else {
        return Err(format!("output '{name}' is not a tensor").into());
    };
    macro_rules! grab {
        ($t:ty, $conv:expr) => {{
            let (shape, data) = value.try_extract_tensor::<$t>()?;
            (shape.to_vec(), data.iter().map($conv).collect::<Vec<f64>>())
        }};
    }
    let (shape, values) = match ty {
        TensorElementType::Float32 => grab!(f32, |&v| v as f64),
        TensorElementType::Float64 => grab!(f64, |&v| v),
        TensorElementType::Float16 => grab!(f16, |&v| v.to_f64()),
        TensorElementType::Int64 => grab!(i64, |&v| v as f64),
        TensorElementType::Int32 => grab!(i32, |&v| v as f64),
        TensorElementType::Bool => grab!(bool, |&v| if v { 1.0 } else { 0.0 }),
        other => {
            return Err(format!("output '{name}' has element type {other:?}, which the host cannot compare").into());
        }
    };
    Ok(HostTensor { name: name.to_owned(), elem_type: *ty, shape, values })
}

/// Largest absolute and relative differences between two outputs (NaN where both are NaN
/// counts as equal). Fails when names, shapes or element types differ.
pub fn compare(a: &HostTensor, b: &HostTensor) -> Result<(f64, f64)> {
    if a.name != b.name || a.shape != b.shape || a.elem_type != b.elem_type {
        return Err(format!(
            "output mismatch: '{}' {:?} {:?} vs '{}' {:?} {:?}",
            a.name, a.elem_type, a.shape, b.name, b.elem_type, b.shape
        )
        .into());
    }
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    for (&x, &y) in a.values.iter().zip(&b.values) {
        if x.is_nan() && y.is_nan() {
            continue;
        }
        let abs = (x - y).abs();
        let abs = if abs.is_nan() { f64::INFINITY } else { abs };
        max_abs = max_abs.max(abs);
        max_rel = max_rel.max(abs / y.abs().max(f64::MIN_POSITIVE));
    }
    Ok((max_abs, max_rel))
}
