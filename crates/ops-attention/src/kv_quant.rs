//! GroupQueryAttention's 8-bit KV cache, as ORT's CPU kernel keeps it: `k_quant_type` /
//! `v_quant_type` `PER_TENSOR` (a scale of one element) or `PER_CHANNEL` (`[kv_heads, 1,
//! head]`), `kv_cache_bit_width` 8, past and present int8. The new rows are stored as
//! `clip(round(x / scale), -128, 127)` (halves to even; NaN stored as 127), and attention reads
//! the whole present dequantized (`q * scale`), the new rows too.

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
            let bits = node.attr_int("kv_cache_bit_width", 0)?;
            if bits != 8 {
                return Err(Decline(format!("kv_cache_bit_width={bits}: only 8-bit caches are supported")));
            }
            if node.input(scale).is_none() {
                return Err(Decline(format!("{what}_quant_type={kind} without {what}_scale")));
            }
            require_input_type(node, scale, &[ElemType::F32])?;
            if node.input(past).is_some() {
                require_input_type(node, past, &[ElemType::I8])?;
            }
            if node.output(present).and_then(|v| v.elem_type).is_some_and(|t| t != ElemType::I8) {
                return Err(Decline(format!("present_{what} of a quantized cache is not int8")));
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
            return Ok(Codec { scale: None });
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
                if sc.shape() != [kv_heads, 1, head] {
                    bail!("{what}_scale {:?} of a PER_CHANNEL cache must be [{kv_heads}, 1, {head}]", sc.shape());
                }
                ops::reshape(&sc, &[1, kv_heads, 1, head], s)?
            }
            other => bail!("{what}_quant_type={other} is not supported"),
        };
        Ok(Codec { scale: Some(scale) })
    }

    pub(crate) fn quantized(&self) -> bool {
        self.scale.is_some()
    }

    /// New rows as the cache holds them: int8 codes, or `x` itself.
    pub(crate) fn store(&self, x: &Array, s: &Stream) -> Result<Array> {
        let Some(scale) = &self.scale else { return Ok(x.clone()) };
        let q = ops::round(&ops::divide(&ops::astype(x, Dtype::F32, s)?, scale, s)?, s)?;
        let (lo, hi) = (ops::scalar(-128.0, Dtype::F32, s)?, ops::scalar(127.0, Dtype::F32, s)?);
        let q = ops::clip(&q, Some(&lo), Some(&hi), s)?;
        let q = ops::where_(&ops::isnan(&q, s)?, &hi, &q, s)?;
        Ok(ops::astype(&q, Dtype::I8, s)?)
    }

    /// Cache rows as float32 for the attention.
    pub(crate) fn load(&self, x: &Array, s: &Stream) -> Result<Array> {
        let f = ops::astype(x, Dtype::F32, s)?;
        Ok(match &self.scale {
            Some(scale) => ops::multiply(&f, scale, s)?,
            None => f,
        })
    }
}
