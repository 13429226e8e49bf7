//! The data checks and guards a lowering declares (see [`LowerCtx::check`] and
//! [`LowerCtx::guard`]), and the index helpers built on them.

use super::LowerCtx;
use crate::mlx::{Array, Stream};
use crate::{Error, Result};

/// A condition on runtime data a lowering declared (see [`LowerCtx::check`] and
/// [`LowerCtx::check_range`]).
pub struct Check {
    /// What must hold.
    pub what: Checked,
    /// What is wrong when it does not.
    pub reason: String,
}

/// The two forms of a data check.
pub enum Checked {
    /// A boolean array, true everywhere when the data is valid.
    All(Array),
    /// An integer array whose every element lies within `lo..=hi`: read as its minimum and
    /// maximum, compared on the host, so the graph holds two reductions and no elementwise
    /// chain (on CUDA each distinct chain MLX fuses is a kernel NVRTC compiles, seconds each
    /// on a machine's first run).
    Range { values: Array, lo: i64, hi: i64 },
}

impl Check {
    /// One boolean `[1]`: whether the check holds (for the places that read conditions as
    /// booleans: the split prologue, eager runs).
    pub(crate) fn holds(&self, s: &Stream) -> Result<Array> {
        use crate::mlx::{Dtype, ops};
        let cond = match &self.what {
            Checked::All(cond) => ops::astype(cond, Dtype::Bool, s)?,
            Checked::Range { values, lo, hi } => {
                let v = ops::astype(values, Dtype::I64, s)?;
                let (lo, hi) = (ops::scalar(*lo as f64, Dtype::I64, s)?, ops::scalar(*hi as f64, Dtype::I64, s)?);
                ops::logical_and(&ops::greater_equal(&v, &lo, s)?, &ops::less_equal(&v, &hi, s)?, s)?
            }
        };
        let axes: Vec<i32> = (0..cond.ndim() as i32).collect();
        Ok(ops::reshape(&ops::all_axes(&cond, &axes, false, s)?, &[1], s)?)
    }

    /// The check's entries of an int64 flag vector: `[all]` (0 or 1) or `[min, max]`, with no
    /// elementwise operation between the data and the reductions (see [`Checked::Range`]).
    pub(crate) fn flag_values(&self, s: &Stream) -> Result<Vec<Array>> {
        use crate::mlx::{Dtype, ops};
        match &self.what {
            Checked::Range { values, .. } if values.size() > 0 => {
                let axes: Vec<i32> = (0..values.ndim() as i32).collect();
                let ends = [ops::min_axes(values, &axes, false, s)?, ops::max_axes(values, &axes, false, s)?];
                ends.iter().map(|e| Ok(ops::reshape(&ops::astype(e, Dtype::I64, s)?, &[1], s)?)).collect()
            }
            _ => Ok(vec![ops::astype(&self.holds(s)?, Dtype::I64, s)?]),
        }
    }

    /// How many entries [`Self::flag_values`] gives, and the bounds its two entries are
    /// compared with (`None`: one boolean entry).
    pub(crate) fn bounds(&self) -> Option<(i64, i64)> {
        match &self.what {
            Checked::Range { values, lo, hi } if values.size() > 0 => Some((*lo, *hi)),
            _ => None,
        }
    }
}

impl LowerCtx<'_> {
    /// Declares that the node's result is defined only when `cond` (a boolean array) is true
    /// everywhere: a condition on runtime data that the model cannot promise (indices within
    /// range). The engine evaluates it with the outputs, in the same evaluation, and where it
    /// is false the run fails with `reason`, prefixed with the node. The graph built must stay
    /// memory-safe whatever the data (clamp indices before using them, as
    /// [`Self::checked_indices`] does): the condition is read only after the evaluation.
    pub fn check(&mut self, cond: &Array, reason: impl Into<String>) -> Result<()> {
        self.checks.push(Check { what: Checked::All(cond.clone()), reason: reason.into() });
        Ok(())
    }

    /// Declares, as [`Self::check`] does, that every element of the integer array `values`
    /// lies within `lo..=hi`. Prefer it to a hand-built comparison: it is read as two
    /// reductions (see [`Checked::Range`]).
    pub fn check_range(&mut self, values: &Array, lo: i64, hi: i64, reason: impl Into<String>) -> Result<()> {
        let check = Checked::range(values, lo, hi)?;
        self.checks.push(Check { what: check, reason: reason.into() });
        Ok(())
    }

    /// `indices` (any integer type) as int64 positions within `0..dims`, negative indices
    /// counting from the end; `dims` (int64) broadcasts against `indices`. An index outside
    /// `-dim..dim` fails the run with `reason` (see [`Self::check`]); until the check is read
    /// it is wrapped into range, so the gather or scatter that uses it never touches memory
    /// outside its tensor. Every dimension in `dims` must be at least 1: a lowering handles an
    /// empty axis itself (there is nothing to index). With one dimension for every index,
    /// [`Self::checked_index`] builds fewer operations.
    pub fn checked_indices(&mut self, indices: &Array, dims: &Array, reason: &str, s: &Stream) -> Result<Array> {
        use crate::mlx::{Dtype, ops};
        let idx = ops::astype(indices, Dtype::I64, s)?;
        // (At least 1, as the caller promises: a remainder by zero must never run.)
        let dims = ops::maximum(&ops::astype(dims, Dtype::I64, s)?, &Array::from_slice(&[1i64], &[])?, s)?;
        let inside =
            ops::logical_and(&ops::greater_equal(&idx, &ops::negative(&dims, s)?, s)?, &ops::less(&idx, &dims, s)?, s)?;
        self.check(&inside, reason)?;
        // A remainder with the divisor's sign (MLX's, as Python's): -d..d wraps onto 0..d.
        Ok(ops::remainder(&idx, &dims, s)?)
    }

    /// `indices` (any integer type) as positions within `0..dim` (`dim` at least 1), negative
    /// ones counting from the end: [`Self::checked_indices`] with one dimension, as a range
    /// check ([`Self::check_range`]) and [`Self::wrapped`], so no chain of elementwise
    /// operations for MLX to fuse.
    pub fn checked_index(&mut self, indices: &Array, dim: i64, reason: &str, s: &Stream) -> Result<Array> {
        self.check_range(indices, -dim, dim - 1, reason)?;
        self.wrapped(indices, dim, s)
    }

    /// `indices` modulo `dim` (at least 1), with the divisor's sign (MLX's remainder, as
    /// Python's): `-dim..dim` onto `0..dim`, and any other index somewhere inside too. Where
    /// `dim` fits int32 the result is int32, any other integer type narrowed first behind
    /// [`ops::unfused`](crate::mlx::ops::unfused): a value outside int32 wraps modulo 2^32
    /// before the remainder, so the caller checks the range of the values as they are first
    /// (which the run's check then fails). No fused chain: in a fixed-shape graph the divisor
    /// is a constant of the indices' own shape (up to 4096 elements), since a scalar would be
    /// broadcast first and MLX would fuse the pair into a kernel of its own.
    pub fn wrapped(&self, indices: &Array, dim: i64, s: &Stream) -> Result<Array> {
        use crate::mlx::{Dtype, ops};
        if dim < 1 {
            return Err(Error::new(format!("indices into an axis of {dim} entries")));
        }
        let shape = indices.shape();
        let n = if self.shapeless || indices.size() > 4096 { 1 } else { indices.size() };
        let shape = if n == 1 && indices.size() != 1 { Vec::new() } else { shape };
        let (idx, divisor) = if dim <= i64::from(i32::MAX) {
            // Any other integer type narrowed first (its range is checked as it is, before):
            // every gather then indexes with int32, one kernel for CUDA to compile per table
            // type rather than one per index type (an int64 token id and an int32 position).
            let idx = match indices.dtype() {
                Dtype::I32 => indices.clone(),
                _ => ops::unfused(&ops::astype(indices, Dtype::I32, s)?, s)?,
            };
            (idx, Array::from_slice(&vec![dim as i32; n], &shape)?)
        } else {
            (ops::astype(indices, Dtype::I64, s)?, Array::from_slice(&vec![dim; n], &shape)?)
        };
        Ok(ops::remainder(&idx, &divisor, s)?)
    }

    /// Declares that the graph being built is right only when `cond` (a boolean array) is
    /// true everywhere. The engine evaluates the condition with the outputs, in the same
    /// evaluation; where it is false, the run's outputs are discarded and the run is built
    /// again another way (from the decode slot's split graph to its shapeless one, from there
    /// to the exact shape-keyed closure, from a closure to an eager build, which reads the
    /// data as it is).
    pub fn guard(&mut self, cond: &Array) -> Result<()> {
        self.guards.push(Check { what: Checked::All(cond.clone()), reason: String::new() });
        Ok(())
    }

    /// [`Self::guard`] on every element of the integer array `values` lying within
    /// `lo..=hi`, read as two reductions (see [`Checked::Range`]).
    pub fn guard_range(&mut self, values: &Array, lo: i64, hi: i64) -> Result<()> {
        let guard = Checked::range(values, lo, hi)?;
        self.guards.push(Check { what: guard, reason: String::new() });
        Ok(())
    }
}

impl Checked {
    /// A range over `values`, whose type must fit int64 (the minimum and maximum are compared
    /// as int64): the integers but uint64.
    fn range(values: &Array, lo: i64, hi: i64) -> Result<Checked> {
        let dtype = values.dtype();
        if !dtype.is_integer() || dtype == crate::mlx::Dtype::U64 {
            return Err(Error::new(format!("a range check takes integers of up to 63 bits, not {dtype:?}")));
        }
        Ok(Checked::Range { values: values.clone(), lo, hi })
    }
}
