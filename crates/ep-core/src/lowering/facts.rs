//! What lowerings share within one build of a partition's graph: values computed once for
//! every node that asks from the same inputs ([`LowerCtx::shared`]), and facts a producer
//! publishes about one of its outputs for the nodes that read it ([`LowerCtx::publish`]): a
//! DequantizeLinear of a constant weight publishes MLX's quantized form of that weight
//! ([`AffineWeight`]), which a MatMul reading the output multiplies by directly, instead of
//! the dequantized float weight (a quarter of the bytes read per run for 8 bits, an eighth for
//! 4). A consumer that finds nothing builds from the input as it is; the producer's own output
//! stays what it always is.

use super::LowerCtx;
use crate::Result;
use crate::graph::NodeInfo;
use crate::mlx::{Array, Stream, ops};

/// Values computed once per build of a partition's graph and reused by every node that asks
/// for them from the same inputs (see [`LowerCtx::shared`]), and the facts producers published.
#[derive(Default)]
pub struct SharedValues(std::cell::RefCell<std::collections::HashMap<String, Vec<Array>>>);

/// A weight `W [K, N]` (the right operand of a matmul) in MLX's affine quantized form, of its
/// transpose: `packed` uint32 `[N, K * bits / 32]` (elements of one row along K, the first in
/// the lowest bits), `scales` and `biases` `[N, K / group]` in the compute type, so that
/// `W[k, n] = scales[n, k / group] * q[n, k] + biases[n, k / group]` (in float32 within a few
/// ulps of the group's largest weight: the product and the bias are each rounded once), and `x @ W` is MLX's `quantized_matmul(x, packed, scales, biases, transpose=true)`.
pub struct AffineWeight {
    pub packed: Array,
    pub scales: Array,
    pub biases: Array,
    pub group: i32,
    pub bits: i32,
    pub k: i64,
    pub n: i64,
}

const AFFINE_WEIGHT: &str = "affine-weight";

/// Rows from which a GPU multiplies a quantized weight densely (see [`AffineWeight::matmul`]):
/// two on CUDA, eight elsewhere (Metal compiles its kernels without NVRTC).
pub fn dense_from_rows() -> i64 {
    if crate::mlx::device::is_cuda() { 2 } else { 8 }
}

impl AffineWeight {
    /// `x @ W` for `x [..., K]` (any float type; computed in the scales' type), `[..., N]` in
    /// x's type. On CUDA only one row runs MLX's quantized kernel (a matrix-vector product,
    /// where reading fewer weight bytes pays; on other GPUs up to seven rows); more rows
    /// dequantize the weight once per run and multiply densely on the matrix units: MLX's CUDA
    /// kernels for several rows are compiled on first use, and some of them (`qmm_sm90_*` for
    /// groups of 128 on an H100) did not compile at all with the MLX CUDA 0.32.2 wheel's
    /// headers (`crt/mma.h` missing).
    pub fn matmul(&self, x: &Array, s: &Stream) -> Result<Array> {
        let shape = x.shape();
        let compute = self.scales.dtype();
        let rows: i64 = shape[..shape.len().saturating_sub(1)].iter().product();
        let mut out_shape = shape[..shape.len().saturating_sub(1)].to_vec();
        out_shape.push(self.n);
        if rows == 0 {
            return Ok(ops::full(&out_shape, &ops::scalar(0.0, x.dtype(), s)?, x.dtype(), s)?);
        }
        let a = ops::astype(x, compute, s)?;
        let a = if shape.len() < 2 { ops::reshape(&a, &[rows, self.k], s)? } else { a };
        let y = if crate::mlx::gpu_forms() && rows >= dense_from_rows() {
            let dense = ops::dequantize(&self.packed, &self.scales, &self.biases, self.group, self.bits, compute, s)?;
            ops::matmul(&a, &ops::transpose(&dense, s)?, s)?
        } else {
            ops::quantized_matmul(&a, &self.packed, &self.scales, &self.biases, true, self.group, self.bits, s)?
        };
        let y = if shape.len() < 2 { ops::reshape(&y, &out_shape, s)? } else { y };
        Ok(if y.dtype() == x.dtype() { y } else { ops::astype(&y, x.dtype(), s)? })
    }

    fn to_arrays(&self) -> Result<Vec<Array>> {
        let meta = Array::from_slice(&[i64::from(self.group), i64::from(self.bits), self.k, self.n], &[4])?;
        Ok(vec![self.packed.clone(), self.scales.clone(), self.biases.clone(), meta])
    }

    fn from_arrays(arrays: &[Array]) -> Option<AffineWeight> {
        let [packed, scales, biases, meta] = arrays else { return None };
        let meta = meta.host_bytes()?;
        let v: Vec<i64> = meta.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default())).collect();
        let [group, bits, k, n] = v[..] else { return None };
        Some(AffineWeight {
            packed: packed.clone(),
            scales: scales.clone(),
            biases: biases.clone(),
            group: i32::try_from(group).ok()?,
            bits: i32::try_from(bits).ok()?,
            k,
            n,
        })
    }
}

impl<'a> LowerCtx<'a> {
    /// Arrays that depend only on the inputs `of` (and on what `tag` names), built once per
    /// build of the partition's graph: every node whose inputs `of` are the same values of the
    /// partition gets the first one's arrays (the rotary angles and the attention mask each
    /// layer of a decoder computes from the same lengths). `build` runs with this node's
    /// context, so its checks and guards are this node's. Outside a plan it just builds.
    pub fn shared(
        &mut self,
        of: &[usize],
        tag: &str,
        build: impl FnOnce(&mut LowerCtx<'a>) -> Result<Vec<Array>>,
    ) -> Result<Vec<Array>> {
        let Some(memo) = self.memo else { return build(self) };
        let mut key = String::from(tag);
        for &i in of {
            // (An optional input past the node's last one is absent.)
            key.push('|');
            key.push_str(self.sources.get(i).map_or("absent", String::as_str));
        }
        if let Some(found) = memo.0.borrow().get(&key) {
            return Ok(found.clone());
        }
        let built = build(self)?;
        memo.0.borrow_mut().insert(key, built.clone());
        Ok(built)
    }

    /// Tells the nodes built after this one that its output `output` (`transposed`: the
    /// output's transpose) is also what `weight` holds (see [`AffineWeight`]). Kept for this
    /// build of the partition's graph only; outside a plan nothing is kept.
    pub fn publish(&self, output: usize, transposed: bool, weight: &AffineWeight) -> Result<()> {
        if let (Some(memo), Some(key)) = (self.memo, self.output_keys.get(output)) {
            memo.0.borrow_mut().insert(format!("{AFFINE_WEIGHT}|{transposed}|{key}"), weight.to_arrays()?);
        }
        Ok(())
    }

    /// Whether a node of the partition reads output `output` as its input `input` and is a
    /// `op` (qualified: `com.microsoft:X` outside the ONNX domain). Outside a plan, false.
    pub fn output_read_as(&self, output: usize, op: &str, input: usize) -> bool {
        self.output_readers(output).iter().any(|(n, i)| n.qualified_op() == op && *i == input)
    }

    /// The nodes of the partition that read output `output`, each with the input it reads it
    /// as (their attributes tell how: a Gemm's transB, say). Outside a plan, none.
    pub fn output_readers(&self, output: usize) -> &[(&'a NodeInfo, usize)] {
        self.output_readers.get(output).map_or(&[], Vec::as_slice)
    }

    /// What the producer of input `input` published about it (`transposed`: about its
    /// transpose), if anything.
    pub fn affine_weight(&self, input: usize, transposed: bool) -> Option<AffineWeight> {
        let (memo, key) = (self.memo?, self.sources.get(input)?);
        let found = memo.0.borrow().get(&format!("{AFFINE_WEIGHT}|{transposed}|{key}")).cloned()?;
        AffineWeight::from_arrays(&found)
    }
}
