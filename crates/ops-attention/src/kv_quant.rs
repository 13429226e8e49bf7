//! GroupQueryAttention's quantized KV caches, as ORT's CPU kernel keeps them: `k_quant_type` /
//! `v_quant_type` `PER_TENSOR` (a scale of one element) or `PER_CHANNEL` (`[kv_heads, 1,
//! head]`), `kv_cache_bit_width` 8 (past and present int8, `[B, kv_heads, rows, head]`) or 4
//! (uint8 holding two codes, `[B, kv_heads, rows, head / 2]`: the even element in the low
//! nibble, each code stored plus 8). The new rows are stored as `clip(round(x * (1 / scale)),
//! -128, 127)` (or `-8, 7`; halves to even; NaN stored as the largest code; a zero scale
//! read as 1), and attention reads the whole present dequantized (`q * scale`), the new rows
//! too.

use ep_core::lowering::require_input_type;
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{AttrValue, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

/// Whether the cache named `what` (`k` or `v`) is quantized, declining what is not supported:
/// its attribute `{what}_quant_type`, its scale input, past input and present output.
pub(crate) fn claim(
    node: &NodeInfo,
    what: &str,
    (scale, past, present): (usize, usize, usize),
    query: Option<ElemType>,
) -> std::result::Result<bool, Decline> {
    let kind = kind(node, what).map_err(Decline)?;
    let cache_type = |i: Option<&ep_core::ValueInfo>| i.and_then(|v| v.elem_type);
    match kind.as_str() {
        "NONE" => {
            if node.input(scale).is_some() {
                return Err(Decline(format!("a {what}_scale without {what}_quant_type")));
            }
            if node.input(past).is_some() && cache_type(node.input(past)) != query {
                return Err(Decline(format!("past_{what} is not the query's type (and not quantized)")));
            }
            Ok(false)
        }
        "PER_TENSOR" | "PER_CHANNEL" => {
            let code = match node.attr_int("kv_cache_bit_width", 0)? {
                8 => ElemType::I8,
                4 => ElemType::U8,
                bits => {
                    return Err(Decline(format!("kv_cache_bit_width={bits}: 8-bit and 4-bit caches are supported")));
                }
            };
            if node.input(scale).is_none() {
                return Err(Decline(format!("{what}_quant_type={kind} without {what}_scale")));
            }
            require_input_type(node, scale, &[ElemType::F32])?;
            if node.input(past).is_some() {
                require_input_type(node, past, &[code])?;
            }
            if node.output(present).and_then(|v| v.elem_type).is_some_and(|t| t != code) {
                return Err(Decline(format!("present_{what} of a quantized cache is not {code:?}")));
            }
            Ok(true)
        }
        other => Err(Decline(format!("{what}_quant_type={other} is not supported"))),
    }
}

/// `{what}_quant_type` (`NONE` when absent).
fn kind(node: &NodeInfo, what: &str) -> std::result::Result<String, String> {
    match node.attr(&format!("{what}_quant_type")) {
        None => Ok("NONE".to_owned()),
        Some(AttrValue::String(v)) => Ok(v.clone()),
        Some(other) => Err(format!("{what}_quant_type is {other:?}, not a string")),
    }
}

/// How one cache's rows are stored and read back.
pub(crate) struct Codec {
    /// The scale, broadcastable against `[B, kv_heads, rows, head]`; `None`: not quantized.
    scale: Option<Array>,
    /// 8 or 4 (two codes a byte).
    bits: i64,
}

impl Codec {
    /// The cache of `what`: its scale input `scale` when `{what}_quant_type` is set.
    pub(crate) fn read(
        ctx: &LowerCtx<'_>,
        node: &NodeInfo,
        what: &str,
        scale: usize,
        kv_heads: i64,
        head: i64,
    ) -> Result<Codec> {
        let kind = kind(node, what)?;
        if kind == "NONE" {
            return Ok(Codec { scale: None, bits: 0 });
        }
        let bits = node.attr_int("kv_cache_bit_width", 0)?;
        if bits == 4 && head % 2 != 0 {
            bail!("a 4-bit {what} cache packs two elements a byte: head size {head} is odd");
        }
        let s = ctx.stream();
        let sc = ops::astype(ctx.input(scale)?, Dtype::F32, s)?;
        let scale = match kind.as_str() {
            "PER_TENSOR" => {
                if sc.size() != 1 {
                    bail!("{what}_scale {:?} of a PER_TENSOR cache must hold one value", sc.shape());
                }
                ops::reshape(&sc, &[], s)?
            }
            "PER_CHANNEL" => {
                // (Read as its elements, as ORT's kernel reads it, whatever its shape.)
                if sc.size() as i64 != kv_heads * head {
                    bail!(
                        "{what}_scale {:?} of a PER_CHANNEL cache must hold {kv_heads} x {head} values ([{kv_heads}, 1, {head}])",
                        sc.shape()
                    );
                }
                ops::reshape(&sc, &[1, kv_heads, 1, head], s)?
            }
            other => bail!("{what}_quant_type={other} is not supported"),
        };
        Ok(Codec { scale: Some(scale), bits })
    }

    pub(crate) fn quantized(&self) -> bool {
        self.scale.is_some()
    }

    /// The cache's last dimension for heads of `head` elements.
    pub(crate) fn width(&self, head: i64) -> i64 {
        if self.quantized() && self.bits == 4 { head / 2 } else { head }
    }

    /// New rows `[B, kv_heads, S, head]` as the cache holds them: int8 codes, 4-bit codes
    /// packed two a byte, or `x` itself.
    pub(crate) fn store(&self, x: &Array, s: &Stream) -> Result<Array> {
        let Some(scale) = &self.scale else { return Ok(x.clone()) };
        // Multiplied by the scale's reciprocal (rounded once), as ORT's kernel computes it.
        let one = ops::scalar(1.0, Dtype::F32, s)?;
        let zero = ops::scalar(0.0, Dtype::F32, s)?;
        let inverse = ops::where_(&ops::equal(scale, &zero, s)?, &one, &ops::divide(&one, scale, s)?, s)?;
        let q = ops::round(&ops::multiply(&ops::astype(x, Dtype::F32, s)?, &inverse, s)?, s)?;
        let (lo, hi) = if self.bits == 4 { (-8.0, 7.0) } else { (-128.0, 127.0) };
        let (lo, hi) = (ops::scalar(lo, Dtype::F32, s)?, ops::scalar(hi, Dtype::F32, s)?);
        let q = ops::clip(&q, Some(&lo), Some(&hi), s)?;
        let q = ops::where_(&ops::isnan(&q, s)?, &hi, &q, s)?;
        if self.bits != 4 {
            return Ok(ops::astype(&q, Dtype::I8, s)?);
        }
        // Codes plus 8 in 0..=15, pairs along the head: the even one low, the odd one high.
        let u = ops::astype(&ops::add(&q, &ops::scalar(8.0, Dtype::F32, s)?, s)?, Dtype::U8, s)?;
        let mut pairs = x.shape();
        let head = pairs.pop().unwrap_or(0);
        pairs.extend([head / 2, 2]);
        let mut p = ops::split_at(&ops::reshape(&u, &pairs, s)?, &[1], -1, s)?.into_iter();
        let (Some(even), Some(odd)) = (p.next(), p.next()) else { bail!("the codes did not split in pairs") };
        let sixteen = ops::scalar(16.0, Dtype::U8, s)?;
        let packed = ops::add(&even, &ops::multiply(&odd, &sixteen, s)?, s)?;
        pairs.pop();
        Ok(ops::reshape(&packed, &pairs, s)?)
    }

    /// Cache rows as float32 for the attention.
    pub(crate) fn load(&self, x: &Array, s: &Stream) -> Result<Array> {
        let Some(scale) = &self.scale else { return Ok(ops::astype(x, Dtype::F32, s)?) };
        let q = if self.bits == 4 {
            // Each byte's low nibble, then its high one, less 8.
            let sixteen = ops::scalar(16.0, Dtype::U8, s)?;
            let (low, high) = (ops::remainder(x, &sixteen, s)?, ops::floor_divide(x, &sixteen, s)?);
            let both = ops::stack(&[low, high], -1, s)?;
            let mut shape = x.shape();
            let width = shape.pop().unwrap_or(0);
            shape.push(width * 2);
            let codes = ops::astype(&ops::reshape(&both, &shape, s)?, Dtype::F32, s)?;
            ops::subtract(&codes, &ops::scalar(8.0, Dtype::F32, s)?, s)?
        } else {
            ops::astype(x, Dtype::F32, s)?
        };
        Ok(ops::multiply(&q, scale, s)?)
    }
}
