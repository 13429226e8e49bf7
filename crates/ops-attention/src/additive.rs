//! The additive term of the BERT-era attention ops (`com.microsoft` Attention, QAttention and
//! MultiHeadAttention), built as ORT's CPU kernels build it: the attention bias, plus
//! `mask_filter_value` (finite, not `-inf`) where the padding mask hides a key, then the causal
//! frontier at the lowest float.

use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{Result, bail};

/// The scores' shape `[B, N, S, T]`, and how many of the `T` keys came from the past.
pub(crate) struct Scores {
    pub(crate) batch: i64,
    pub(crate) heads: i64,
    pub(crate) q_len: i64,
    pub(crate) total: i64,
    pub(crate) past: i64,
}

/// The causal frontier: query `i` sees keys `j <= past + i`; MultiHeadAttention's CPU kernel
/// leaves the last query row unmasked (`last_row_open`).
pub(crate) struct Causal {
    pub(crate) last_row_open: bool,
}

/// Checks that `bias` is `[B or 1, N or 1, S, T]` (its last two axes do not broadcast, as in
/// ORT's CPU EP).
pub(crate) fn check_bias(bias: &Array, at: &Scores) -> Result<()> {
    let bs = bias.shape();
    let fits = |dim: i64, n: i64| dim == n || dim == 1;
    if bs.len() != 4 || !fits(bs[0], at.batch) || !fits(bs[1], at.heads) || bs[2] != at.q_len || bs[3] != at.total {
        bail!("attention_bias {bs:?} must be [{} or 1, {} or 1, {}, {}]", at.batch, at.heads, at.q_len, at.total);
    }
    Ok(())
}

/// The term added to the scaled scores (float32, broadcastable to the scores), `None` when
/// there is nothing to add. `bias` must have passed [`check_bias`]; `keep` (booleans
/// broadcastable to the scores) marks the keys the padding mask keeps; `causal` applies only
/// to more than one query.
pub(crate) fn additive_term(
    bias: Option<Array>,
    keep: Option<&Array>,
    filter: f64,
    causal: Option<Causal>,
    at: &Scores,
    s: &Stream,
) -> Result<Option<Array>> {
    let mut add = bias;
    if let Some(keep) = keep {
        let m = ops::where_(keep, &ops::scalar(0.0, Dtype::F32, s)?, &ops::scalar(filter, Dtype::F32, s)?, s)?;
        add = Some(match add {
            Some(b) => ops::add(&b, &m, s)?,
            None => m,
        });
    }
    if let Some(c) = causal.filter(|_| at.q_len > 1) {
        let i = ops::reshape(&ops::arange(0.0, at.q_len as f64, 1.0, Dtype::I32, s)?, &[at.q_len, 1], s)?;
        let j = ops::reshape(&ops::arange(0.0, at.total as f64, 1.0, Dtype::I32, s)?, &[1, at.total], s)?;
        let frontier = ops::add(&i, &ops::scalar(at.past as f64, Dtype::I32, s)?, s)?;
        let mut allowed = ops::less_equal(&j, &frontier, s)?;
        if c.last_row_open {
            let last = ops::equal(&i, &ops::scalar((at.q_len - 1) as f64, Dtype::I32, s)?, s)?;
            allowed = ops::logical_or(&allowed, &last, s)?;
        }
        let lowest = ops::scalar(f64::from(f32::MIN), Dtype::F32, s)?;
        let base = add.take().map_or_else(|| ops::scalar(0.0, Dtype::F32, s), Ok)?;
        add = Some(ops::where_(&allowed, &base, &lowest, s)?);
    }
    Ok(add)
}
