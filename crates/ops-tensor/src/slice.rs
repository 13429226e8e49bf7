//! Slice (attributes before opset 10, inputs from 10), with negative steps; ORT's earlier
//! DynamicSlice (opset 9 or older: Slice's inputs without steps).

use ep_core::lowering::{ALL_TYPES, FnLowering, normalize_axis, require_input_type};
use ep_core::mlx::{Array, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

fn claim_slice(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_input_type(node, 0, ALL_TYPES)?;
    for i in 1..5 {
        require_input_type(node, i, &[ElemType::I64, ElemType::I32])?;
    }
    Ok(())
}

/// ONNX's clamping of one axis' (start, end) for `step`, as the indices it selects. Computed
/// in 128 bits: steps and bounds anywhere in i64 (INT64_MIN included) cannot overflow.
pub fn slice_range(dim: i64, start: i64, end: i64, step: i64) -> (i64, i64, i64) {
    let (dim, step) = (i128::from(dim), i128::from(step));
    let norm = |v: i64| {
        let v = i128::from(v);
        if v < 0 { v + dim } else { v }
    };
    let (s, e) = (norm(start), norm(end));
    let (s, e, count) = if step > 0 {
        let (s, e) = (s.clamp(0, dim), e.clamp(0, dim));
        (s, e, ((e - s + step - 1) / step).max(0))
    } else {
        let (s, e) = (s.max(0).min(dim - 1), e.max(-1).min(dim - 1));
        (s, e, ((s - e - step - 1) / -step).max(0))
    };
    // Each value lies within [-1, dim], so it fits back into i64.
    (s as i64, e as i64, count as i64)
}

fn lower_slice(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let x = ctx.input(0)?;
    let shape = x.shape();
    let rank = shape.len();
    let (starts, ends, axes, steps) = if node.since_version >= 10 || node.op_type == "DynamicSlice" {
        let opt = |i: usize| -> Result<Option<Vec<i64>>> {
            if ctx.optional_input(i).is_some() { Ok(Some(ctx.host_i64(i)?)) } else { Ok(None) }
        };
        (ctx.host_i64(1)?, ctx.host_i64(2)?, opt(3)?, opt(4)?)
    } else {
        let a = |n: &str| node.attr_ints(n).map(|v| v.map(<[i64]>::to_vec));
        (a("starts")?.unwrap_or_default(), a("ends")?.unwrap_or_default(), a("axes")?, None)
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        bail!("starts, ends, axes and steps differ in length");
    }
    let s = ctx.stream();
    let mut lo: Vec<i64> = vec![0; rank];
    let mut hi: Vec<i64> = shape.clone();
    let mut reversed = Vec::new();
    let mut seen = vec![false; rank];
    for i in 0..starts.len() {
        let axis = normalize_axis(axes[i], rank)?;
        if std::mem::replace(&mut seen[axis], true) {
            bail!("axis {axis} is sliced twice (axes {axes:?})");
        }
        let step = steps[i];
        if step == 0 {
            bail!("step 0 on axis {axis}");
        }
        let (start, end, count) = slice_range(shape[axis], starts[i], ends[i], step);
        if step == 1 {
            lo[axis] = start;
            hi[axis] = end.max(start);
        } else {
            reversed.push((axis, start, step, count));
        }
    }
    let mut y = ops::slice(x, &lo, &hi, s)?;
    // Steps other than 1 gather the selected indices (offset by the unit-step slice, which
    // leaves that axis whole).
    for (axis, start, step, count) in reversed {
        let idx: Vec<i64> = (0..count).map(|k| start + k * step).collect();
        let idx = Array::from_slice(&idx, &[count])?;
        y = ops::take(&y, &idx, axis as i32, s)?;
    }
    Ok(vec![y])
}

fn claim_dynamic_slice(node: &NodeInfo) -> std::result::Result<(), Decline> {
    ep_core::lowering::require_inputs(node, 3, 4)?;
    claim_slice(node)?;
    // ORT's kernel takes one index type for starts, ends and axes.
    let t = |i: usize| node.input(i).and_then(|v| v.elem_type);
    if t(2) != t(1) || node.input(3).is_some_and(|_| t(3) != t(1)) {
        return Err(Decline::new("starts, ends and axes differ in type"));
    }
    Ok(())
}

ep_core::register_lowering!(
    DYNAMIC_SLICE = FnLowering {
        domain: "",
        op: "DynamicSlice",
        opsets: 1..=9,
        claim: claim_dynamic_slice,
        lower: lower_slice,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

ep_core::register_lowering!(
    SLICE = FnLowering {
        domain: "",
        op: "Slice",
        opsets: 1..=i32::MAX,
        claim: claim_slice,
        lower: lower_slice,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use super::slice_range;
    use crate::spec_util::*;
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, register_spec};

    register_spec!(super::DYNAMIC_SLICE, || {
        let bound = prop_oneof![4 => -6..=6i64, 1 => Just(i64::MAX), 1 => Just(i32::MAX as i64)];
        (
            any_dtype(),
            nonempty_shape(1..=4),
            collection::vec((bound.clone(), bound), 1..=4),
            any::<(bool, bool)>(),
            seed(),
        )
            .prop_map(|(t, s, slices, (explicit_axes, neg_axes), seed)| {
                let r = s.len();
                let slices = &slices[..slices.len().min(r)];
                let (mut starts, mut ends, mut axes) = (vec![], vec![], vec![]);
                let mut out = s.clone();
                for (i, &(a, b)) in slices.iter().enumerate() {
                    let axis = if explicit_axes { r - 1 - i } else { i };
                    starts.push(a);
                    ends.push(b);
                    axes.push(if neg_axes { axis as i64 - r as i64 } else { axis as i64 });
                    out[axis] = slice_range(s[axis], a, b, 1).2;
                }
                let case = Case::op("DynamicSlice", 9)
                    .input("x", t, &s)
                    .constant_i64("starts", &starts)
                    .constant_i64("ends", &ends);
                let case = if explicit_axes { case.constant_i64("axes", &axes) } else { case };
                case.output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });

    register_spec!(super::SLICE, || {
        let bound = prop_oneof![4 => -6..=6i64, 1 => Just(i64::MAX), 1 => Just(i64::MIN)];
        let axis_slice = (bound.clone(), bound, prop_oneof![4 => Just(1i64), 2 => -3..=-1i64, 2 => 2..=3i64]);
        (
            any_dtype(),
            nonempty_shape(1..=4),
            collection::vec(axis_slice, 1..=4),
            any::<(bool, bool)>(),
            opset(7..=22),
            seed(),
        )
            .prop_map(|(t, s, slices, (explicit_axes, neg_axes), v, seed)| {
                let r = s.len();
                let slices = &slices[..slices.len().min(r)];
                let (mut starts, mut ends, mut axes, mut steps) = (vec![], vec![], vec![], vec![]);
                let mut out = s.clone();
                for (i, &(a, b, step)) in slices.iter().enumerate() {
                    let axis = if explicit_axes { r - 1 - i } else { i };
                    let step = if v < 10 || !explicit_axes { 1 } else { step };
                    // ORT reads an end of INT64_MAX with a negative step as "through the start";
                    // models write INT64_MIN there, which both read the same way.
                    let b = if step < 0 && b == i64::MAX { i64::MIN } else { b };
                    let (a, b) = if v < 10 { (a.clamp(-1 << 30, 1 << 30), b.clamp(-1 << 30, 1 << 30)) } else { (a, b) };
                    starts.push(a);
                    ends.push(b);
                    axes.push(if neg_axes { axis as i64 - r as i64 } else { axis as i64 });
                    steps.push(step);
                    out[axis] = slice_range(s[axis], a, b, step).2;
                }
                let case = Case::op("Slice", v).input("x", t, &s);
                let case = if v >= 10 {
                    let c = case.constant_i64("starts", &starts).constant_i64("ends", &ends);
                    if explicit_axes { c.constant_i64("axes", &axes).constant_i64("steps", &steps) } else { c }
                } else {
                    let c = case.attr_ints("starts", &starts).attr_ints("ends", &ends);
                    if explicit_axes { c.attr_ints("axes", &axes) } else { c }
                };
                case.output("y", t, &out).with_seed(seed)
            })
            .boxed()
    });
}
