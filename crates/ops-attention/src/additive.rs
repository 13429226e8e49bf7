//! The terms the BERT-era attention ops (`com.microsoft` Attention, QAttention and
//! MultiHeadAttention) add to their scaled scores, built and added as ORT's CPU kernels do:
//! the attention bias, then the mask (`mask_filter_value`, finite, not `-inf`, where the
//! padding mask hides a key, overwritten by the lowest float past the causal frontier).

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

/// What ORT adds to the scaled scores, in its order: the attention bias, then the mask (see
/// [`additive_terms`]).
pub(crate) struct Terms {
    pub bias: Option<Array>,
    pub mask: Option<Array>,
}

impl Terms {
    /// The one term to add where there is at most one (for MLX's fused attention, which adds
    /// a single term); `None` where both are there.
    pub(crate) fn single(&self) -> Option<Option<&Array>> {
        match (&self.bias, &self.mask) {
            (Some(_), Some(_)) => None,
            (b, m) => Some(b.as_ref().or(m.as_ref())),
        }
    }

    /// `scores + bias + mask`, added in that order (as ORT does; at a mask_filter_value of
    /// -10000 a score keeps only a few bits, so the order shows in a fully masked row).
    pub(crate) fn apply(&self, mut scores: Array, s: &Stream) -> Result<Array> {
        for term in [&self.bias, &self.mask].into_iter().flatten() {
            scores = ops::add(&scores, term, s)?;
        }
        Ok(scores)
    }
}

/// The terms added to the scaled scores (float32, broadcastable to the scores). `bias` must
/// have passed [`check_bias`]; `keep` (booleans broadcastable to the scores) marks the keys
/// the padding mask keeps; `causal` applies only to more than one query. ORT's mask is
/// mask_filter_value where the padding mask masks a key, overwritten by the lowest float where
/// the causal frontier does; the bias is added before it (so a NaN or infinite bias on a key
/// the query does not see still reaches its row; a finite one rounds away against the lowest
/// float).
pub(crate) fn additive_terms(
    bias: Option<Array>,
    keep: Option<&Array>,
    filter: f64,
    causal: Option<Causal>,
    at: &Scores,
    s: &Stream,
) -> Result<Terms> {
    let mut mask = match keep {
        Some(keep) => {
            Some(ops::where_(keep, &ops::scalar(0.0, Dtype::F32, s)?, &ops::scalar(filter, Dtype::F32, s)?, s)?)
        }
        None => None,
    };
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
        let base = mask.take().map_or_else(|| ops::scalar(0.0, Dtype::F32, s), Ok)?;
        mask = Some(ops::where_(&allowed, &base, &lowest, s)?);
    }
    Ok(Terms { bias, mask })
}
