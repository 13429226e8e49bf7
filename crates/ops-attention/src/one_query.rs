//! One query token's attention over keys some of which are masked out, as one CUDA kernel of
//! the EP's own: a decode step over a static KV buffer. MLX's fused one-query kernel takes no
//! mask, so [`crate::key_mask`] carries it in the head dimension (three concatenations before
//! the kernel and a copy after it, per layer); on MLX's CUDA backend this kernel reads the
//! mask itself, in one launch. `ONNXRUNTIME_EP_MLX_ATTENTION_KERNEL=0` goes back to MLX's
//! kernel; `gpu/run.sh attention` checks both against the CPU EP and times them (on an H100:
//! five GroupQueryAttention models within tolerance, the decoders' tokens the CPU EP's, decode
//! about 0.92x the time of MLX's kernel with the mask in the head dimension).
//!
//! One block per (query head, batch entry): its warps take every `W`-th key, each lane holding
//! `D / 32` of the head's values; a warp keeps a running maximum, sum and weighted values
//! (online softmax) in float32, and the block merges its warps' at the end. The scores are
//! `(q * scale) . k` in float32, as MLX's fused kernel computes them; a masked key is skipped
//! (weight exactly 0), a query that sees no key gets zeros. Fixed shapes only: a shapeless
//! replay asks every primitive for its output shapes, which a custom kernel cannot give.

use ep_core::Result;
use ep_core::mlx::kernel::{CudaKernel, Launch, TemplateArg};
use ep_core::mlx::{Array, Dtype, Stream, device, ops};
use std::sync::OnceLock;

/// Warps per block.
const WARPS: i32 = 4;

/// The body MLX wraps in `__global__ void ...(q, k, v, k_new, v_new, at, allowed, scale, out)`:
/// key row `at[b]` of entry `b` is read from `k_new`/`v_new` (`[B, kv_heads, 1, H]`) instead
/// (`-1`: none); `T`, `D` and `W` are the launch's constants. (A changed body needs a new name:
/// MLX caches modules by it.)
const NAME: &str = "mlx_ep_one_query_attention_v4";
const BODY: &str = r#"
  constexpr int PER = D / 32;
  const float ninf = -__int_as_float(0x7f800000);
  const int h = blockIdx.x;
  const int b = blockIdx.y;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int heads = q_shape[1];
  const int kv_heads = k_shape[1];
  const int keys = k_shape[2];
  const int kh = h / (heads / kv_heads);
  const float sc = scale[0];
  const T* qp = q + b * q_strides[0] + h * q_strides[1];
  const T* kp = k + b * k_strides[0] + kh * k_strides[1];
  const T* vp = v + b * v_strides[0] + kh * v_strides[1];
  const T* knp = k_new + b * k_new_strides[0] + kh * k_new_strides[1];
  const T* vnp = v_new + b * v_new_strides[0] + kh * v_new_strides[1];
  const int row = at[b * at_strides[0]];
  const bool* ap = allowed + b * allowed_strides[0];
  float qv[PER];
  float acc[PER];
  for (int i = 0; i < PER; ++i) {
    qv[i] = static_cast<float>(qp[(lane * PER + i) * q_strides[3]]) * sc;
    acc[i] = 0.0f;
  }
  float m = ninf;
  float l = 0.0f;
  for (int j = warp; j < keys; j += W) {
    if (!ap[j * allowed_strides[3]]) {
      continue;
    }
    const bool fresh = j == row;
    const T* kr = fresh ? knp : kp + j * k_strides[2];
    const int64_t ks = fresh ? k_new_strides[3] : k_strides[3];
    float d = 0.0f;
    for (int i = 0; i < PER; ++i) {
      d += qv[i] * static_cast<float>(kr[(lane * PER + i) * ks]);
    }
    for (int o = 16; o > 0; o /= 2) {
      d += __shfl_xor_sync(0xffffffff, d, o);
    }
    // (A score of -inf weighs 0, as a masked key does; before any finite score the running
    // maximum is -inf, and so is `mn`.)
    const float mn = fmaxf(m, d);
    const float c = m == ninf ? 0.0f : expf(m - mn);
    const float p = d == ninf ? 0.0f : expf(d - mn);
    l = l * c + p;
    const T* vr = fresh ? vnp : vp + j * v_strides[2];
    const int64_t vs = fresh ? v_new_strides[3] : v_strides[3];
    for (int i = 0; i < PER; ++i) {
      acc[i] = acc[i] * c + p * static_cast<float>(vr[(lane * PER + i) * vs]);
    }
    m = mn;
  }
  __shared__ float ms[W];
  __shared__ float ls[W];
  __shared__ float os[W][D];
  if (lane == 0) {
    ms[warp] = m;
    ls[warp] = l;
  }
  for (int i = 0; i < PER; ++i) {
    os[warp][lane * PER + i] = acc[i];
  }
  __syncthreads();
  if (warp == 0) {
    float top = ninf;
    for (int w = 0; w < W; ++w) {
      top = fmaxf(top, ms[w]);
    }
    float total = 0.0f;
    float o[PER];
    for (int i = 0; i < PER; ++i) {
      o[i] = 0.0f;
    }
    for (int w = 0; w < W; ++w) {
      const float f = ms[w] == ninf ? 0.0f : expf(ms[w] - top);
      total += ls[w] * f;
      for (int i = 0; i < PER; ++i) {
        o[i] += os[w][lane * PER + i] * f;
      }
    }
    T* op = out + (b * heads + h) * D;
    for (int i = 0; i < PER; ++i) {
      op[lane * PER + i] = static_cast<T>(total > 0.0f ? o[i] / total : 0.0f);
    }
  }
"#;

/// Whether this kernel serves here: on MLX's CUDA backend, unless the setting
/// (`ONNXRUNTIME_EP_MLX_ATTENTION_KERNEL`, on by default) turns it off.
pub(crate) fn serves() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    device::is_cuda() && *ON.get_or_init(|| ep_core::options::ATTENTION_KERNEL.env_on())
}

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: OnceLock<std::result::Result<CudaKernel, String>> = OnceLock::new();
    KERNEL
        .get_or_init(|| {
            let inputs = ["q", "k", "v", "k_new", "v_new", "at", "allowed", "scale"];
            CudaKernel::new(NAME, &inputs, &["out"], BODY, false).map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| ep_core::Error::new(format!("the one-query attention kernel: {e}")))
}

/// The keys and values of one query token's attention: whole, or a static buffer whose row
/// `at[b]` (`[B]` int32, within the buffer) is replaced by a new one (`[B, kv_heads, 1, H]`),
/// as a decode step's present is, without building that present.
pub(crate) enum Keys<'a> {
    Whole(&'a Array, &'a Array),
    Replaced { past: (&'a Array, &'a Array), new: (&'a Array, &'a Array), at: &'a Array },
}

/// `softmax(q k^T * scale, keys where allowed) v` for one query token: `q` `[B, heads, 1, H]`,
/// keys and values `[B, kv_heads, L, H]`, `allowed` `[B, 1, 1, L]` booleans (any strides).
/// `None` where the kernel has no form: a head size not a multiple of 32 or over 256, a type
/// other than float32/float16/bfloat16, heads not a multiple of the key heads.
pub(crate) fn attend(q: &Array, keys: Keys<'_>, allowed: &Array, scale: f32, s: &Stream) -> Result<Option<Array>> {
    let batch = q.shape().first().copied().unwrap_or(0);
    let none;
    let (k, v, k_new, v_new, at) = match keys {
        Keys::Whole(k, v) => {
            // (No row replaced: `at` is -1, `k_new`/`v_new` are never read.)
            none = Array::from_slice(&vec![-1i32; batch.max(0) as usize], &[batch.max(0)])?;
            (k, v, k, v, &none)
        }
        Keys::Replaced { past, new, at } => (past.0, past.1, new.0, new.1, at),
    };
    let replaced = !std::ptr::eq(k, k_new);
    let (qs, ks) = (q.shape(), k.shape());
    let dtype = q.dtype();
    let fits = qs.len() == 4
        && ks.len() == 4
        && qs.iter().chain(&ks).all(|&d| d > 0)
        && v.shape() == ks
        && qs[2] == 1
        && qs[0] == ks[0]
        && qs[3] == ks[3]
        && ks[1] > 0
        && qs[1] % ks[1] == 0
        && qs[3] % 32 == 0
        && qs[3] <= 256
        && allowed.shape() == [qs[0], 1, 1, ks[2]]
        && matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16)
        && [k, v, k_new, v_new].iter().all(|a| a.dtype() == dtype)
        && (!replaced || k_new.shape() == [ks[0], ks[1], 1, ks[3]] && v_new.shape() == k_new.shape())
        && at.shape() == [qs[0]]
        && at.dtype() == Dtype::I32;
    if !fits {
        return Ok(None);
    }
    let allowed = ops::astype(allowed, Dtype::Bool, s)?;
    let scale = Array::from_slice(&[scale], &[1])?;
    let block = 32 * WARPS;
    let shape = [qs[0], qs[1], 1, qs[3]];
    let launch = Launch {
        outputs: &[(&shape, dtype)],
        grid: [qs[1] as i32 * block, qs[0] as i32, 1],
        block: [block, 1, 1],
        constants: &[
            ("T", TemplateArg::Dtype(dtype)),
            ("D", TemplateArg::Int(qs[3] as i32)),
            ("W", TemplateArg::Int(WARPS)),
        ],
    };
    let mut out = kernel()?.apply(&[q, k, v, k_new, v_new, at, &allowed, &scale], &launch, s)?;
    Ok(Some(out.remove(0)))
}
