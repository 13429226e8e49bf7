//! `com.microsoft` DynamicQuantizeLSTM: the LSTM of [`crate::lstm`] with 8-bit integer
//! weights. `W` (`[dirs, I, 4H]`) and `R` (`[dirs, H, 4H]`) are stored already transposed
//! (each the `B` of its product), int8 or uint8, with a scale per direction or per column
//! (`[dirs]` or `[dirs, 4H]`) and one zero point per direction (the first of a `[dirs, 4H]`
//! one, which ORT requires to be all zeros for int8 and all equal for uint8).
//!
//! As ORT's CPU kernel computes it: X is quantized to uint8 once, over every step below the
//! longest sequence ([`ep_core::quant::dynamic_uint8`]: range widened to hold 0, rounding half
//! to even), and multiplied by W in exact int32 arithmetic; each step's h is quantized the same
//! way over the whole batch and multiplied by R; each int32 product becomes float32 as `acc *
//! (a_scale * w_scale)`, the step's recurrent part added to its input part. An entry whose
//! sequence ended before the previous step enters a step's quantization as zeros (ORT zeroes
//! the rows of `Y` past each length).
//!
//! A reverse direction with `sequence_lens` reverses each entry within its length, runs
//! forward and reverses the outputs back, as ORT does (so the entries quantized together are
//! ORT's). `sequence_lens` without the `Y` output is left to ORT's CPU EP (ORT then quantizes
//! stale rows). ORT also splits a batch of more than 4 entries, or
//! of 2 to 4 entries with at most 256 hidden units, across its threads and quantizes each
//! part apart, so its own result depends on its thread count there; the MLX EP always
//! quantizes the whole batch (ORT's result with one thread).

use crate::lstm::Lstm;
use crate::sequence::{self, Cell};
use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::quant::{dynamic_uint8, integer_matmul};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

const INTEGERS: &[ElemType] = &[ElemType::I8, ElemType::U8];

/// The integer weights of every direction.
pub(crate) struct Weights {
    /// `[dirs, I, G * H]` and `[dirs, H, G * H]`, 8-bit.
    w: Array,
    r: Array,
    /// `[dirs]`: each direction's zero point (W's type).
    w_zp: Array,
    r_zp: Array,
    /// `[dirs, 1]` or `[dirs, G * H]` float32.
    w_scale: Array,
    r_scale: Array,
}

/// X quantized for every direction's input product: `[T * B, I]` uint8, its scale and zero
/// point.
pub(crate) struct QuantizedInput {
    q: Array,
    scale: Array,
    zp: Array,
    steps: i64,
    batch: i64,
}

/// One direction's R, zero point and scales.
pub(crate) struct Recurrent {
    r: Array,
    zp: Array,
    scale: Array,
}

/// What a step's `h @ R` reads: the direction's R, and which entries' h enter it (`[B, 1]`;
/// the others as zeros).
pub(crate) struct StepProduct<'a> {
    recurrent: &'a Recurrent,
    live: Option<&'a Array>,
}

/// `(q - q_zp) @ b` (exact) as float32, scaled by `a_scale * b_scale` (that product first,
/// then the multiplication: ORT's order).
fn scaled_product(
    q: &Array,
    a_scale: &Array,
    a_zp: &Array,
    b: &Array,
    b_zp: &Array,
    b_scale: &Array,
    s: &Stream,
) -> Result<Array> {
    let acc = integer_matmul(q, b, Some(a_zp), Some(b_zp), s)?;
    let mult = ops::multiply(a_scale, b_scale, s)?;
    Ok(ops::multiply(&ops::astype(&acc, Dtype::F32, s)?, &mult, s)?)
}

impl Weights {
    /// Reads and checks W, R and their scales and zero points (inputs 1, 2 and 8 to 11).
    fn read(ctx: &mut LowerCtx<'_>, dirs: i64, hidden: i64, input: i64) -> Result<Weights> {
        let s = ctx.stream();
        let g = Lstm::GATES * hidden;
        let (w, r) = (ctx.input(1)?.clone(), ctx.input(2)?.clone());
        if w.shape() != [dirs, input, g] {
            bail!("W has shape {:?}; DynamicQuantizeLSTM expects {:?}", w.shape(), [dirs, input, g]);
        }
        if r.shape() != [dirs, hidden, g] {
            bail!("R has shape {:?}; DynamicQuantizeLSTM expects {:?}", r.shape(), [dirs, hidden, g]);
        }
        if w.dtype() != r.dtype() {
            bail!("W is {:?} and R {:?}; DynamicQuantizeLSTM needs one type", w.dtype(), r.dtype());
        }
        let mut params = Vec::new();
        for (k, what) in [(8, "W_scale"), (9, "W_zero_point"), (10, "R_scale"), (11, "R_zero_point")] {
            let p = ctx.input(k)?.clone();
            let shape = p.shape();
            if shape != [dirs] && shape != [dirs, g] {
                bail!("{what} has shape {shape:?}; DynamicQuantizeLSTM takes {:?} or {:?}", [dirs], [dirs, g]);
            }
            if k % 2 == 1 {
                if p.dtype() != w.dtype() {
                    bail!("{what} is {:?}; DynamicQuantizeLSTM needs W's type {:?}", p.dtype(), w.dtype());
                }
                if shape.len() == 2 {
                    // ORT's rule for a zero point per column: zeros for int8, one value (the
                    // first, across directions too) for uint8.
                    let first = ops::slice(&p, &[0, 0], &[1, 1], s)?;
                    let same = if p.dtype() == Dtype::I8 {
                        ops::equal(&p, &ops::scalar(0.0, Dtype::I8, s)?, s)?
                    } else {
                        ops::equal(&p, &first, s)?
                    };
                    let rule = if p.dtype() == Dtype::I8 { "all zero for int8 weights" } else { "all equal for uint8" };
                    ctx.check(&same, format!("{what} must be {rule}"))?;
                }
                // Each direction's first zero point (the one ORT reads).
                params.push(match shape.len() {
                    1 => p,
                    _ => ops::reshape(&ops::slice(&p, &[0, 0], &[dirs, 1], s)?, &[dirs], s)?,
                });
            } else {
                let p = ops::astype(&p, Dtype::F32, s)?;
                params.push(if shape.len() == 1 { ops::reshape(&p, &[dirs, 1], s)? } else { p });
            }
        }
        let [w_scale, w_zp, r_scale, r_zp] =
            <[Array; 4]>::try_from(params).map_err(|_| ep_core::Error::new("four parameters"))?;
        Ok(Weights { w, r, w_zp, r_zp, w_scale, r_scale })
    }

    /// X (`[T, B, I]`) quantized over the steps below the longest sequence (`lens`: `[B, 1]`).
    pub(crate) fn quantized_input(&self, x: &Array, lens: Option<&Array>, s: &Stream) -> Result<QuantizedInput> {
        let (steps, batch, input) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let ranged = match lens {
            Some(lens) => {
                let longest = ops::max_axes(lens, &[0, 1], false, s)?;
                let t = ops::reshape(&ops::arange(0.0, steps as f64, 1.0, Dtype::I32, s)?, &[steps, 1, 1], s)?;
                ops::where_(&ops::less(&t, &longest, s)?, x, &ops::scalar(0.0, Dtype::F32, s)?, s)?
            }
            None => x.clone(),
        };
        let (q, scale, zp) = dynamic_uint8(&ranged, s)?;
        Ok(QuantizedInput { q: ops::reshape(&q, &[steps * batch, input], s)?, scale, zp, steps, batch })
    }

    /// Direction `d`'s input product of every step, `[T, B, G * H]`.
    pub(crate) fn input_product(&self, x: &QuantizedInput, d: i64, s: &Stream) -> Result<Array> {
        let w = sequence::direction(&self.w, d, s)?;
        let (zp, scale) = (sequence::direction(&self.w_zp, d, s)?, sequence::direction(&self.w_scale, d, s)?);
        let y = scaled_product(&x.q, &x.scale, &x.zp, &w, &zp, &scale, s)?;
        Ok(ops::reshape(&y, &[x.steps, x.batch, w.shape()[1]], s)?)
    }

    pub(crate) fn recurrent(&self, d: i64, s: &Stream) -> Result<Recurrent> {
        Ok(Recurrent {
            r: sequence::direction(&self.r, d, s)?,
            zp: sequence::direction(&self.r_zp, d, s)?,
            scale: sequence::direction(&self.r_scale, d, s)?,
        })
    }
}

impl Recurrent {
    pub(crate) fn step<'a>(&'a self, live: Option<&'a Array>) -> StepProduct<'a> {
        StepProduct { recurrent: self, live }
    }
}

impl StepProduct<'_> {
    /// `h @ R` (`[B, G * H]`) with h quantized over the batch.
    pub(crate) fn product(&self, h: &Array, range: std::ops::Range<i64>, s: &Stream) -> Result<Array> {
        if range.start != 0 || range.end != Lstm::GATES {
            bail!("DynamicQuantizeLSTM multiplies all {} gates at once", Lstm::GATES);
        }
        let h = match self.live {
            Some(live) => ops::where_(live, h, &ops::scalar(0.0, h.dtype(), s)?, s)?,
            None => h.clone(),
        };
        let (q, scale, zp) = dynamic_uint8(&h, s)?;
        let r = self.recurrent;
        scaled_product(&q, &scale, &zp, &r.r, &r.zp, &r.scale, s)
    }
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 12)?;
    for i in [0, 3, 5, 6, 7, 8, 10] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    for i in [1, 2, 9, 11] {
        require_input_type(node, i, INTEGERS)?;
    }
    for i in [8, 9, 10, 11] {
        if node.input(i).is_none() {
            return Err(Decline(format!("input {i} (a weight's scale or zero point) is missing")));
        }
    }
    require_input_type(node, 4, &[ElemType::I32])?;
    let attrs = sequence::Attributes::read::<Lstm>(node).map_err(Decline)?;
    sequence::flag(node, "input_forget").map_err(Decline)?;
    if attrs.layout != 0 {
        return Err(Decline("layout=1: ORT's DynamicQuantizeLSTM takes layout 0 only".into()));
    }
    let x = node.input(0).and_then(|v| v.shape.clone());
    if let Some(Some(t)) = x.as_ref().and_then(|d| d.first().copied())
        && t > sequence::MAX_STEPS
    {
        return Err(Decline(format!("{t} time steps; the MLX EP unrolls at most {}", sequence::MAX_STEPS)));
    }
    // A second direction with scales per column but one zero point per direction: ORT reads
    // that direction's zero point 4H entries on, past the end of the tensor.
    let rank = |i: usize| node.input(i).and_then(|v| v.rank());
    if attrs.reverse.len() == 2 && [(8, 9), (10, 11)].iter().any(|&(sc, zp)| rank(sc) == Some(2) && rank(zp) == Some(1))
    {
        return Err(Decline("bidirectional with scales per column and zero points per direction".into()));
    }
    if node.input(4).is_some() && node.output(0).is_none() {
        return Err(Decline("sequence_lens without the Y output (ORT quantizes stale rows)".into()));
    }
    Ok(())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let attrs = sequence::Attributes::read::<Lstm>(node).map_err(ep_core::Error::new)?;
    let input_forget = sequence::flag(node, "input_forget").map_err(ep_core::Error::new)?;
    let x = ctx.input(0)?;
    if x.ndim() != 3 {
        bail!("X has rank {}; DynamicQuantizeLSTM expects 3", x.ndim());
    }
    let input = x.shape()[2];
    let weights = Weights::read(ctx, attrs.reverse.len() as i64, attrs.hidden, input)?;
    sequence::run(&Lstm { input_forget }, ctx, &attrs, &[5, 6], Some(7), Some(&weights))
}

ep_core::register_lowering!(
    DYNAMIC_QUANTIZE_LSTM = FnLowering {
        domain: "com.microsoft",
        op: "DynamicQuantizeLSTM",
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
    use conformance_spec::{Case, DType, Values, register_spec};

    // Cases of 1-3 steps over one entry with 1-4 hidden units, or of 1-3 steps over 2-3
    // entries with 257 (where ORT quantizes the whole batch at once, whatever its thread
    // count), every direction, int8 or uint8 weights with per-direction or per-column
    // scales and zero points, with or without biases, lengths, initial states and peepholes.
    register_spec!(super::DYNAMIC_QUANTIZE_LSTM, || {
        let shapes = (1..=5i64, any::<bool>(), 1..=5i64, 1..=5i64, 0..=2usize);
        let options = (any::<[bool; 8]>(), collection::vec(0..=5i64, 3), 0..=255i64, seed());
        (shapes, options)
            .prop_map(|((t, wide, i, h, dir), (flags, lens, zp, seed))| {
                let [with_bias, with_lens, with_initial, with_peepholes, unsigned, columns, constants, forget] = flags;
                // From the second step on a hidden value within float32 rounding of a
                // quantization boundary may land one level apart from ORT's (whose MLAS logistic
                // and tanh differ from MLX's in the last bits, and which adds the bias last),
                // moving a gate by up to `h_scale * |R - zp| * R_scale`: few steps over few
                // values keep that unlikely for the narrow cases; the wide ones, hundreds of
                // values a step, take R scales of 1e-6 to 2e-6, which hold such a move below
                // the tolerance while the batch's quantization (which entries enter it as
                // zeros, reversed within their lengths) still moves the answer past it.
                let (t, b, h) = if wide { (t.min(3), 2 + (seed % 2) as i64, 257) } else { (t.min(3), 1, h.min(4)) };
                // (The wide weights as constants: the fuzzer feeds at most 2^15 values a tensor.)
                let constants = constants || wide;
                let direction = ["forward", "reverse", "bidirectional"][dir];
                let dirs = if dir == 2 { 2 } else { 1 };
                let q = if unsigned { DType::U8 } else { DType::I8 };
                let g = 4 * h;
                let weights = |case: Case, name: &str, dtype: DType, shape: &[i64], values: Values| {
                    if constants {
                        case.constant(name, dtype, shape, values)
                    } else {
                        case.input_with(name, dtype, shape, values)
                    }
                };
                let mut case = Case::domain_op("com.microsoft", "DynamicQuantizeLSTM", 1).with_seed(seed).input_with(
                    "X",
                    DType::F32,
                    &[t, b, i],
                    Values::Uniform { lo: -2.0, hi: 3.0 },
                );
                case = weights(case, "W", q, &[dirs, i, g], Values::int8_weights(q));
                case = weights(case, "R", q, &[dirs, h, g], Values::int8_weights(q));
                case = if with_bias {
                    weights(case, "B", DType::F32, &[dirs, 2 * g], Values::default_for(DType::F32))
                } else {
                    case.absent()
                };
                case = if with_lens {
                    let lens: Vec<f64> = (0..b as usize).map(|k| lens[k % 3].clamp(0, t) as f64).collect();
                    case.input_with("sequence_lens", DType::I32, &[b], Values::Data(lens))
                } else {
                    case.absent()
                };
                for k in 0..2 {
                    case = if with_initial {
                        case.input(&format!("initial_{k}"), DType::F32, &[dirs, b, h])
                    } else {
                        case.absent()
                    };
                }
                case = if with_peepholes {
                    weights(case, "P", DType::F32, &[dirs, 3 * h], Values::default_for(DType::F32))
                } else {
                    case.absent()
                };
                let p: Vec<i64> = if columns { vec![dirs, g] } else { vec![dirs] };
                let n = p.iter().product::<i64>() as usize;
                // Per column: zeros for int8, one value for uint8 (ORT's rule); per direction any.
                let zero_point = match (columns, q) {
                    (true, DType::I8) => Values::Data(vec![0.0; n]),
                    (true, _) => Values::Data(vec![zp as f64; n]),
                    (false, DType::I8) => Values::Data(vec![(zp - 128) as f64; n]),
                    (false, _) => Values::Data(vec![zp as f64; n]),
                };
                let scale = Values::Uniform { lo: 0.001, hi: 0.05 };
                let r_scale = if wide { Values::Uniform { lo: 1e-6, hi: 2e-6 } } else { scale.clone() };
                case = weights(case, "W_scale", DType::F32, &p, scale);
                case = weights(case, "W_zero_point", q, &p, zero_point.clone());
                case = weights(case, "R_scale", DType::F32, &p, r_scale);
                case = weights(case, "R_zero_point", q, &p, zero_point);
                case = case.attr_int("hidden_size", h).attr_str("direction", direction);
                if forget {
                    case = case.attr_int("input_forget", 1);
                }
                if seed % 3 == 0 {
                    case = case.attr_float("clip", 0.75);
                }
                case.output("Y", DType::F32, &[t, dirs, b, h]).output("Y_h", DType::F32, &[dirs, b, h]).output(
                    "Y_c",
                    DType::F32,
                    &[dirs, b, h],
                )
            })
            .boxed()
    });
}
