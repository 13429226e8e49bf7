//! Value encodings of numeric tensors: Imputer (a replaced value swapped for the imputed one
//! of its feature), OneHotEncoder (int64 categories to float32 indicator rows), LabelEncoder
//! (numeric keys to numeric values, opset 2 on) and FeatureVectorizer (inputs' columns laid side
//! by side in float32), each as ORT's CPU EP computes it. String keys, values and categories stay
//! on ORT's CPU EP.

use crate::{ML, floats, ints};
use ep_core::lowering::{FnLowering, require_input_rank, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, Error, LowerCtx, NodeInfo, Result, bail};

fn has_strings(node: &NodeInfo, name: &str) -> bool {
    matches!(node.attr(name), Some(AttrValue::Strings(v)) if !v.is_empty())
}

/// Whether each element of `x` (`[..]`) equals a key (`[k]`), as `[.., k]`; with `nan_matches`
/// a NaN element equals a NaN key.
fn matches(x: &Array, keys: &Array, nan_matches: bool, s: &Stream) -> Result<Array> {
    let k = keys.size() as i64;
    let mut shape = x.shape();
    shape.push(1);
    let x = ops::reshape(x, &shape, s)?;
    let keys = ops::reshape(keys, &[k], s)?;
    let eq = ops::equal(&x, &keys, s)?;
    if !nan_matches {
        return Ok(eq);
    }
    Ok(ops::logical_or(&eq, &ops::logical_and(&ops::isnan(&x, s)?, &ops::isnan(&keys, s)?, s)?, s)?)
}

fn claim_imputer(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::F32, ElemType::I64])?;
    require_input_rank(node, 0, 1..=2)?;
    let (f, i) = (floats(node, "imputed_value_floats"), ints(node, "imputed_value_int64s"));
    if f.is_empty() == i.is_empty() {
        return Err(Decline::new("exactly one of imputed_value_floats and imputed_value_int64s must be given"));
    }
    let float_input = node.input(0).and_then(|v| v.elem_type) == Some(ElemType::F32);
    if float_input == f.is_empty() {
        return Err(Decline::new("the imputed values' type differs from the input's (ORT's CPU EP refuses it)"));
    }
    Ok(())
}

/// Elements equal to the replaced value (NaN matching NaN) take their feature's imputed value
/// (the first one for all features unless one per feature is given).
fn lower_imputer(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?.clone(), ctx.stream());
    let shape = x.shape();
    let c = *shape.last().ok_or_else(|| Error::new("the input has rank 0"))?;
    let t = x.dtype();
    let (imputed, replaced) = if t == Dtype::F32 {
        let v = floats(node, "imputed_value_floats");
        let v = if v.len() as i64 == c { v.to_vec() } else { vec![v[0]] };
        let n = v.len() as i64;
        (Array::from_slice(&v, &[n])?, ops::scalar(node.attr_float("replaced_value_float", 0.0)? as f64, t, s)?)
    } else {
        let v = ints(node, "imputed_value_int64s");
        let v = if v.len() as i64 == c { v.to_vec() } else { vec![v[0]] };
        let n = v.len() as i64;
        let r = node.attr_int("replaced_value_int64", 0)?;
        (Array::from_slice(&v, &[n])?, Array::from_slice(&[r], &[])?)
    };
    let mut hit = ops::equal(&x, &replaced, s)?;
    if t == Dtype::F32 {
        hit = ops::logical_or(&hit, &ops::logical_and(&ops::isnan(&x, s)?, &ops::isnan(&replaced, s)?, s)?, s)?;
    }
    Ok(vec![ops::where_(&hit, &imputed, &x, s)?])
}

ep_core::register_lowering!(
    IMPUTER = FnLowering {
        domain: ML,
        op: "Imputer",
        opsets: 1..=i32::MAX,
        claim: claim_imputer,
        lower: lower_imputer,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_one_hot(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::I64, ElemType::F32])?;
    if has_strings(node, "cats_strings") {
        return Err(Decline::new("string categories stay on ORT's CPU EP"));
    }
    if ints(node, "cats_int64s").is_empty() {
        return Err(Decline::new("no cats_int64s"));
    }
    match node.attr_int("zeros", 1)? {
        0 | 1 => Ok(()),
        z => Err(Decline(format!("zeros={z} is not 0 or 1"))),
    }
}

/// `[.., C]` float32 rows: 1 at the index of the element's category (the last one listed when
/// a category repeats; float input truncated toward zero), zeros for an unknown one, which fails
/// the run when `zeros` is 0.
fn lower_one_hot(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?.clone(), ctx.stream());
    let cats = ints(node, "cats_int64s");
    let c = cats.len();
    // The last index of each category wins: earlier duplicates never match.
    let last: Vec<bool> = (0..c).map(|i| !cats[i + 1..].contains(&cats[i])).collect();
    let finite = if x.dtype() == Dtype::I64 {
        None
    } else {
        // A float outside int64's range (or NaN) is no category.
        let limit = ops::scalar(9.2e18, Dtype::F32, s)?;
        Some(ops::less(&ops::abs(&x, s)?, &limit, s)?)
    };
    let x = if x.dtype() == Dtype::I64 { x } else { ops::astype(&ops::trunc(&x, s)?, Dtype::I64, s)? };
    let hit = matches(&x, &Array::from_slice(cats, &[c as i64])?, false, s)?;
    let mut hit = ops::logical_and(&hit, &Array::from_slice(&last, &[c as i64])?, s)?;
    if let Some(finite) = finite {
        hit = ops::logical_and(&hit, &ops::expand_dims(&finite, -1, s)?, s)?;
    }
    if node.attr_int("zeros", 1)? == 0 {
        let known = ops::any_axes(&hit, &[-1], false, s)?;
        ctx.check(&known, "an input holds an unknown category and zeros = 0")?;
    }
    Ok(vec![ops::astype(&hit, Dtype::F32, ctx.stream())?])
}

ep_core::register_lowering!(
    ONE_HOT_ENCODER = FnLowering {
        domain: ML,
        op: "OneHotEncoder",
        opsets: 1..=i32::MAX,
        claim: claim_one_hot,
        lower: lower_one_hot,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

/// LabelEncoder's numeric keys and values, from the list attributes.
enum Table<'a> {
    Ints(&'a [i64]),
    Floats(&'a [f32]),
}

impl Table<'_> {
    fn len(&self) -> usize {
        match self {
            Table::Ints(v) => v.len(),
            Table::Floats(v) => v.len(),
        }
    }

    fn array(&self) -> Result<Array> {
        Ok(match self {
            Table::Ints(v) => Array::from_slice(v, &[v.len() as i64])?,
            Table::Floats(v) => Array::from_slice(v, &[v.len() as i64])?,
        })
    }
}

fn table<'a>(node: &'a NodeInfo, side: &str) -> std::result::Result<Table<'a>, String> {
    let (i, f) = (ints(node, &format!("{side}_int64s")), floats(node, &format!("{side}_floats")));
    if has_strings(node, &format!("{side}_strings")) || node.attr(&format!("{side}_tensor")).is_some() {
        return Err(format!("{side} given as strings or a tensor stay on ORT's CPU EP"));
    }
    match (i.is_empty(), f.is_empty()) {
        (false, true) => Ok(Table::Ints(i)),
        (true, false) => Ok(Table::Floats(f)),
        _ => Err(format!("{side} must be given as one of {side}_int64s and {side}_floats")),
    }
}

fn claim_label(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 1, 1)?;
    require_input_type(node, 0, &[ElemType::I64, ElemType::F32])?;
    let keys = table(node, "keys").map_err(Decline)?;
    let values = table(node, "values").map_err(Decline)?;
    if keys.len() != values.len() {
        return Err(Decline(format!("{} keys for {} values", keys.len(), values.len())));
    }
    let key_type = if matches!(keys, Table::Ints(_)) { ElemType::I64 } else { ElemType::F32 };
    if node.input(0).and_then(|v| v.elem_type) != Some(key_type) {
        return Err(Decline::new("the input's type differs from the keys'"));
    }
    if node.attr("default_tensor").is_some() {
        return Err(Decline::new("default_tensor stays on ORT's CPU EP"));
    }
    Ok(())
}

/// Each element's value at its key (the first listed when a key repeats), else the default
/// (`default_int64`, -1, or `default_float`, -0.0). From opset 4 a NaN element matches a NaN
/// key; before, never.
fn lower_label(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (x, s) = (ctx.input(0)?.clone(), ctx.stream());
    let keys = table(node, "keys").map_err(Error::new)?;
    let values = table(node, "values").map_err(Error::new)?;
    if x.size() == 0 {
        let t = if matches!(values, Table::Ints(_)) { Dtype::I64 } else { Dtype::F32 };
        return Ok(vec![ops::astype(&x, t, s)?]);
    }
    let hit = matches(&x, &keys.array()?, node.since_version >= 4, s)?;
    let found = ops::any_axes(&hit, &[-1], false, s)?;
    // The first matching key: argmax returns the first of equal maxima.
    let first = ops::argmax_axis(&ops::astype(&hit, Dtype::U8, s)?, -1, false, s)?;
    let picked = ops::take(&values.array()?, &ops::astype(&first, Dtype::I32, s)?, 0, s)?;
    let default = match values {
        Table::Ints(_) => Array::from_slice(&[node.attr_int("default_int64", -1)?], &[])?,
        Table::Floats(_) => ops::scalar(node.attr_float("default_float", -0.0)? as f64, Dtype::F32, s)?,
    };
    Ok(vec![ops::where_(&found, &picked, &default, s)?])
}

ep_core::register_lowering!(
    LABEL_ENCODER = FnLowering {
        domain: ML,
        op: "LabelEncoder",
        opsets: 2..=i32::MAX,
        claim: claim_label,
        lower: lower_label,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_vectorizer(node: &NodeInfo) -> std::result::Result<(), Decline> {
    let dims = ints(node, "inputdimensions");
    if dims.is_empty() || dims.iter().any(|&d| d < 0) {
        return Err(Decline::new("inputdimensions must list a non-negative width per input"));
    }
    require_inputs(node, dims.len(), dims.len())?;
    for i in 0..dims.len() {
        require_input_type(node, i, &[ElemType::F32, ElemType::I64, ElemType::I32])?;
        require_input_rank(node, i, 1..=2)?;
    }
    Ok(())
}

/// `[N, sum(inputdimensions)]` float32: input k's first `inputdimensions[k]` columns (cut, or
/// padded with zeros) at its offset; every input has N rows (a 1-D input is one row).
fn lower_vectorizer(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let dims = ints(node, "inputdimensions");
    let s = ctx.stream();
    let rows = |a: &Array| if a.ndim() == 1 { 1 } else { a.shape()[0] };
    let columns = |a: &Array| if a.ndim() == 1 { a.shape()[0] } else { a.shape()[1..].iter().product() };
    let n = rows(ctx.input(0)?);
    let mut parts = Vec::with_capacity(dims.len());
    for (k, &width) in dims.iter().enumerate() {
        let x = ctx.input(k)?;
        let x = ops::astype(&ops::reshape(x, &[rows(x), columns(x)], s)?, Dtype::F32, s)?;
        let (r, c) = (x.shape()[0], x.shape()[1]);
        if r != n {
            bail!("input {k} has {r} rows and input 0 {n}: every input must have the same batch size");
        }
        let x = if c > width { ops::slice(&x, &[0, 0], &[r, width], s)? } else { x };
        let zero = ops::scalar(0.0, Dtype::F32, s)?;
        parts.push(ops::pad(&x, &[0, 0], &[0, (width - c).max(0)], &zero, "constant", s)?);
    }
    Ok(vec![ops::concatenate(&parts, 1, s)?])
}

ep_core::register_lowering!(
    FEATURE_VECTORIZER = FnLowering {
        domain: ML,
        op: "FeatureVectorizer",
        opsets: 1..=i32::MAX,
        claim: claim_vectorizer,
        lower: lower_vectorizer,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, Values, register_spec};

    register_spec!(super::IMPUTER, || {
        (nonempty_shape(1..=2), any::<(bool, bool, bool)>(), seed())
            .prop_map(|(s, (float, per_feature, nan), seed)| {
                let c = *s.last().unwrap();
                let n = if per_feature { c } else { 1 };
                // Small integers, so the replaced value occurs.
                let values = Values::Uniform { lo: -2.0, hi: 3.0 };
                let case = if float {
                    let x = if nan { Values::Special } else { values };
                    Case::domain_op("ai.onnx.ml", "Imputer", 1)
                        .input_with("x", DType::F32, &s, x)
                        .attr("imputed_value_floats", Attr::Floats((0..n).map(|i| i as f32 + 0.5).collect()))
                        .attr_float("replaced_value_float", if nan { f32::NAN } else { 1.0 })
                        .output("y", DType::F32, &s)
                } else {
                    Case::domain_op("ai.onnx.ml", "Imputer", 1)
                        .input_with("x", DType::I64, &s, values)
                        .attr_ints("imputed_value_int64s", &(0..n).map(|i| i + 10).collect::<Vec<_>>())
                        .attr_int("replaced_value_int64", 1)
                        .output("y", DType::I64, &s)
                };
                case.with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::ONE_HOT_ENCODER, || {
        (shape(1..=2), 1..=5usize, any::<bool>(), seed())
            .prop_map(|(s, c, float, seed)| {
                // Categories with a repeat (the last index wins) and inputs some of which are unknown.
                let cats: Vec<i64> = (0..c as i64).map(|i| if i == 3 { 0 } else { i * 2 - 2 }).collect();
                let out = [s.clone(), vec![c as i64]].concat();
                let (t, v) = if float {
                    (DType::F32, Values::Uniform { lo: -3.0, hi: 8.0 })
                } else {
                    (DType::I64, Values::Uniform { lo: -3.0, hi: 8.0 })
                };
                Case::domain_op("ai.onnx.ml", "OneHotEncoder", 1)
                    .input_with("x", t, &s, v)
                    .attr_ints("cats_int64s", &cats)
                    .attr_int("zeros", 1)
                    .output("y", DType::F32, &out)
                    .with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::LABEL_ENCODER, || {
        (shape(0..=2), 1..=6i64, any::<(bool, bool, bool)>(), opset(2..=4), seed())
            .prop_map(|(s, k, (float_keys, float_values, default), v, seed)| {
                let case = Case::domain_op("ai.onnx.ml", "LabelEncoder", v);
                // Keys with a repeat (the first wins), inputs partly outside them.
                let keys: Vec<i64> = (0..k).map(|i| if i == 4 { 1 } else { i - 1 }).collect();
                let case = if float_keys {
                    case.input_with("x", DType::F32, &s, Values::Uniform { lo: -2.0, hi: 6.0 })
                        .attr("keys_floats", Attr::Floats(keys.iter().map(|&k| k as f32).collect()))
                } else {
                    case.input_with("x", DType::I64, &s, Values::Uniform { lo: -2.0, hi: 6.0 })
                        .attr_ints("keys_int64s", &keys)
                };
                let values: Vec<i64> = (0..k).map(|i| i * 3 + 7).collect();
                let case = if float_values {
                    let case =
                        case.attr("values_floats", Attr::Floats(values.iter().map(|&v| v as f32 * 0.5).collect()));
                    let case = if default { case.attr_float("default_float", 2.5) } else { case };
                    case.output("y", DType::F32, &s)
                } else {
                    let case = case.attr_ints("values_int64s", &values);
                    let case = if default { case.attr_int("default_int64", 99) } else { case };
                    case.output("y", DType::I64, &s)
                };
                case.with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::FEATURE_VECTORIZER, || {
        (1..=3i64, collection::vec((1..=3i64, 0..=4i64, any::<bool>()), 1..=3), 0..3usize, seed())
            .prop_map(|(n, inputs, t, seed)| {
                // (One element type for every input: the schema binds them together.)
                let t = [DType::F32, DType::I64, DType::I32][t];
                let mut case = Case::domain_op("ai.onnx.ml", "FeatureVectorizer", 1);
                let mut widths = Vec::new();
                for (i, &(c, w, flat)) in inputs.iter().enumerate() {
                    // A 1-D input is one row.
                    let shape = if flat && n == 1 { vec![c] } else { vec![n, c] };
                    case = case.input(&format!("x{i}"), t, &shape);
                    widths.push(w);
                }
                let total: i64 = widths.iter().sum();
                case.attr_ints("inputdimensions", &widths).output("y", DType::F32, &[n, total]).with_seed(seed)
            })
            .boxed()
    });
}
