//! Input generation and output extraction for tensors of the common element types.

use crate::Result;
use half::{bf16, f16};
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

/// A tensor of `ty` filled from `rng`: floats in [-1, 1), integers in [0, 4), random bools.
pub fn tensor_of(ty: TensorElementType, shape: &[i64], n: usize, rng: &mut fastrand::Rng) -> Result<DynValue> {
    let values: Vec<f64> = match ty {
        TensorElementType::Float32
        | TensorElementType::Float64
        | TensorElementType::Float16
        | TensorElementType::Bfloat16 => (0..n).map(|_| rng.f64() * 2.0 - 1.0).collect(),
        TensorElementType::Bool => (0..n).map(|_| rng.bool() as u8 as f64).collect(),
        _ => (0..n).map(|_| rng.i64(0..4) as f64).collect(),
    };
    tensor_from_f64(ty, shape, &values)
}

/// Applies `$body` with `$t` bound to the Rust type of element type `$ty` (and `$conv` the
/// conversion from f64), or returns an error for types the host does not handle.
macro_rules! with_elem_type {
    ($ty:expr, $what:expr, |$t:ident, $conv:ident| $body:expr) => {{
        match $ty {
            TensorElementType::Float32 => {
                type $t = f32;
                let $conv = |v: f64| v as f32;
                $body
            }
            TensorElementType::Float64 => {
                type $t = f64;
                let $conv = |v: f64| v;
                $body
            }
            TensorElementType::Float16 => {
                type $t = f16;
                let $conv = f16::from_f64;
                $body
            }
            TensorElementType::Bfloat16 => {
                type $t = bf16;
                let $conv = bf16::from_f64;
                $body
            }
            TensorElementType::Int8 => {
                type $t = i8;
                let $conv = |v: f64| v as i8;
                $body
            }
            TensorElementType::Int16 => {
                type $t = i16;
                let $conv = |v: f64| v as i16;
                $body
            }
            TensorElementType::Int32 => {
                type $t = i32;
                let $conv = |v: f64| v as i32;
                $body
            }
            TensorElementType::Int64 => {
                type $t = i64;
                let $conv = |v: f64| v as i64;
                $body
            }
            TensorElementType::Uint8 => {
                type $t = u8;
                let $conv = |v: f64| v as u8;
                $body
            }
            TensorElementType::Uint16 => {
                type $t = u16;
                let $conv = |v: f64| v as u16;
                $body
            }
            TensorElementType::Uint32 => {
                type $t = u32;
                let $conv = |v: f64| v as u32;
                $body
            }
            TensorElementType::Uint64 => {
                type $t = u64;
                let $conv = |v: f64| v as u64;
                $body
            }
            TensorElementType::Bool => {
                type $t = bool;
                let $conv = |v: f64| v != 0.0;
                $body
            }
            other => return Err(format!("{}: element type {other:?} is not supported by the host", $what).into()),
        }
    }};
}

/// A tensor of `ty` and `shape` holding `values` (converted as Rust's `as` does).
pub fn tensor_from_f64(ty: TensorElementType, shape: &[i64], values: &[f64]) -> Result<DynValue> {
    let shape = shape.to_vec();
    Ok(with_elem_type!(ty, "tensor", |T, conv| {
        Tensor::<T>::from_array((shape, values.iter().map(|&v| conv(v)).collect::<Vec<T>>()))?.into_dyn()
    }))
}

/// Like [`tensor_from_f64`], in memory allocated by ORT (what the model editor takes as an
/// initializer).
pub fn ort_tensor_from_f64(ty: TensorElementType, shape: &[i64], values: &[f64]) -> Result<DynValue> {
    Ok(with_elem_type!(ty, "initializer", |T, conv| {
        let mut t = Tensor::<T>::new(&ort::memory::Allocator::default(), shape.to_vec())?;
        let (_, data) = t.extract_tensor_mut();
        for (d, &v) in data.iter_mut().zip(values) {
            *d = conv(v);
        }
        t.into_dyn()
    }))
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

/// A host tensor's values, read as [`run`] reads an output.
pub fn run_output(name: &str, value: &DynValue) -> Result<HostTensor> {
    widen(name, &value.view())
}

fn widen(name: &str, value: &ort::value::DynValueRef<'_>) -> Result<HostTensor> {
    let ValueType::Tensor { ty, .. } = value.dtype() else {
        return Err(format!("output '{name}' is not a tensor").into());
    };
    let (shape, values) = with_elem_type!(*ty, format!("output '{name}'"), |T, _conv| {
        let (shape, data) = value.try_extract_tensor::<T>()?;
        (shape.to_vec(), data.iter().map(|v| v.widen()).collect::<Vec<f64>>())
    });
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

/// Widening of an element to f64 for comparison.
trait Widen {
    fn widen(&self) -> f64;
}

macro_rules! widen_as {
    ($($t:ty),*) => { $(impl Widen for $t { fn widen(&self) -> f64 { *self as f64 } })* };
}
widen_as!(f32, f64, i8, i16, i32, i64, u8, u16, u32, u64);

impl Widen for f16 {
    fn widen(&self) -> f64 {
        self.to_f64()
    }
}

impl Widen for bf16 {
    fn widen(&self) -> f64 {
        self.to_f64()
    }
}

impl Widen for bool {
    fn widen(&self) -> f64 {
        if *self { 1.0 } else { 0.0 }
    }
}
