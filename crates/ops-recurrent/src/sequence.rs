//! What RNN, GRU and LSTM (and DynamicQuantizeLSTM) share: their attributes, the checks of
//! their inputs' shapes, and the time loop over one or both directions with `sequence_lens`
//! and both layouts.

use crate::activation::{self, Activation};
use ep_core::graph::AttrValue;
use ep_core::lowering::{require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{Decline, ElemType, Error, LowerCtx, NodeInfo, Result};

/// The element types the recurrent lowerings take (ORT's CPU EP runs float32 and, for GRU and
/// LSTM, float64; MLX's GPUs have no float64).
pub(crate) const TYPES: &[ElemType] = &[ElemType::F32];

/// The most time steps unrolled into one graph. A longer sequence is left to ORT's CPU EP
/// when its length is known at claim time and fails the run with that reason when it is not.
pub(crate) const MAX_STEPS: i64 = 4096;

/// One recurrent op's cell: how many gates its weights stack and how one step updates its
/// states.
pub(crate) trait Cell {
    /// The op's name, for messages.
    const OP: &'static str;
    /// Gates stacked in W and R (`[num_directions, GATES * hidden, ...]`).
    const GATES: i64;
    /// Activation functions per direction.
    const ACTIVATIONS: usize;
    /// The default activations of one direction.
    const DEFAULTS: &'static [&'static str];
    /// Recurrent states (h, and c for LSTM).
    const STATES: usize;
    /// Whether a batch entry whose sequence length is 0 ends with zero states (ORT's GRU and
    /// LSTM) rather than its initial ones.
    const EMPTY_ENDS_AT_ZERO: bool = true;

    /// The activations of every direction from the node's `activations` (`names`, empty when
    /// absent) and parameters: GRU and LSTM take exactly [`Self::ACTIVATIONS`] names per
    /// direction (any case) and consume the alphas and betas in order.
    fn activations(
        names: &[String],
        alphas: Option<&[f32]>,
        betas: Option<&[f32]>,
        directions: usize,
    ) -> std::result::Result<Vec<Activation>, String> {
        let wanted = Self::ACTIVATIONS * directions;
        let names: Vec<String> = if names.is_empty() {
            (0..directions).flat_map(|_| Self::DEFAULTS.iter().map(|s| (*s).to_owned())).collect()
        } else if names.len() == wanted {
            names.to_vec()
        } else {
            return Err(format!("{} activations given; {} has {wanted}", names.len(), Self::OP));
        };
        activation::in_order(&names, alphas.unwrap_or_default(), betas.unwrap_or_default())
    }

    /// The `clip` attribute's bound: GRU and LSTM need a positive one.
    fn clip(c: f32) -> std::result::Result<Option<f64>, String> {
        if c > 0.0 { Ok(Some(f64::from(c))) } else { Err(format!("clip={c} is not positive")) }
    }

    /// The R bias terms that are not added to the input projection once for the whole
    /// sequence (GRU's hidden gate with `linear_before_reset`), as a range of gates.
    fn late_recurrent_bias(&self) -> std::ops::Range<i64> {
        0..0
    }

    /// One step of one direction: the new states from the old ones. `xw` is the step's input
    /// projection with the biases folded in (`[B, GATES * H]`).
    fn step(&self, at: &Step<'_>, xw: &Array, states: &[Array]) -> Result<Vec<Array>>;
}

/// What a step of one direction computes with.
pub(crate) struct Step<'a> {
    /// `R^T` of the direction: `[H, GATES * H]`.
    pub rt: &'a Array,
    /// The direction's R bias of the gates [`Cell::late_recurrent_bias`] names, `[1, n * H]`.
    pub late_bias: Option<&'a Array>,
    /// LSTM's peepholes of the direction, `[1, 3H]` (i, o, f).
    pub peepholes: Option<&'a Array>,
    /// The direction's activations ([`Cell::ACTIVATIONS`] of them).
    pub acts: &'a [Activation],
    pub clip: Option<f64>,
    pub hidden: i64,
    pub stream: &'a Stream,
    /// DynamicQuantizeLSTM's step: `h @ R` as an integer product of `h` quantized dynamically.
    pub quant: Option<crate::dynamic_quantize_lstm::StepProduct<'a>>,
}

impl Step<'_> {
    /// `act(clip(x))`: ONNX clips every gate's input before its activation.
    pub fn gate(&self, which: usize, x: &Array) -> Result<Array> {
        let x = match self.clip {
            Some(c) => {
                let s = self.stream;
                let lo = ops::scalar(-c, x.dtype(), s)?;
                let hi = ops::scalar(c, x.dtype(), s)?;
                ops::clip(x, Some(&lo), Some(&hi), s)?
            }
            None => x.clone(),
        };
        self.acts[which].apply(&x, self.stream)
    }

    /// `h @ R^T` for gates `range` of the direction.
    pub fn recurrent(&self, h: &Array, range: std::ops::Range<i64>) -> Result<Array> {
        let s = self.stream;
        if let Some(q) = &self.quant {
            return q.product(h, range, s);
        }
        let hidden = self.hidden;
        let full = range.start == 0 && range.end * hidden == self.rt.shape()[1];
        let rt = if full {
            self.rt.clone()
        } else {
            ops::slice(self.rt, &[0, range.start * hidden], &[hidden, range.end * hidden], s)?
        };
        Ok(ops::matmul(h, &rt, s)?)
    }

    /// Gate `g` (of `n` stacked in `x`, `[B, n * H]`).
    pub fn part(&self, x: &Array, g: i64) -> Result<Array> {
        let (b, h) = (x.shape()[0], self.hidden);
        Ok(ops::slice(x, &[0, g * h], &[b, (g + 1) * h], self.stream)?)
    }
}

/// The direction attribute.
fn directions(node: &NodeInfo) -> std::result::Result<Vec<bool>, String> {
    match node.attr("direction") {
        None => Ok(vec![false]),
        Some(AttrValue::String(d)) => match d.as_str() {
            "forward" => Ok(vec![false]),
            "reverse" => Ok(vec![true]),
            "bidirectional" => Ok(vec![false, true]),
            other => Err(format!("direction '{other}' is not forward, reverse or bidirectional")),
        },
        Some(other) => Err(format!("attribute 'direction' should be a string, found {other:?}")),
    }
}

/// A 0/1 attribute (GRU's `linear_before_reset`, LSTM's `input_forget`): ORT's CPU EP takes
/// any 32-bit value, nonzero meaning set, and refuses one past 32 bits, as the MLX EP does.
pub(crate) fn flag(node: &NodeInfo, name: &str) -> std::result::Result<bool, String> {
    let v = node.attr_int(name, 0)?;
    if i32::try_from(v).is_err() {
        return Err(format!("{name}={v} does not fit 32 bits"));
    }
    Ok(v != 0)
}

/// The attributes every recurrent op has, read and checked.
pub(crate) struct Attributes {
    pub hidden: i64,
    /// Per direction: whether it runs backwards in time.
    pub reverse: Vec<bool>,
    /// `ACTIVATIONS` per direction, directions in order.
    pub acts: Vec<Activation>,
    pub clip: Option<f64>,
    /// 0: `[T, B, ...]`; 1: `[B, T, ...]`.
    pub layout: i64,
}

impl Attributes {
    pub fn read<C: Cell>(node: &NodeInfo) -> std::result::Result<Attributes, String> {
        let hidden = node.attr_int("hidden_size", 0)?;
        if hidden <= 0 || i32::try_from(hidden).is_err() {
            return Err(format!("hidden_size={hidden}: {} needs a positive 32-bit hidden_size", C::OP));
        }
        let reverse = directions(node)?;
        let names: Vec<String> = match node.attr("activations") {
            None => Vec::new(),
            Some(AttrValue::Strings(v)) => v.clone(),
            Some(other) => return Err(format!("attribute 'activations' should be strings, found {other:?}")),
        };
        let floats = |name: &str| -> std::result::Result<Option<Vec<f32>>, String> {
            match node.attr(name) {
                None => Ok(None),
                Some(AttrValue::Floats(v)) => Ok(Some(v.clone())),
                Some(other) => Err(format!("attribute '{name}' should be floats, found {other:?}")),
            }
        };
        let (alphas, betas) = (floats("activation_alpha")?, floats("activation_beta")?);
        let acts = C::activations(&names, alphas.as_deref(), betas.as_deref(), reverse.len())?;
        let clip = match node.attr("clip") {
            None => None,
            Some(AttrValue::Float(c)) if c.is_nan() => return Err("clip is NaN".into()),
            Some(AttrValue::Float(c)) => C::clip(*c)?,
            Some(other) => return Err(format!("attribute 'clip' should be a float, found {other:?}")),
        };
        let layout = node.attr_int("layout", 0)?;
        if !(0..=1).contains(&layout) {
            return Err(format!("layout={layout} is not 0 or 1"));
        }
        Ok(Attributes { hidden, reverse, acts, clip, layout })
    }
}

/// The claim every recurrent op shares: types, input counts, attributes, the known dims of the
/// inputs against the weights', and the sequence length within [`MAX_STEPS`].
pub(crate) fn claim<C: Cell>(node: &NodeInfo, max_inputs: usize) -> std::result::Result<Attributes, Decline> {
    require_inputs(node, 3, max_inputs)?;
    for i in [0, 1, 2, 3, 5, 6, 7] {
        if i < max_inputs && node.input(i).is_some() {
            require_input_type(node, i, TYPES)?;
        }
    }
    if node.input(4).is_some() {
        require_input_type(node, 4, &[ElemType::I32])?;
    }
    let attrs = Attributes::read::<C>(node).map_err(Decline)?;
    let dims = |i: usize| node.input(i).and_then(|v| v.shape.clone());
    let expect_rank = |i: usize, rank: usize, what: &str| -> std::result::Result<(), Decline> {
        match dims(i) {
            Some(d) if d.len() != rank => Err(Decline(format!("{what} has rank {}; {} needs {rank}", d.len(), C::OP))),
            _ => Ok(()),
        }
    };
    expect_rank(0, 3, "X")?;
    expect_rank(1, 3, "W")?;
    expect_rank(2, 3, "R")?;
    let steps_axis = attrs.layout as usize;
    if let Some(Some(t)) = dims(0).map(|d| d[steps_axis])
        && t > MAX_STEPS
    {
        return Err(Decline(format!("{t} time steps; the MLX EP unrolls at most {MAX_STEPS}")));
    }
    Ok(attrs)
}

/// The inputs of one recurrent node, checked against each other.
struct Inputs {
    /// `[T, B, I]`.
    x: Array,
    /// Per direction: `W^T` `[I, G * H]`, `R^T` `[H, G * H]` (none for DynamicQuantizeLSTM,
    /// whose integer weights come apart).
    wt: Option<Array>,
    rt: Option<Array>,
    /// `[dirs, G * H]` (W and early R biases), `[dirs, 1, n * H]` (late R biases).
    bias: Option<Array>,
    late_bias: Option<Array>,
    /// `[B]` int32.
    lens: Option<Array>,
    /// Initial states `[dirs, B, H]`, h then c.
    initial: Vec<Option<Array>>,
    /// `[dirs, 1, 3H]`.
    peepholes: Option<Array>,
}

fn shape_error(op: &str, what: &str, found: &[i64], expected: &[i64]) -> Error {
    Error::new(format!("{op}: {what} has shape {found:?}; expected {expected:?}"))
}

/// Reads and checks the node's inputs. `initial` are the input indices of the initial states
/// (5, and 6 for LSTM); `peephole` LSTM's P (7).
fn inputs<C: Cell>(
    cell: &C,
    ctx: &LowerCtx<'_>,
    a: &Attributes,
    initial: &[usize],
    peephole: Option<usize>,
    float_weights: bool,
) -> Result<Inputs> {
    let s = ctx.stream();
    let (g, h, dirs) = (C::GATES, a.hidden, a.reverse.len() as i64);
    let mut x = ctx.input(0)?.clone();
    if x.ndim() != 3 {
        return Err(Error::new(format!("{}: X has rank {}; expected 3", C::OP, x.ndim())));
    }
    if a.layout == 1 {
        x = ops::transpose_axes(&x, &[1, 0, 2], s)?;
    }
    let (t, b, i) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    if t > MAX_STEPS {
        return Err(Error::new(format!("{}: {t} time steps; the MLX EP unrolls at most {MAX_STEPS}", C::OP)));
    }
    let (wt, rt) = if float_weights {
        let w = ctx.input(1)?;
        if w.shape() != [dirs, g * h, i] {
            return Err(shape_error(C::OP, "W", &w.shape(), &[dirs, g * h, i]));
        }
        let r = ctx.input(2)?;
        if r.shape() != [dirs, g * h, h] {
            return Err(shape_error(C::OP, "R", &r.shape(), &[dirs, g * h, h]));
        }
        let transposed = |array: &Array, s: &Stream| -> Result<Array> {
            Ok(ops::contiguous(&ops::transpose_axes(array, &[0, 2, 1], s)?, s)?)
        };
        (
            Some(ctx.derived(1, "recurrent.transposed", transposed)?),
            Some(ctx.derived(2, "recurrent.transposed", transposed)?),
        )
    } else {
        (None, None)
    };
    let late = cell.late_recurrent_bias();
    let (mut bias, mut late_bias) = (None, None);
    if let Some(bb) = ctx.optional_input(3) {
        if bb.shape() != [dirs, 2 * g * h] {
            return Err(shape_error(C::OP, "B", &bb.shape(), &[dirs, 2 * g * h]));
        }
        let parts = ops::split_at(bb, &[g * h], 1, s)?;
        let (wb, rb) = (&parts[0], &parts[1]);
        let early = if late.is_empty() {
            rb.clone()
        } else {
            let zero = ops::scalar(0.0, rb.dtype(), s)?;
            let kept = ops::slice(rb, &[0, late.start * h], &[dirs, late.end * h], s)?;
            late_bias = Some(ops::expand_dims(&kept, 1, s)?);
            // The late gates' R biases are left out of the sum folded into the projection.
            let before = ops::slice(rb, &[0, 0], &[dirs, late.start * h], s)?;
            let after = ops::slice(rb, &[0, late.end * h], &[dirs, g * h], s)?;
            let gap = ops::broadcast_to(&zero, &[dirs, (late.end - late.start) * h], s)?;
            ops::concatenate(&[before, gap, after], 1, s)?
        };
        bias = Some(ops::add(wb, &early, s)?);
    }
    let lens = match ctx.optional_input(4) {
        Some(l) if l.shape() != [b] => return Err(shape_error(C::OP, "sequence_lens", &l.shape(), &[b])),
        Some(l) => Some(l.clone()),
        None => None,
    };
    let mut states = Vec::new();
    for &k in initial {
        let state = match ctx.optional_input(k) {
            Some(v) => {
                let v = if a.layout == 1 { ops::transpose_axes(v, &[1, 0, 2], s)? } else { v.clone() };
                if v.shape() != [dirs, b, h] {
                    return Err(shape_error(C::OP, "an initial state", &v.shape(), &[dirs, b, h]));
                }
                Some(v)
            }
            None => None,
        };
        states.push(state);
    }
    let peepholes = match peephole.and_then(|k| ctx.optional_input(k)) {
        Some(p) if p.shape() != [dirs, 3 * h] => return Err(shape_error(C::OP, "P", &p.shape(), &[dirs, 3 * h])),
        Some(p) => Some(ops::expand_dims(p, 1, s)?),
        None => None,
    };
    Ok(Inputs { x, wt, rt, bias, late_bias, lens, initial: states, peepholes })
}

/// For `lens` (`[B, 1]` int32) and `t` steps, each entry's steps reversed within its length
/// (ONNX's ReverseSequence along time): `[T, B, 1]` int32 step indices, an involution.
fn reversal_within(lens: &Array, t: i64, b: i64, s: &Stream) -> Result<Array> {
    let steps = ops::reshape(&ops::arange(0.0, t as f64, 1.0, Dtype::I32, s)?, &[t, 1], s)?;
    // Clamped into 0..=T so that no index leaves the steps (a length outside fails the run
    // through its check).
    let (lo, hi) = (ops::scalar(0.0, Dtype::I32, s)?, ops::scalar(t as f64, Dtype::I32, s)?);
    let lens = ops::clip(&ops::reshape(lens, &[1, b], s)?, Some(&lo), Some(&hi), s)?;
    let back = ops::subtract(&ops::subtract(&lens, &ops::scalar(1.0, Dtype::I32, s)?, s)?, &steps, s)?;
    let index = ops::where_(&ops::less(&steps, &lens, s)?, &back, &steps, s)?;
    Ok(ops::reshape(&index, &[t, b, 1], s)?)
}

/// One direction's slice `d` of a `[dirs, ...]` array, without the leading axis.
pub(crate) fn direction(a: &Array, d: i64, s: &Stream) -> Result<Array> {
    let shape = a.shape();
    let mut start = vec![0; shape.len()];
    let mut stop = shape.clone();
    start[0] = d;
    stop[0] = d + 1;
    Ok(ops::reshape(&ops::slice(a, &start, &stop, s)?, &shape[1..], s)?)
}

/// Runs the node: every direction's time loop, then the outputs in the node's layout: `Y`
/// (`[T, dirs, B, H]`) and the last states (`[dirs, B, H]`), one per [`Cell::STATES`].
/// `quant`: DynamicQuantizeLSTM's integer weights, in place of W and R.
pub(crate) fn run<C: Cell>(
    cell: &C,
    ctx: &mut LowerCtx<'_>,
    a: &Attributes,
    initial: &[usize],
    peephole: Option<usize>,
    quant: Option<&crate::dynamic_quantize_lstm::Weights>,
) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let v = inputs(cell, ctx, a, initial, peephole, quant.is_none())?;
    let (t, b, h) = (v.x.shape()[0], v.x.shape()[1], a.hidden);
    let dtype = v.x.dtype();
    let zeros = ops::broadcast_to(&ops::scalar(0.0, dtype, s)?, &[b, h], s)?;
    // Per step, which batch entries are still inside their sequence: `[B, 1]` booleans.
    let lens = match &v.lens {
        Some(l) => {
            let l = ops::reshape(&ops::astype(l, Dtype::I32, s)?, &[b, 1], s)?;
            let (zero, steps) = (ops::scalar(0.0, Dtype::I32, s)?, ops::scalar(t as f64, Dtype::I32, s)?);
            let inside = ops::logical_and(&ops::greater_equal(&l, &zero, s)?, &ops::less_equal(&l, &steps, s)?, s)?;
            ctx.check(&inside, format!("a sequence length is outside 0..={t}"))?;
            Some(l)
        }
        None => None,
    };
    // DynamicQuantizeLSTM's X, quantized once for every direction.
    let xq = quant.map(|q| q.quantized_input(&v.x, lens.as_ref(), s)).transpose()?;
    let mut ys = Vec::new();
    let mut last: Vec<Vec<Array>> = vec![Vec::new(); C::STATES];
    for (d, &reverse) in a.reverse.iter().enumerate() {
        let d = d as i64;
        // The input projection of every step at once, biases folded in: `[T, B, G * H]`.
        let mut xw = match (quant.zip(xq.as_ref()), &v.wt) {
            (Some((q, xq)), _) => q.input_product(xq, d, s)?,
            (None, Some(wt)) => ops::matmul(&v.x, &direction(wt, d, s)?, s)?,
            (None, None) => return Err(Error::new(format!("{}: no weights", C::OP))),
        };
        if let Some(bias) = &v.bias {
            xw = ops::add(&xw, &direction(bias, d, s)?, s)?;
        }
        // A quantized reverse direction with lengths runs as ORT's kernel does: each entry's
        // steps reversed within its length, a forward pass, the outputs reversed back (the
        // entries quantized together are those at the same step of their own reversed
        // sequence).
        let within = match (&lens, quant) {
            (Some(lens), Some(_)) if reverse => Some(reversal_within(lens, t, b, s)?),
            _ => None,
        };
        if let Some(index) = &within {
            xw = ops::take_along_axis(&xw, &ops::broadcast_to(index, &xw.shape(), s)?, 0, s)?;
        }
        let backwards = reverse && within.is_none();
        let rt = match &v.rt {
            Some(rt) => direction(rt, d, s)?,
            None => ops::scalar(0.0, dtype, s)?,
        };
        let recurrent = quant.map(|q| q.recurrent(d, s)).transpose()?;
        let late_bias = v.late_bias.as_ref().map(|lb| direction(lb, d, s)).transpose()?;
        let peepholes = v.peepholes.as_ref().map(|p| direction(p, d, s)).transpose()?;
        let acts = &a.acts[d as usize * C::ACTIVATIONS..(d as usize + 1) * C::ACTIVATIONS];
        let mut states: Vec<Array> = v
            .initial
            .iter()
            .map(|i| i.as_ref().map_or(Ok(zeros.clone()), |i| direction(i, d, s)))
            .collect::<Result<_>>()?;
        while states.len() < C::STATES {
            states.push(zeros.clone());
        }
        let per_step = if t > 1 { ops::split_at(&xw, &(1..t).collect::<Vec<_>>(), 0, s)? } else { vec![xw.clone()] };
        let mut outs: Vec<Option<Array>> = vec![None; t as usize];
        let order: Vec<i64> = if backwards { (0..t).rev().collect() } else { (0..t).collect() };
        for step_t in order {
            let x_t = ops::reshape(&per_step[step_t as usize], &[b, C::GATES * h], s)?;
            // A quantized step reads h as ORT's kernel holds it: zero for an entry whose
            // sequence ended before the previous step.
            let live = match (&lens, backwards) {
                (Some(lens), false) if recurrent.is_some() => {
                    Some(ops::less_equal(&ops::scalar(step_t as f64, Dtype::I32, s)?, lens, s)?)
                }
                _ => None,
            };
            let step = Step {
                rt: &rt,
                late_bias: late_bias.as_ref(),
                peepholes: peepholes.as_ref(),
                acts,
                clip: a.clip,
                hidden: h,
                stream: s,
                quant: recurrent.as_ref().map(|r| r.step(live.as_ref())),
            };
            let new = cell.step(&step, &x_t, &states)?;
            let (y, kept) = match &lens {
                Some(lens) => {
                    let inside = ops::less(&ops::scalar(step_t as f64, Dtype::I32, s)?, lens, s)?;
                    let kept = new
                        .iter()
                        .zip(&states)
                        .map(|(n, o)| ops::where_(&inside, n, o, s))
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    (ops::where_(&inside, &new[0], &zeros, s)?, kept)
                }
                None => (new[0].clone(), new),
            };
            outs[step_t as usize] = Some(y);
            states = kept;
        }
        let outs: Vec<Array> = outs.into_iter().map(|o| o.expect("every step ran")).collect();
        ys.push(match (outs.is_empty(), &within) {
            (true, _) => ops::broadcast_to(&ops::scalar(0.0, dtype, s)?, &[0, b, h], s)?,
            (false, None) => ops::stack(&outs, 0, s)?,
            (false, Some(index)) => {
                let y = ops::stack(&outs, 0, s)?;
                ops::take_along_axis(&y, &ops::broadcast_to(index, &y.shape(), s)?, 0, s)?
            }
        });
        if t == 0 {
            // No step at all: ORT's CPU EP ends every op at zero states, initial ones or not.
            states = vec![zeros.clone(); states.len()];
        } else if let (Some(lens), true) = (&lens, C::EMPTY_ENDS_AT_ZERO) {
            let started = ops::greater(lens, &ops::scalar(0.0, Dtype::I32, s)?, s)?;
            states =
                states.iter().map(|st| ops::where_(&started, st, &zeros, s)).collect::<std::result::Result<_, _>>()?;
        }
        for (k, state) in states.into_iter().enumerate() {
            last[k].push(state);
        }
    }
    let mut y = ops::stack(&ys, 1, s)?;
    let mut finals: Vec<Array> = last.iter().map(|l| ops::stack(l, 0, s)).collect::<std::result::Result<_, _>>()?;
    if a.layout == 1 {
        y = ops::transpose_axes(&y, &[2, 0, 1, 3], s)?;
        finals = finals.iter().map(|f| ops::transpose_axes(f, &[1, 0, 2], s)).collect::<std::result::Result<_, _>>()?;
    }
    let mut out = vec![y];
    out.extend(finals);
    Ok(out)
}

#[cfg(feature = "conformance")]
pub(crate) mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Attr, Case, DType, Values};

    /// What a recurrent op's cases vary by.
    pub(crate) struct Recurrent {
        pub op: &'static str,
        pub gates: i64,
        pub activations: usize,
        pub states: usize,
    }

    /// Activation sets drawn for one direction, with the alphas and betas they consume.
    const ACTIVATIONS: &[&str] = &[
        "Sigmoid",
        "Tanh",
        "Relu",
        "HardSigmoid",
        "LeakyRelu",
        "Affine",
        "ScaledTanh",
        "Elu",
        "Softsign",
        "Softplus",
        "ThresholdedRelu",
    ];

    /// Cases of `r.op`: 1-5 steps, batch 1-3, input and hidden 1-5, every direction, weights
    /// as constants or runtime inputs, with or without biases, sequence lengths, initial states
    /// and peepholes, default or drawn activations, clip. Layout 0 only: ORT's CPU EP refuses
    /// `layout = 1` (the ONNX node tests `*_batchwise` check that layout against their own
    /// expected outputs).
    pub(crate) fn case(r: Recurrent) -> BoxedStrategy<Case> {
        let shapes = (1..=5i64, 1..=3i64, 1..=5i64, 1..=5i64, 0..=2usize, opset(7..=22));
        let options =
            (any::<[bool; 6]>(), collection::vec(0..ACTIVATIONS.len(), 6), collection::vec(0..=5i64, 3), seed());
        (shapes, options)
            .prop_map(move |((t, b, i, h, dir, v), (flags, acts, lens, seed))| {
                let [with_bias, with_lens, with_initial, with_extra, constants, _] = flags;
                let layout = 0;
                let direction = ["forward", "reverse", "bidirectional"][dir];
                let dirs = if dir == 2 { 2 } else { 1 };
                let g = r.gates;
                let mut case = Case::op(r.op, v).with_seed(seed);
                let (x, state) = if layout == 1 { ([b, t, i], [b, dirs, h]) } else { ([t, b, i], [dirs, b, h]) };
                case = case.input("X", DType::F32, &x);
                let weights = |case: Case, name: &str, shape: &[i64]| {
                    if constants {
                        case.constant(name, DType::F32, shape, Values::default_for(DType::F32))
                    } else {
                        case.input(name, DType::F32, shape)
                    }
                };
                case = weights(case, "W", &[dirs, g * h, i]);
                case = weights(case, "R", &[dirs, g * h, h]);
                case = if with_bias { weights(case, "B", &[dirs, 2 * g * h]) } else { case.absent() };
                case = if with_lens {
                    // ORT's RNN reads outside its buffers for a length of 0.
                    let least = if r.op == "RNN" { 1 } else { 0 };
                    let lens: Vec<f64> = (0..b as usize).map(|k| lens[k % 3].clamp(least, t) as f64).collect();
                    case.input_with("sequence_lens", DType::I32, &[b], Values::Data(lens))
                } else {
                    case.absent()
                };
                for k in 0..r.states {
                    case = if with_initial {
                        case.input(&format!("initial_{k}"), DType::F32, &state)
                    } else {
                        case.absent()
                    };
                }
                if r.op == "LSTM" && with_extra {
                    case = weights(case, "P", &[dirs, 3 * h]);
                }
                case = case.attr_int("hidden_size", h).attr_str("direction", direction);
                if layout == 1 {
                    case = case.attr_int("layout", 1);
                }
                if seed % 4 == 0 {
                    // RNN: one activation for both directions (each reads its own alpha).
                    let pick = |k: usize| if r.op == "RNN" { acts[0] } else { acts[k % 6] };
                    let names: Vec<String> =
                        (0..r.activations * dirs as usize).map(|k| ACTIVATIONS[pick(k)].to_owned()).collect();
                    case = case
                        .attr("activations", Attr::Strs(names))
                        .attr("activation_alpha", Attr::Floats(vec![0.5, 0.3, 1.5, 0.1, 0.7, 0.2]))
                        .attr("activation_beta", Attr::Floats(vec![0.25, 0.5, 0.4, 0.6, 0.3, 0.1]));
                }
                if seed % 3 == 0 {
                    case = case.attr_float("clip", 0.75);
                }
                if with_extra && r.op == "GRU" {
                    case = case.attr_int("linear_before_reset", 1);
                }
                let y = if layout == 1 { [b, t, dirs, h] } else { [t, dirs, b, h] };
                case = case.output("Y", DType::F32, &y);
                for k in 0..r.states {
                    case = case.output(&format!("Y_{k}"), DType::F32, &state);
                }
                case
            })
            .boxed()
    }
}
