//! Broadcasting binary ops (opset 7 on: NumPy-style broadcasting): Add, Sub, Mul, Div on floats
//! and integers (integer Div truncates toward zero, as ONNX defines), Pow, Mod (both
//! remainders), comparisons, logical and bitwise ops, BitShift.

use ep_core::lowering::{ALL_TYPES, FLOATS, INTS, NUMERIC, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, Lowering, NodeInfo, Result};
use std::ops::RangeInclusive;

type BinaryFn = fn(&Array, &Array, &NodeInfo, &Stream) -> Result<Array>;

pub struct Binary {
    op: &'static str,
    since: i32,
    /// Types of both inputs.
    types: &'static [ElemType],
    /// Types of the second input when they differ from the first's (Pow's exponent).
    rhs_types: Option<&'static [ElemType]>,
    f: BinaryFn,
}

impl Lowering for Binary {
    fn op_type(&self) -> &'static str {
        self.op
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        self.since..=i32::MAX
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        require_inputs(node, 2, 2)?;
        require_input_type(node, 0, self.types)?;
        require_input_type(node, 1, self.rhs_types.unwrap_or(self.types))?;
        if self.op == "Mod" {
            // ORT's CPU EP refuses any other value when it creates the kernel.
            ep_core::lowering::require_attr_in(node, "fmod", 0, &[0, 1])?;
        }
        if self.op == "Mod"
            && node.attr_int("fmod", 0)? == 0
            && ep_core::lowering::input_type(node, 0).is_some_and(|t| FLOATS.contains(&t) || t == ElemType::F64)
        {
            return Err(Decline::new("Mod with fmod=0 is defined for integers only"));
        }
        if self.op == "BitShift" {
            match node.attr("direction") {
                Some(ep_core::AttrValue::String(d)) if d == "LEFT" || d == "RIGHT" => {}
                other => return Err(Decline(format!("direction {other:?} is not LEFT or RIGHT"))),
            }
        }
        Ok(())
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let a = ctx.input(0)?.clone();
        let a = &a;
        let s = ctx.stream_for(a.dtype());
        if self.op == "Pow"
            && let Some(y) = pow_by_products(a, ctx.input(1)?, ctx.is_constant(1), s)?
        {
            return Ok(vec![y]);
        }
        if matches!(self.op, "Div" | "Mod") && is_int(a) {
            // An integer divisor of zero fails the run (ORT's CPU EP refuses a constant one and
            // dies on another); it is replaced by 1 until the check is read, so the division
            // itself never divides by zero (MLX's CPU kernel would end the process).
            let b = ctx.input(1)?.clone();
            let nonzero = ops::not_equal(&b, &ops::scalar(0.0, b.dtype(), s)?, s)?;
            ctx.check(&nonzero, format!("{}: an integer divisor is zero", self.op))?;
            let b = ops::where_(&nonzero, &b, &ops::scalar(1.0, b.dtype(), s)?, s)?;
            return Ok(vec![(self.f)(a, &b, node, s)?]);
        }
        Ok(vec![(self.f)(a, ctx.input(1)?, node, s)?])
    }

    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::Shapeless
    }

    fn name(&self) -> &'static str {
        self.op
    }
}

fn is_int(a: &Array) -> bool {
    !a.dtype().is_float() && a.dtype() != Dtype::Bool
}

fn add(a: &Array, b: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
    Ok(ops::add(a, b, s)?)
}

fn sub(a: &Array, b: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
    Ok(ops::subtract(a, b, s)?)
}

fn mul(a: &Array, b: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
    Ok(ops::multiply(a, b, s)?)
}

/// Integer quotient rounded toward zero: `|a| / |b|` (where floor and truncation agree) with the
/// sign of `a * b`. (MLX's integer floor_divide is not a floor for every sign combination.)
fn trunc_div(a: &Array, b: &Array, s: &Stream) -> Result<Array> {
    let q = ops::floor_divide(&ops::abs(a, s)?, &ops::abs(b, s)?, s)?;
    let zero = ops::scalar(0.0, a.dtype(), s)?;
    let negative = ops::not_equal(&ops::less(a, &zero, s)?, &ops::less(b, &zero, s)?, s)?;
    Ok(ops::where_(&negative, &ops::negative(&q, s)?, &q, s)?)
}

fn div(a: &Array, b: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
    if is_int(a) { trunc_div(a, b, s) } else { Ok(ops::divide(a, b, s)?) }
}

/// `a ^ b` in `a`'s type (the exponent may have another type from opset 12).
/// `a * a` or `a * a * a` for a constant float32/float64 exponent of exactly 2 or 3, as ORT's
/// CPU EP computes them (`pow` can differ from the products by an ulp); `None` otherwise.
fn pow_by_products(a: &Array, b: &Array, constant: bool, s: &Stream) -> Result<Option<Array>> {
    if !constant || b.size() != 1 || !matches!(a.dtype(), Dtype::F32 | Dtype::F64) {
        return Ok(None);
    }
    let Some(bytes) = b.host_bytes() else { return Ok(None) };
    let e = match b.dtype() {
        Dtype::F32 => f64::from(f32::from_le_bytes(bytes[..4].try_into().expect("one float32"))),
        Dtype::F64 => f64::from_le_bytes(bytes[..8].try_into().expect("one float64")),
        Dtype::I32 => f64::from(i32::from_le_bytes(bytes[..4].try_into().expect("one int32"))),
        Dtype::I64 => i64::from_le_bytes(bytes[..8].try_into().expect("one int64")) as f64,
        _ => return Ok(None),
    };
    // The one-element exponent's rank still counts (a [1, 1] exponent gives a rank-2
    // result): broadcast against a one of its shape, exactly and shapeless-safe.
    let lift = |y: Array| -> Result<Array> {
        if b.ndim() <= y.ndim() {
            return Ok(y);
        }
        let one = ops::astype(&Array::from_slice(&[1.0f32], &b.shape())?, a.dtype(), s)?;
        Ok(ops::multiply(&y, &one, s)?)
    };
    Ok(match e {
        2.0 => Some(lift(ops::multiply(a, a, s)?)?),
        3.0 => Some(lift(ops::multiply(&ops::multiply(a, a, s)?, a, s)?)?),
        _ => None,
    })
}

fn pow(a: &Array, b: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
    if a.dtype() == Dtype::F16 || a.dtype() == Dtype::BF16 {
        let y = ops::power(&ops::astype(a, Dtype::F32, s)?, &ops::astype(b, Dtype::F32, s)?, s)?;
        return Ok(ops::astype(&y, a.dtype(), s)?);
    }
    Ok(ops::power(a, &ops::astype(b, a.dtype(), s)?, s)?)
}

/// `fmod=0`: the remainder takes the divisor's sign (integers); `fmod=1`: the dividend's (C fmod).
fn modulo(a: &Array, b: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let r = ops::remainder(a, b, s)?;
    if node.attr_int("fmod", 0)? == 0 {
        return Ok(r);
    }
    let zero = ops::scalar(0.0, a.dtype(), s)?;
    // Where the floor remainder's sign differs from the dividend's, step back by the divisor.
    let differ = ops::logical_and(
        &ops::not_equal(&r, &zero, s)?,
        &ops::not_equal(&ops::less(&r, &zero, s)?, &ops::less(a, &zero, s)?, s)?,
        s,
    )?;
    let y = ops::where_(&differ, &ops::subtract(&r, b, s)?, &r, s)?;
    if !a.dtype().is_float() {
        return Ok(y);
    }
    // C fmod of a finite dividend by an infinite divisor is the dividend (the floor remainder
    // multiplies the infinity by 0 or -1 on the way).
    let finite_a = ops::logical_not(&ops::logical_or(&ops::isinf(a, s)?, &ops::isnan(a, s)?, s)?, s)?;
    let keep = ops::logical_and(&ops::isinf(b, s)?, &finite_a, s)?;
    Ok(ops::where_(&keep, a, &y, s)?)
}

macro_rules! simple {
    ($($name:ident => $op:path;)*) => {$(
        fn $name(a: &Array, b: &Array, _: &NodeInfo, s: &Stream) -> Result<Array> {
            Ok($op(a, b, s)?)
        }
    )*};
}

simple! {
    equal => ops::equal;
    less => ops::less;
    greater => ops::greater;
    less_equal => ops::less_equal;
    greater_equal => ops::greater_equal;
    and => ops::logical_and;
    or => ops::logical_or;
    xor => ops::not_equal;
    bit_and => ops::bitwise_and;
    bit_or => ops::bitwise_or;
    bit_xor => ops::bitwise_xor;
}

fn bit_shift(a: &Array, b: &Array, node: &NodeInfo, s: &Stream) -> Result<Array> {
    let left = matches!(node.attr("direction"), Some(ep_core::AttrValue::String(d)) if d == "LEFT");
    let b = ops::astype(b, a.dtype(), s)?;
    let y = if left { ops::left_shift(a, &b, s)? } else { ops::right_shift(a, &b, s)? };
    // A shift by the width or more leaves no bit (as ORT's CPU EP answers; C leaves it undefined).
    let bits = ops::scalar((a.dtype().size_in_bytes() * 8) as f64, a.dtype(), s)?;
    let zero = ops::scalar(0.0, a.dtype(), s)?;
    let y = ops::where_(&ops::greater_equal(&b, &bits, s)?, &zero, &y, s)?;
    Ok(ops::astype(&y, a.dtype(), s)?)
}

const BOOL: &[ElemType] = &[ElemType::Bool];
const UNSIGNED: &[ElemType] = &[ElemType::U8, ElemType::U16, ElemType::U32, ElemType::U64];

ep_core::register_lowering!(ADD = Binary { op: "Add", since: 7, types: NUMERIC, rhs_types: None, f: add });
ep_core::register_lowering!(SUB = Binary { op: "Sub", since: 7, types: NUMERIC, rhs_types: None, f: sub });
ep_core::register_lowering!(MUL = Binary { op: "Mul", since: 7, types: NUMERIC, rhs_types: None, f: mul });
ep_core::register_lowering!(DIV = Binary { op: "Div", since: 7, types: NUMERIC, rhs_types: None, f: div });
ep_core::register_lowering!(POW = Binary { op: "Pow", since: 7, types: NUMERIC, rhs_types: Some(NUMERIC), f: pow });
ep_core::register_lowering!(MOD = Binary { op: "Mod", since: 10, types: NUMERIC, rhs_types: None, f: modulo });
ep_core::register_lowering!(EQUAL = Binary { op: "Equal", since: 7, types: ALL_TYPES, rhs_types: None, f: equal });
ep_core::register_lowering!(LESS = Binary { op: "Less", since: 7, types: NUMERIC, rhs_types: None, f: less });
ep_core::register_lowering!(GREATER = Binary { op: "Greater", since: 7, types: NUMERIC, rhs_types: None, f: greater });
ep_core::register_lowering!(
    LESS_OR_EQUAL = Binary { op: "LessOrEqual", since: 12, types: NUMERIC, rhs_types: None, f: less_equal }
);
ep_core::register_lowering!(
    GREATER_OR_EQUAL = Binary { op: "GreaterOrEqual", since: 12, types: NUMERIC, rhs_types: None, f: greater_equal }
);
ep_core::register_lowering!(AND = Binary { op: "And", since: 7, types: BOOL, rhs_types: None, f: and });
ep_core::register_lowering!(OR = Binary { op: "Or", since: 7, types: BOOL, rhs_types: None, f: or });
ep_core::register_lowering!(XOR = Binary { op: "Xor", since: 7, types: BOOL, rhs_types: None, f: xor });
ep_core::register_lowering!(
    BITWISE_AND = Binary { op: "BitwiseAnd", since: 18, types: INTS, rhs_types: None, f: bit_and }
);
ep_core::register_lowering!(
    BITWISE_OR = Binary { op: "BitwiseOr", since: 18, types: INTS, rhs_types: None, f: bit_or }
);
ep_core::register_lowering!(
    BITWISE_XOR = Binary { op: "BitwiseXor", since: 18, types: INTS, rhs_types: None, f: bit_xor }
);
ep_core::register_lowering!(
    BIT_SHIFT = Binary { op: "BitShift", since: 11, types: UNSIGNED, rhs_types: None, f: bit_shift }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    const ARITH_TYPES: &[DType] = &[DType::F32, DType::F16, DType::F64, DType::I32, DType::I64];

    fn arith_dtype() -> BoxedStrategy<DType> {
        prop_oneof![3 => Just(DType::F32), 2 => select(ARITH_TYPES)].boxed()
    }

    /// Broadcasting pairs up to rank 4 (scalars, size-0 and size-1 dims); floats with special
    /// values, integers in a range that neither overflows nor divides by zero (`nonzero_b`).
    fn binary(
        op: &'static str,
        since: u32,
        types: BoxedStrategy<DType>,
        out: Option<DType>,
        nonzero_b: bool,
    ) -> BoxedStrategy<Case> {
        (types, broadcast_pair(0..=4), opset(since.max(7)..=22), seed())
            .prop_map(move |(t, (a, b, y), v, seed)| {
                let plain = if t == DType::Bool {
                    Values::Uniform { lo: 0.0, hi: 2.0 }
                } else {
                    Values::Uniform { lo: -20.0, hi: 20.0 }
                };
                let va = if t.is_float() { Values::Special } else { plain.clone() };
                let vb = match (t.is_float(), nonzero_b) {
                    (true, _) => Values::Special,
                    (false, true) => Values::Data(Vec::new()),
                    (false, false) => plain,
                };
                let nb: i64 = b.iter().product();
                let vb = if let Values::Data(_) = vb {
                    // Nonzero divisors in [-7, 7].
                    Values::Data(
                        (0..nb)
                            .map(|i| ((i * 5 + seed as i64) % 14 - 7) as f64)
                            .map(|x| if x >= 0.0 { x + 1.0 } else { x })
                            .collect(),
                    )
                } else {
                    vb
                };
                Case::op(op, v)
                    .input_with("a", t, &a, va)
                    .input_with("b", t, &b, vb)
                    .output("y", out.unwrap_or(t), &y)
                    .with_seed(seed)
            })
            .boxed()
    }

    register_spec!(super::ADD, || binary("Add", 7, arith_dtype(), None, false));
    register_spec!(super::SUB, || binary("Sub", 7, arith_dtype(), None, false));
    register_spec!(super::MUL, || binary("Mul", 7, arith_dtype(), None, false));
    register_spec!(super::DIV, || binary("Div", 7, arith_dtype(), None, true));
    register_spec!(super::POW, || {
        (float_dtype(), broadcast_pair(0..=3), opset(7..=22), 0..4u8, seed())
            .prop_map(|(t, (a, b, y), v, exponent, seed)| {
                let case = Case::op("Pow", v).input_with("a", t, &a, Values::Uniform { lo: -3.0, hi: 3.0 });
                match exponent {
                    // A constant 2 or 3 (squares and cubes, as ORT computes them), of rank 0..=2.
                    2 | 3 => {
                        let rank = (seed % 3) as usize;
                        let mut out = vec![1; rank.saturating_sub(a.len())];
                        out.extend(&a);
                        case.constant("b", t, &vec![1; rank], Values::Data(vec![f64::from(exponent)]))
                            .output("y", t, &out)
                    }
                    _ => case.input_with("b", t, &b, Values::Uniform { lo: -2.0, hi: 3.0 }).output("y", t, &y),
                }
                .with_seed(seed)
            })
            .boxed()
    });
    register_spec!(super::MOD, || {
        (select(&[DType::F32, DType::I32, DType::I64][..]), broadcast_pair(0..=3), opset(13..=22), seed())
            .prop_map(|(t, (a, b, y), v, seed)| {
                let nb: i64 = b.iter().product();
                let divisors = Values::Data(
                    (0..nb)
                        .map(|i| ((i * 5 + seed as i64) % 14 - 7) as f64)
                        .map(|x| if x >= 0.0 { x + 1.0 } else { x * 1.0 })
                        .collect(),
                );
                let case = Case::op("Mod", v)
                    .input_with("a", t, &a, Values::Uniform { lo: -30.0, hi: 30.0 })
                    .input_with("b", t, &b, divisors);
                let case = if t.is_float() || seed % 2 == 0 { case.attr_int("fmod", 1) } else { case };
                case.output("y", t, &y).with_seed(seed)
            })
            .boxed()
    });
    fn compare(op: &'static str, since: u32) -> BoxedStrategy<Case> {
        (select(&[DType::F32, DType::I32, DType::I64][..]), broadcast_pair(0..=3), opset(since.max(7)..=22), seed())
            .prop_map(move |(t, (a, b, y), v, seed)| {
                // Few distinct values, so equal pairs occur.
                let vals = Values::Uniform { lo: -3.0, hi: 3.0 };
                let vals = if t.is_float() && seed % 3 == 0 { Values::Special } else { vals };
                Case::op(op, v)
                    .input_with("a", t, &a, vals.clone())
                    .input_with("b", t, &b, vals)
                    .output("y", DType::Bool, &y)
                    .with_seed(seed)
            })
            .boxed()
    }
    register_spec!(super::EQUAL, || compare("Equal", 11));
    register_spec!(super::LESS, || compare("Less", 9));
    register_spec!(super::GREATER, || compare("Greater", 9));
    register_spec!(super::LESS_OR_EQUAL, || compare("LessOrEqual", 12));
    register_spec!(super::GREATER_OR_EQUAL, || compare("GreaterOrEqual", 12));
    fn logic(op: &'static str) -> BoxedStrategy<Case> {
        binary(op, 7, Just(DType::Bool).boxed(), None, false)
    }
    register_spec!(super::AND, || logic("And"));
    register_spec!(super::OR, || logic("Or"));
    register_spec!(super::XOR, || logic("Xor"));
    fn bitwise(op: &'static str) -> BoxedStrategy<Case> {
        (select(&[DType::I32, DType::I64, DType::U8][..]), broadcast_pair(0..=3), opset(18..=22), seed())
            .prop_map(move |(t, (a, b, y), v, seed)| {
                let vals = Values::Uniform { lo: if t.is_signed() { -100.0 } else { 0.0 }, hi: 200.0 };
                Case::op(op, v)
                    .input_with("a", t, &a, vals.clone())
                    .input_with("b", t, &b, vals)
                    .output("y", t, &y)
                    .with_seed(seed)
            })
            .boxed()
    }
    register_spec!(super::BITWISE_AND, || bitwise("BitwiseAnd"));
    register_spec!(super::BITWISE_OR, || bitwise("BitwiseOr"));
    register_spec!(super::BITWISE_XOR, || bitwise("BitwiseXor"));
    register_spec!(super::BIT_SHIFT, || {
        (select(&[DType::U8, DType::U32, DType::U64][..]), broadcast_pair(0..=3), any::<bool>(), opset(11..=22), seed())
            .prop_map(|(t, (a, b, y), left, v, seed)| {
                Case::op("BitShift", v)
                    .input_with("a", t, &a, Values::Uniform { lo: 0.0, hi: 250.0 })
                    .input_with("b", t, &b, Values::Uniform { lo: 0.0, hi: 8.0 })
                    .attr_str("direction", if left { "LEFT" } else { "RIGHT" })
                    .output("y", t, &y)
                    .with_seed(seed)
            })
            .boxed()
    });
}
