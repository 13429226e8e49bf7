//! The generated decoders written directly against MLX through the project's MLX layer: the
//! same weights (`DecoderWeights`) and the same computation as the ONNX graph, the floor the
//! EP is measured against. Two forms:
//! - [`Mode::Eager`] (the default), mlx-lm's way: each step built and evaluated eagerly, int4
//!   `quantized_matmul`, MLX's fused RMS norm and rotary (the rotary periods are the tables'
//!   own, `10000^(2i/H)`), a KV buffer grown 256 rows at a time and written in place, and
//!   MLX's fused attention over the filled rows (causal for the prompt, no mask for a step).
//! - [`Mode::Compiled`]: the decode step as one shapeless compiled closure over a KV cache
//!   that grows by concatenation, with the tables' rotary and elementwise RMS norm (the form
//!   MLX's CPU backend runs fastest).

use ep_core::mlx::{Array, Closure, Dtype, Stream, ops};
use ep_core::{Error, Result};
use mlx_ep_host::decoder::{DecoderConfig, DecoderWeights, Generation, NORM_EPSILON, QuantizedWeight};
use std::sync::Arc;
use std::time::Instant;

/// RMS norm over the last axis (MLX's fused `rms_norm` measured no faster on the CPU).
fn rms(x: &Array, w: &Array, s: &Stream) -> Result<Array> {
    let xf = ops::astype(x, Dtype::F32, s)?;
    let ms = ops::mean_axes(&ops::square(&xf, s)?, &[-1], true, s)?;
    let inv = ops::rsqrt(&ops::add(&ms, &ops::scalar(NORM_EPSILON as f64, Dtype::F32, s)?, s)?, s)?;
    let y = ops::multiply(&ops::multiply(&xf, &inv, s)?, &ops::astype(w, Dtype::F32, s)?, s)?;
    Ok(ops::astype(&y, x.dtype(), s)?)
}

/// A 4-bit weight in MLX's affine layout.
struct QWeight {
    q: Array,
    scales: Array,
    biases: Array,
    block: i32,
}

/// `values` as an array of the model's float type.
fn floats(values: &[f32], shape: &[i64], dtype: Dtype) -> Result<Array> {
    let a = Array::from_slice(values, shape)?;
    let s = Stream::cpu()?;
    let a = ops::astype(&a, dtype, &s)?;
    a.eval()?;
    Ok(a)
}

impl QWeight {
    fn new(w: &QuantizedWeight, dtype: Dtype) -> Result<QWeight> {
        let blocks = w.k_blocks();
        let words = blocks * w.block / 8;
        let q = Array::from_bytes(&w.packed, &[w.n, words], Dtype::U32)?;
        let scales = floats(&w.scales, &[w.n, blocks], dtype)?;
        let biases: Vec<f32> = w.scales.iter().map(|s| -8.0 * s).collect();
        let biases = floats(&biases, &[w.n, blocks], dtype)?;
        Ok(QWeight { q, scales, biases, block: w.block as i32 })
    }

    fn apply(&self, x: &Array, s: &Stream) -> Result<Array> {
        Ok(ops::quantized_matmul(x, &self.q, &self.scales, &self.biases, true, self.block, 4, s)?)
    }
}

struct Layer {
    input_norm: Array,
    qkv: QWeight,
    o: QWeight,
    post_norm: Array,
    gate: QWeight,
    up: QWeight,
    down: QWeight,
}

struct Model {
    cfg: DecoderConfig,
    embed: Array,
    layers: Vec<Layer>,
    norm: Array,
    lm_head: QWeight,
    cos: Array,
    sin: Array,
    /// The rotary periods `10000^(2i/H)` for MLX's fused rotary (float32).
    periods: Array,
}

impl Model {
    /// Rotary embedding of `x` `[1, heads, S, H]` at positions `offset..offset + S`, from the
    /// same cos/sin tables as the ONNX model. (MLX's fused rope falls back to slices on the CPU,
    /// which a shapeless closure cannot replay; on GPUs the fused kernel would be the choice.)
    fn rotate(&self, x: &Array, offset: &Array, seq: i64, s: &Stream) -> Result<Array> {
        let half = self.cfg.head / 2;
        let steps = ops::arange(0.0, seq as f64, 1.0, Dtype::I32, s)?;
        let pos = ops::add(&steps, offset, s)?;
        let angle =
            |t: &Array| -> Result<Array> { Ok(ops::reshape(&ops::take(t, &pos, 0, s)?, &[1, 1, seq, half], s)?) };
        let (cos, sin) = (angle(&self.cos)?, angle(&self.sin)?);
        let (a, b) = (ops::take_range(x, 0, half, 3, s)?, ops::take_range(x, half, half, 3, s)?);
        let y1 = ops::subtract(&ops::multiply(&a, &cos, s)?, &ops::multiply(&b, &sin, s)?, s)?;
        let y2 = ops::add(&ops::multiply(&b, &cos, s)?, &ops::multiply(&a, &sin, s)?, s)?;
        Ok(ops::concatenate(&[y1, y2], 3, s)?)
    }

    /// One forward pass: `ids` `[1, S]` int32, `offset` `[]` int32 (the position of the first
    /// token), the caches `[1, kv_heads, P, H]` per layer (K then V). Returns the last
    /// position's logits `[1, vocab]` and the grown caches.
    fn forward(&self, args: &[Array], s: &Stream) -> Result<Vec<Array>> {
        let c = &self.cfg;
        let (ids, offset) = (&args[0], &args[1]);
        let seq = ids.shape()[1];
        let (nq, nkv) = (c.heads * c.head, c.kv_heads * c.head);
        let mut x = ops::take(&self.embed, ids, 0, s)?;
        let mut out = vec![];
        let heads = |t: &Array, n: i64| -> Result<Array> {
            let t = ops::reshape(t, &[1, seq, n, c.head], s)?;
            Ok(ops::transpose_axes(&t, &[0, 2, 1, 3], s)?)
        };
        for (i, l) in self.layers.iter().enumerate() {
            let h = rms(&x, &l.input_norm, s)?;
            let qkv = l.qkv.apply(&h, s)?;
            let q = heads(&ops::take_range(&qkv, 0, nq, 2, s)?, c.heads)?;
            let k = heads(&ops::take_range(&qkv, nq, nkv, 2, s)?, c.kv_heads)?;
            let v = heads(&ops::take_range(&qkv, nq + nkv, nkv, 2, s)?, c.kv_heads)?;
            let q = self.rotate(&q, offset, seq, s)?;
            let k = self.rotate(&k, offset, seq, s)?;
            let keys = ops::concatenate(&[args[2 + 2 * i].clone(), k], 2, s)?;
            let values = ops::concatenate(&[args[3 + 2 * i].clone(), v], 2, s)?;
            let scale = 1.0 / (c.head as f32).sqrt();
            // (MLX's CPU attention returns float32 for float16 inputs.)
            let a = ops::scaled_dot_product_attention(&q, &keys, &values, scale, None, seq > 1, s)?;
            let a = ops::astype(&a, q.dtype(), s)?;
            let a = ops::reshape(&ops::transpose_axes(&a, &[0, 2, 1, 3], s)?, &[1, seq, nq], s)?;
            x = ops::add(&x, &l.o.apply(&a, s)?, s)?;
            let h = rms(&x, &l.post_norm, s)?;
            let g = l.gate.apply(&h, s)?;
            let act = ops::multiply(&ops::multiply(&g, &ops::sigmoid(&g, s)?, s)?, &l.up.apply(&h, s)?, s)?;
            x = ops::add(&x, &l.down.apply(&act, s)?, s)?;
            out.push(keys);
            out.push(values);
        }
        let last = ops::take_range(&x, seq - 1, 1, 1, s)?;
        let logits = self.lm_head.apply(&rms(&last, &self.norm, s)?, s)?;
        let mut result = vec![ops::reshape(&logits, &[1, c.vocab], s)?];
        result.extend(out);
        Ok(result)
    }
}

/// Rows the eager form's KV buffers grow by (mlx-lm's step).
const KV_STEP: i64 = 256;

impl Model {
    /// One eager forward pass at positions `pos..pos + S` (`ids` `[1, S]` int32), writing
    /// this step's K/V rows into `caches` (per layer K then V, `[1, kv_heads, capacity, H]`,
    /// grown as needed). Returns the last position's logits `[1, vocab]`.
    fn forward_eager(&self, ids: &Array, pos: i64, caches: &mut [Array], s: &Stream) -> Result<Array> {
        let c = &self.cfg;
        let seq = ids.shape()[1];
        let (nq, nkv) = (c.heads * c.head, c.kv_heads * c.head);
        let end = pos + seq;
        let mut x = ops::take(&self.embed, ids, 0, s)?;
        let eps = NORM_EPSILON;
        let heads = |t: &Array, n: i64| -> Result<Array> {
            if seq == 1 {
                return Ok(ops::reshape(t, &[1, n, 1, c.head], s)?);
            }
            Ok(ops::transpose_axes(&ops::reshape(t, &[1, seq, n, c.head], s)?, &[0, 2, 1, 3], s)?)
        };
        let cut = |t: &Array, a: i64, b: i64| -> Result<Array> { Ok(ops::slice(t, &[0, 0, a], &[1, seq, b], s)?) };
        for (i, l) in self.layers.iter().enumerate() {
            let h = ops::rms_norm(&x, &l.input_norm, eps, s)?;
            let qkv = l.qkv.apply(&h, s)?;
            let q =
                ops::rope(&heads(&cut(&qkv, 0, nq)?, c.heads)?, c.head as i32, false, &self.periods, pos as i32, s)?;
            let k = ops::rope(
                &heads(&cut(&qkv, nq, nq + nkv)?, c.kv_heads)?,
                c.head as i32,
                false,
                &self.periods,
                pos as i32,
                s,
            )?;
            let v = heads(&cut(&qkv, nq + nkv, nq + 2 * nkv)?, c.kv_heads)?;
            let mut filled = Vec::with_capacity(2);
            for (slot, new) in [(2 * i, k), (2 * i + 1, v)] {
                let cap = caches[slot].shape()[2];
                if end > cap {
                    let grow = (end - cap + KV_STEP - 1) / KV_STEP * KV_STEP;
                    let zero = ops::scalar(0.0, new.dtype(), s)?;
                    caches[slot] = ops::pad(&caches[slot], &[0, 0, 0, 0], &[0, 0, grow, 0], &zero, "constant", s)?;
                }
                let (kv, cap) = (c.kv_heads, caches[slot].shape()[2]);
                caches[slot] = ops::slice_update(&caches[slot], &new, &[0, 0, pos, 0], &[1, kv, end, c.head], s)?;
                filled.push(if end == cap {
                    caches[slot].clone()
                } else {
                    ops::slice(&caches[slot], &[0, 0, 0, 0], &[1, kv, end, c.head], s)?
                });
            }
            let scale = 1.0 / (c.head as f32).sqrt();
            let a = ops::scaled_dot_product_attention(&q, &filled[0], &filled[1], scale, None, seq > 1, s)?;
            let a = ops::astype(&a, q.dtype(), s)?;
            let a = if seq == 1 {
                ops::reshape(&a, &[1, 1, nq], s)?
            } else {
                ops::reshape(&ops::transpose_axes(&a, &[0, 2, 1, 3], s)?, &[1, seq, nq], s)?
            };
            x = ops::add(&x, &l.o.apply(&a, s)?, s)?;
            let h = ops::rms_norm(&x, &l.post_norm, eps, s)?;
            let g = l.gate.apply(&h, s)?;
            let act = ops::multiply(&ops::multiply(&g, &ops::sigmoid(&g, s)?, s)?, &l.up.apply(&h, s)?, s)?;
            x = ops::add(&x, &l.down.apply(&act, s)?, s)?;
        }
        let last = if seq == 1 { x } else { ops::slice(&x, &[0, seq - 1, 0], &[1, seq, c.hidden], s)? };
        let logits = self.lm_head.apply(&ops::rms_norm(&last, &self.norm, eps, s)?, s)?;
        Ok(ops::reshape(&logits, &[1, c.vocab], s)?)
    }
}

/// How the native decoder runs (see the module's header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Eager,
    Compiled,
}

impl Mode {
    pub fn parse(v: &str) -> std::result::Result<Mode, String> {
        match v {
            "eager" => Ok(Mode::Eager),
            "compiled" => Ok(Mode::Compiled),
            other => Err(format!("unknown mode '{other}' (eager, compiled)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::Compiled => "compiled",
        }
    }
}

/// Traces of native decode steps (one is expected: the closure is shapeless).
pub static TRACES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The periods of the decoder's rotary tables (theta 10000), as MLX's fused rotary takes them.
fn periods(head: i64) -> Vec<f32> {
    (0..head / 2).map(|i| 10000f64.powf((2 * i) as f64 / head as f64) as f32).collect()
}

/// The native decoder: weights uploaded once, and the decode step of its [`Mode`].
pub struct NativeDecoder {
    model: Arc<Model>,
    decode: Closure,
    stream: Stream,
    mode: Mode,
}

impl NativeDecoder {
    pub fn new(cfg: &DecoderConfig, w: &DecoderWeights, mode: Mode) -> Result<NativeDecoder> {
        let dt = if cfg.float16 { Dtype::F16 } else { Dtype::F32 };
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    input_norm: floats(&l.input_norm, &[cfg.hidden], dt)?,
                    qkv: QWeight::new(&l.qkv, dt)?,
                    o: QWeight::new(&l.o, dt)?,
                    post_norm: floats(&l.post_norm, &[cfg.hidden], dt)?,
                    gate: QWeight::new(&l.gate, dt)?,
                    up: QWeight::new(&l.up, dt)?,
                    down: QWeight::new(&l.down, dt)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let model = Arc::new(Model {
            cfg: cfg.clone(),
            embed: floats(&w.embed, &[cfg.vocab, cfg.hidden], dt)?,
            layers,
            norm: floats(&w.norm, &[cfg.hidden], dt)?,
            lm_head: QWeight::new(&w.lm_head, dt)?,
            cos: floats(&w.cos, &[cfg.max_len, cfg.head / 2], dt)?,
            sin: floats(&w.sin, &[cfg.max_len, cfg.head / 2], dt)?,
            periods: floats(&periods(cfg.head), &[cfg.head / 2], Dtype::F32)?,
        });
        let m = Arc::clone(&model);
        let decode = Closure::new(move |args: &[Array]| {
            TRACES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let s = Stream::default_device()?;
            m.forward(args, &s).map_err(|e| ep_core::mlx::MlxError(e.0))
        })
        .compile(true)?;
        Ok(NativeDecoder { model, decode, stream: Stream::default_device()?, mode })
    }

    /// Greedy generation as [`mlx_ep_host::decoder::generate`] does it: a prefill of `prompt`,
    /// then `steps` one-token steps, the last logits copied to the host each step.
    pub fn generate(&self, prompt: &[i64], steps: usize) -> Result<Generation> {
        let _g = ep_core::mlx::lock();
        if self.mode == Mode::Eager {
            return self.generate_eager(prompt, steps);
        }
        let c = &self.model.cfg;
        let s = &self.stream;
        let dt = if c.float16 { Dtype::F16 } else { Dtype::F32 };
        let mut caches: Vec<Array> =
            (0..2 * c.layers).map(|_| floats(&[], &[1, c.kv_heads, 0, c.head], dt)).collect::<Result<_>>()?;
        let mut out = Generation::default();
        let mut ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        let mut pos = 0i32;
        for step in 0..=steps {
            let started = Instant::now();
            let mut args = vec![Array::from_slice(&ids, &[1, ids.len() as i64])?, Array::from_slice(&[pos], &[])?];
            args.extend(caches.iter().cloned());
            // The prefill runs eagerly (an MLX program would compile it per prompt length).
            let results = if step == 0 { self.model.forward(&args, s)? } else { self.decode.apply(&args)? };
            ep_core::mlx::VectorArray::from_arrays(&results)?.eval()?;
            // Widened on the host, as the EP's caller does with its float16 logits.
            let logits = if c.float16 {
                results[0].to_vec::<half::f16>(s)?.iter().map(|x| x.to_f32()).collect()
            } else {
                results[0].to_vec::<f32>(s)?
            };
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            caches = results[1..].to_vec();
            pos += ids.len() as i32;
            ids = vec![out.record(step, ms, logits, None) as i32];
        }
        if out.tokens.is_empty() {
            return Err(Error::new("no steps ran"));
        }
        Ok(out)
    }

    /// [`Self::generate`] in [`Mode::Eager`]: each step built, evaluated and its logits read.
    fn generate_eager(&self, prompt: &[i64], steps: usize) -> Result<Generation> {
        let c = &self.model.cfg;
        let s = &self.stream;
        let dt = if c.float16 { Dtype::F16 } else { Dtype::F32 };
        let mut caches: Vec<Array> =
            (0..2 * c.layers).map(|_| floats(&[], &[1, c.kv_heads, 0, c.head], dt)).collect::<Result<_>>()?;
        let mut out = Generation::default();
        let mut ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        let mut pos = 0i64;
        for step in 0..=steps {
            let started = Instant::now();
            let logits =
                self.model.forward_eager(&Array::from_slice(&ids, &[1, ids.len() as i64])?, pos, &mut caches, s)?;
            let mut all = vec![logits.clone()];
            all.extend(caches.iter().cloned());
            ep_core::mlx::VectorArray::from_arrays(&all)?.eval()?;
            let logits = if c.float16 {
                logits.to_vec::<half::f16>(s)?.iter().map(|x| x.to_f32()).collect()
            } else {
                logits.to_vec::<f32>(s)?
            };
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            pos += ids.len() as i64;
            ids = vec![out.record(step, ms, logits, None) as i32];
        }
        if out.tokens.is_empty() {
            return Err(Error::new("no steps ran"));
        }
        Ok(out)
    }
}
