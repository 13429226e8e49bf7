//! In-place outputs: a partition output that is one of its runtime inputs with only some rows
//! changed (a KV cache append), resolved to the byte ranges copy-out writes into ORT's buffer.

use crate::mlx::{Array, Stream};
use crate::{Error, Result};

/// A [`WriteBack`] still to be resolved: rows to write into a runtime input's buffer at
/// positions known only after the evaluation.
pub(super) struct PendingRows {
    pub(super) input: usize,
    pub(super) rows: Array,
    pub(super) starts: Array,
    pub(super) axis: usize,
    pub(super) output: String,
}

impl PendingRows {
    /// The write-back, once `rows` and `starts` are evaluated, into an input of `shape`.
    pub(super) fn resolve(&self, shape: &[i64]) -> Result<WriteBack> {
        let starts = self.starts.to_vec::<i32>(&Stream::cpu()?)?;
        self.resolve_in(shape, &starts, &self.rows, 0)
    }

    /// As [`Self::resolve`], with the starts already read and the rows' bytes at `offset` in
    /// `bytes` (rows of several updates packed into one array: reading an array on the host
    /// costs a transfer each on CUDA, so a run reads one).
    pub(super) fn resolve_in(&self, shape: &[i64], starts: &[i32], bytes: &Array, offset: usize) -> Result<WriteBack> {
        let rows = self.rows.shape();
        let itemsize = self.rows.dtype().size_in_bytes();
        let (axis, n) = (self.axis, rows[self.axis] as usize);
        let len = shape[axis] as usize;
        let per_batch: usize = shape[1..axis].iter().map(|&d| d as usize).product();
        let inner: usize = shape[axis + 1..].iter().map(|&d| d as usize).product::<usize>() * itemsize;
        let mut chunks = Vec::with_capacity(starts.len() * per_batch);
        for (b, &start) in starts.iter().enumerate() {
            if start < 0 || start as usize + n > len {
                return Err(Error::new(format!(
                    "rows {start}..{} of batch {b} exceed length {len}",
                    start as usize + n
                )));
            }
            for o in 0..per_batch {
                let slab = b * per_batch + o;
                let from = offset + slab * n * inner;
                chunks.push((from..from + n * inner, (slab * len + start as usize) * inner));
            }
        }
        let end = chunks.iter().map(|(r, _)| r.end).max().unwrap_or(offset);
        if end > offset + self.rows.size() * itemsize || end > bytes.size() * bytes.dtype().size_in_bytes() {
            return Err(Error::new(format!("rows {rows:?} do not fit the {} packed bytes", bytes.size())));
        }
        Ok(WriteBack { input: self.input, array: bytes.clone(), chunks, output: self.output.clone() })
    }
}

/// Partition output `output` is runtime input `input` with only some rows changed: when ORT
/// gives that output the input's own buffer, copying each chunk (a byte range of `array`, to a
/// byte offset of the buffer) produces it.
pub struct WriteBack {
    pub input: usize,
    pub array: Array,
    pub chunks: Vec<(std::ops::Range<usize>, usize)>,
    pub output: String,
}

/// Byte ranges, in a row-major tensor of `shape`, of the rows `patches` names along `axis`:
/// each patch is (index over the dimensions before `axis`, flattened; range of rows).
pub fn row_byte_ranges(
    shape: &[i64],
    itemsize: usize,
    axis: usize,
    patches: &[(usize, std::ops::Range<usize>)],
) -> Result<Vec<std::ops::Range<usize>>> {
    if axis >= shape.len() {
        return Err(Error::new(format!("axis {axis} is out of range for shape {shape:?}")));
    }
    let dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    let outer_count: usize = dims[..axis].iter().product();
    let axis_len = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product::<usize>() * itemsize;
    let mut ranges = Vec::with_capacity(patches.len());
    for (outer, rows) in patches {
        if *outer >= outer_count || rows.start > rows.end || rows.end > axis_len {
            return Err(Error::new(format!(
                "rows {rows:?} of slice {outer} are outside shape {shape:?} (axis {axis})"
            )));
        }
        let start = (outer * axis_len + rows.start) * inner;
        ranges.push(start..start + rows.len() * inner);
    }
    Ok(ranges)
}
