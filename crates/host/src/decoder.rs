//! Decoder-only LLMs shaped like onnxruntime-genai's model builder output, built in memory
//! (random weights, properly int4-quantized), and greedy generation over ORT sessions.
//!
//! The graph, per layer: `SimplifiedLayerNormalization` (the first) or
//! `com.microsoft:SkipSimplifiedLayerNormalization` (residual add + norm), a packed-QKV
//! `MatMulNBits`, `GroupQueryAttention` with rotary from `cos_cache`/`sin_cache`, the output
//! projection, and a SwiGLU MLP of three `MatMulNBits`; a final norm and the LM head. Inputs
//! `input_ids [batch, seq]`, `attention_mask [batch, total]`, `past_key_values.{i}.key/value
//! [batch, kv_heads, past, head]`; outputs `logits [batch, seq, vocab]` and
//! `present.{i}.key/value`. `seqlens_k` and `total_sequence_length` come from the attention
//! mask as genai computes them (ReduceSum - 1, and Shape -> Gather).
//!
//! Weights are 4-bit, symmetric (no zero points: the default 8 applies), block size 32,
//! `accuracy_level` 0: ORT's CPU EP computes them exactly in float32, a reference to hold the
//! MLX EP to.

use crate::Result;
use ort::editor::{Graph, Model, Node, ONNX_DOMAIN, Opset};
use ort::memory::Allocator;
use ort::operator::Attribute;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, Outlet, Shape, SymbolicDimensions, Tensor, TensorElementType, ValueType};
use std::time::Instant;

pub use crate::llm::{LlmReport, compare, compare_with, logit_bound, print, to_json};

const MS: &str = "com.microsoft";

/// The sizes of a generated decoder.
#[derive(Debug, Clone)]
pub struct DecoderConfig {
    pub name: &'static str,
    pub layers: usize,
    pub hidden: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head: i64,
    pub intermediate: i64,
    pub vocab: i64,
    /// Rows of the rotary caches: the longest sequence the model takes.
    pub max_len: i64,
    pub block_size: i64,
    /// float16 activations, caches and float weights (float32 otherwise).
    pub float16: bool,
}

impl DecoderConfig {
    /// Two layers of width 64: seconds to build and run anywhere.
    pub fn tiny() -> DecoderConfig {
        DecoderConfig {
            name: "tiny",
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            head: 16,
            intermediate: 128,
            vocab: 512,
            max_len: 256,
            block_size: 32,
            float16: false,
        }
    }

    /// Four layers of width 256 (Qwen-like head layout, 8 query / 2 KV heads of 32).
    pub fn small() -> DecoderConfig {
        DecoderConfig {
            name: "small",
            layers: 4,
            hidden: 256,
            heads: 8,
            kv_heads: 2,
            head: 32,
            intermediate: 768,
            vocab: 2048,
            max_len: 512,
            block_size: 32,
            float16: false,
        }
    }

    /// Qwen2.5-0.5B's shape (24 layers, width 896, 14/2 heads of 64, MLP 4864, vocabulary
    /// 151936), with 4-bit weights. Large: for GPU benchmarks.
    pub fn qwen05b() -> DecoderConfig {
        DecoderConfig {
            name: "qwen2.5-0.5b",
            layers: 24,
            hidden: 896,
            heads: 14,
            kv_heads: 2,
            head: 64,
            intermediate: 4864,
            vocab: 151936,
            max_len: 2048,
            block_size: 32,
            float16: false,
        }
    }

    /// A preset by name; a `-fp16` suffix asks for float16 activations.
    pub fn preset(name: &str) -> Result<DecoderConfig> {
        if let Some(base) = name.strip_suffix("-fp16") {
            return Ok(DecoderConfig { float16: true, ..Self::preset(base)? });
        }
        match name {
            "tiny" => Ok(Self::tiny()),
            "small" => Ok(Self::small()),
            "qwen2.5-0.5b" | "qwen" => Ok(Self::qwen05b()),
            other => Err(format!("unknown decoder preset '{other}' (tiny, small, qwen2.5-0.5b; -fp16 suffix)").into()),
        }
    }
}

/// The element type of the decoder's activations and caches.
pub fn float_type(cfg: &DecoderConfig) -> TensorElementType {
    if cfg.float16 { TensorElementType::Float16 } else { TensorElementType::Float32 }
}

/// The last position's logits of a `[1, S, vocab]` output, as float32.
fn last_logits(v: &DynValue, seq: usize) -> Result<Vec<f32>> {
    let last = |shape: &[i64]| {
        let vocab = shape[2] as usize;
        (seq - 1) * vocab..seq * vocab
    };
    if let Ok((shape, l)) = v.try_extract_tensor::<f32>() {
        return Ok(l[last(shape)].to_vec());
    }
    let (shape, l) = v.try_extract_tensor::<half::f16>()?;
    Ok(l[last(shape)].iter().map(|x| x.to_f32()).collect())
}

/// A symbolic-dimension tensor type: `-1` entries take the names in `symbols` by position.
fn io(ty: TensorElementType, shape: &[i64], symbols: &[&str]) -> ValueType {
    ValueType::Tensor {
        ty,
        shape: Shape::new(shape.iter().copied()),
        dimension_symbols: SymbolicDimensions::new(symbols.iter().map(|s| s.to_string())),
    }
}

fn initializer<T: ort::value::PrimitiveTensorElementType + std::fmt::Debug + Clone + 'static>(
    graph: &mut Graph,
    name: &str,
    shape: &[i64],
    values: &[T],
) -> Result<()> {
    let mut t = Tensor::<T>::new(&Allocator::default(), shape.to_vec())?;
    let (_, data) = t.extract_tensor_mut();
    data.clone_from_slice(values);
    graph.add_initializer(name, t, false)?;
    Ok(())
}

/// A `[n, k]` weight quantized to 4 bits in blocks along k, as MatMulNBits takes it: packed
/// uint8 `[n, k_blocks, block / 2]` (even elements in the low nibble) and float32 scales
/// `[n, k_blocks]`, symmetric (zero point 8).
#[derive(Debug, Clone)]
pub struct QuantizedWeight {
    pub n: i64,
    pub k: i64,
    pub block: i64,
    pub packed: Vec<u8>,
    pub scales: Vec<f32>,
}

impl QuantizedWeight {
    /// Random 4-bit values with scales that keep unit-variance inputs at unit variance.
    fn random(n: i64, k: i64, block: i64, rng: &mut fastrand::Rng) -> QuantizedWeight {
        let blocks = (k + block - 1) / block;
        let mut packed = vec![0u8; (n * blocks * block / 2) as usize];
        let mut scales = Vec::with_capacity((n * blocks) as usize);
        // (q - 8) has a standard deviation of about 4.6.
        let base = 1.0 / (4.6 * (k as f32).sqrt());
        for row in 0..n {
            for b in 0..blocks {
                let sign = if rng.bool() { 1.0 } else { -1.0 };
                scales.push(sign * base * (0.5 + rng.f32()));
                for j in 0..block {
                    let q = if b * block + j < k { rng.u8(0..16) } else { 0 };
                    let at = ((row * blocks + b) * block + j) as usize;
                    packed[at / 2] |= q << (4 * (at % 2));
                }
            }
        }
        QuantizedWeight { n, k, block, packed, scales }
    }

    pub fn k_blocks(&self) -> i64 {
        (self.k + self.block - 1) / self.block
    }
}

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    pub qkv: QuantizedWeight,
    pub o: QuantizedWeight,
    pub post_norm: Vec<f32>,
    pub gate: QuantizedWeight,
    pub up: QuantizedWeight,
    pub down: QuantizedWeight,
}

/// Every weight of a generated decoder, so the ONNX model and a native-MLX version of the
/// same decoder (the benchmark's floor) compute the same function.
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    /// `[vocab, hidden]`.
    pub embed: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    pub lm_head: QuantizedWeight,
    /// Rotary caches `[max_len, head / 2]` (theta 10000).
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

/// RMS-norm epsilon of every norm in the decoder.
pub const NORM_EPSILON: f32 = 1e-6;

impl DecoderWeights {
    pub fn generate(cfg: &DecoderConfig, seed: u64) -> DecoderWeights {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (d, h, block) = (cfg.hidden, cfg.head, cfg.block_size);
        let norm = |rng: &mut fastrand::Rng| -> Vec<f32> { (0..d).map(|_| 0.8 + 0.4 * rng.f32()).collect() };
        let embed = (0..cfg.vocab * d).map(|_| rng.f32() * 2.0 - 1.0).collect();
        let layers = (0..cfg.layers)
            .map(|_| LayerWeights {
                input_norm: norm(&mut rng),
                qkv: QuantizedWeight::random((cfg.heads + 2 * cfg.kv_heads) * h, d, block, &mut rng),
                o: QuantizedWeight::random(d, cfg.heads * h, block, &mut rng),
                post_norm: norm(&mut rng),
                gate: QuantizedWeight::random(cfg.intermediate, d, block, &mut rng),
                up: QuantizedWeight::random(cfg.intermediate, d, block, &mut rng),
                down: QuantizedWeight::random(d, cfg.intermediate, block, &mut rng),
            })
            .collect();
        let final_norm = norm(&mut rng);
        let lm_head = QuantizedWeight::random(cfg.vocab, d, block, &mut rng);
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for pos in 0..cfg.max_len {
            for i in 0..h / 2 {
                let angle = pos as f64 * 10000f64.powf(-(2 * i) as f64 / h as f64);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        DecoderWeights { embed, layers, norm: final_norm, lm_head, cos, sin }
    }
}

struct Builder {
    graph: Graph,
    nodes: Vec<Node>,
    float16: bool,
}

impl Builder {
    /// A float initializer in the model's float type.
    fn floats(&mut self, name: &str, shape: &[i64], values: &[f32]) -> Result<()> {
        if self.float16 {
            let h: Vec<half::f16> = values.iter().map(|&v| half::f16::from_f32(v)).collect();
            initializer(&mut self.graph, name, shape, &h)
        } else {
            initializer(&mut self.graph, name, shape, values)
        }
    }

    fn node(
        &mut self,
        domain: &str,
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<Attribute>,
    ) -> Result<()> {
        self.nodes.push(Node::new(op, domain, name, inputs, outputs, attrs)?);
        Ok(())
    }

    fn matmul(&mut self, name: &str, input: &str, output: &str, w: &QuantizedWeight) -> Result<()> {
        let (wq, ws) = (format!("{name}.weight_Q4"), format!("{name}.weight_scales"));
        let blocks = w.k_blocks();
        initializer(&mut self.graph, &wq, &[w.n, blocks, w.block / 2], &w.packed)?;
        self.floats(&ws, &[w.n, blocks], &w.scales)?;
        let attrs = vec![
            Attribute::new("K", w.k)?,
            Attribute::new("N", w.n)?,
            Attribute::new("bits", 4i64)?,
            Attribute::new("block_size", w.block)?,
            Attribute::new("accuracy_level", 0i64)?,
        ];
        self.node(MS, "MatMulNBits", name, &[input, &wq, &ws], &[output], attrs)
    }

    fn norm_weight(&mut self, name: &str, w: &[f32]) -> Result<String> {
        self.floats(name, &[w.len() as i64], w)?;
        Ok(name.to_owned())
    }
}

/// The decoder as an in-memory model. The same `seed` gives the same weights.
pub fn build(cfg: &DecoderConfig, seed: u64) -> Result<Model> {
    build_from(cfg, &DecoderWeights::generate(cfg, seed))
}

/// The decoder with the given weights.
pub fn build_from(cfg: &DecoderConfig, w: &DecoderWeights) -> Result<Model> {
    let f32t = float_type(cfg);
    let i64t = TensorElementType::Int64;
    let (d, kvh, h) = (cfg.hidden, cfg.kv_heads, cfg.head);
    let mut b = Builder { graph: Graph::new()?, nodes: Vec::new(), float16: cfg.float16 };
    let mut inputs = vec![
        Outlet::new("input_ids", io(i64t, &[-1, -1], &["batch", "sequence"])),
        Outlet::new("attention_mask", io(i64t, &[-1, -1], &["batch", "total_sequence"])),
    ];
    let mut outputs = vec![Outlet::new("logits", io(f32t, &[-1, -1, cfg.vocab], &["batch", "sequence", ""]))];
    let kv_type = |sym: &str| io(f32t, &[-1, kvh, -1, h], &["batch", "", sym, ""]);
    for i in 0..cfg.layers {
        for kv in ["key", "value"] {
            inputs.push(Outlet::new(format!("past_key_values.{i}.{kv}"), kv_type("past_sequence")));
            outputs.push(Outlet::new(format!("present.{i}.{kv}"), kv_type("total_sequence")));
        }
    }
    b.graph.set_inputs(inputs)?;
    b.graph.set_outputs(outputs)?;

    // Embedding (float32), rotary caches, the mask reformatting of genai.
    b.floats("model.embed_tokens.weight", &[cfg.vocab, d], &w.embed)?;
    b.floats("cos_cache", &[cfg.max_len, h / 2], &w.cos)?;
    b.floats("sin_cache", &[cfg.max_len, h / 2], &w.sin)?;
    initializer(&mut b.graph, "one", &[], &[1i64])?;
    initializer(&mut b.graph, "axis_1", &[1], &[1i64])?;
    b.node(ONNX_DOMAIN, "Gather", "embed", &["model.embed_tokens.weight", "input_ids"], &["x0"], vec![])?;
    let keep0 = vec![Attribute::new("keepdims", 0i64)?];
    b.node(ONNX_DOMAIN, "ReduceSum", "mask_sum", &["attention_mask", "axis_1"], &["mask_len"], keep0)?;
    b.node(ONNX_DOMAIN, "Sub", "mask_last", &["mask_len", "one"], &["seqlens_i64"], vec![])?;
    let to_i32 = || -> Result<Vec<Attribute>> { Ok(vec![Attribute::new("to", 6i64)?]) };
    b.node(ONNX_DOMAIN, "Cast", "seqlens_k", &["seqlens_i64"], &["seqlens_k"], to_i32()?)?;
    b.node(ONNX_DOMAIN, "Shape", "mask_shape", &["attention_mask"], &["mask_shape"], vec![])?;
    b.node(ONNX_DOMAIN, "Gather", "mask_total", &["mask_shape", "one"], &["total_i64"], vec![])?;
    b.node(ONNX_DOMAIN, "Cast", "total_seq_len", &["total_i64"], &["total_seq_len"], to_i32()?)?;

    let eps = || -> Result<Vec<Attribute>> { Ok(vec![Attribute::new("epsilon", NORM_EPSILON)?]) };
    let mut residual = "x0".to_owned();
    let mut pending: Option<String> = None; // the output to add to the residual
    for (i, lw) in w.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let ln1 = b.norm_weight(&format!("{p}.input_layernorm.weight"), &lw.input_norm)?;
        let normed = format!("{p}.attn_in");
        match pending.take() {
            None => b.node(
                ONNX_DOMAIN,
                "SimplifiedLayerNormalization",
                &format!("{p}.input_layernorm"),
                &[&residual, &ln1],
                &[&normed],
                eps()?,
            )?,
            Some(add) => {
                let sum = format!("{p}.residual_in");
                b.node(
                    MS,
                    "SkipSimplifiedLayerNormalization",
                    &format!("{p}.input_layernorm"),
                    &[&add, &residual, &ln1],
                    &[&normed, "", "", &sum],
                    eps()?,
                )?;
                residual = sum;
            }
        }
        b.matmul(&format!("{p}.attn.qkv_proj.MatMul"), &normed, &format!("{p}.qkv"), &lw.qkv)?;
        let attrs = vec![
            Attribute::new("num_heads", cfg.heads)?,
            Attribute::new("kv_num_heads", kvh)?,
            Attribute::new("scale", 1.0 / (h as f32).sqrt())?,
            Attribute::new("do_rotary", 1i64)?,
            Attribute::new("rotary_interleaved", 0i64)?,
            Attribute::new("local_window_size", -1i64)?,
        ];
        let (pk, pv) = (format!("past_key_values.{i}.key"), format!("past_key_values.{i}.value"));
        let (ck, cv) = (format!("present.{i}.key"), format!("present.{i}.value"));
        let attn = format!("{p}.attn_out");
        b.node(
            MS,
            "GroupQueryAttention",
            &format!("{p}.attn.GroupQueryAttention"),
            &[&format!("{p}.qkv"), "", "", &pk, &pv, "seqlens_k", "total_seq_len", "cos_cache", "sin_cache"],
            &[&attn, &ck, &cv],
            attrs,
        )?;
        let o = format!("{p}.o_out");
        b.matmul(&format!("{p}.attn.o_proj.MatMul"), &attn, &o, &lw.o)?;
        let ln2 = b.norm_weight(&format!("{p}.post_attention_layernorm.weight"), &lw.post_norm)?;
        let (mlp_in, sum) = (format!("{p}.mlp_in"), format!("{p}.residual_mid"));
        b.node(
            MS,
            "SkipSimplifiedLayerNormalization",
            &format!("{p}.post_attention_layernorm"),
            &[&o, &residual, &ln2],
            &[&mlp_in, "", "", &sum],
            eps()?,
        )?;
        residual = sum;
        let (gate, up) = (format!("{p}.gate"), format!("{p}.up"));
        b.matmul(&format!("{p}.mlp.gate_proj.MatMul"), &mlp_in, &gate, &lw.gate)?;
        b.matmul(&format!("{p}.mlp.up_proj.MatMul"), &mlp_in, &up, &lw.up)?;
        let (sig, silu, act) = (format!("{p}.gate_sigmoid"), format!("{p}.gate_silu"), format!("{p}.act"));
        b.node(ONNX_DOMAIN, "Sigmoid", &format!("{p}.mlp.act_fn.Sigmoid"), &[&gate], &[&sig], vec![])?;
        b.node(ONNX_DOMAIN, "Mul", &format!("{p}.mlp.act_fn.Mul"), &[&gate, &sig], &[&silu], vec![])?;
        b.node(ONNX_DOMAIN, "Mul", &format!("{p}.mlp.Mul"), &[&silu, &up], &[&act], vec![])?;
        let down = format!("{p}.down");
        b.matmul(&format!("{p}.mlp.down_proj.MatMul"), &act, &down, &lw.down)?;
        pending = Some(down);
    }
    let lnf = b.norm_weight("model.norm.weight", &w.norm)?;
    let add = pending.unwrap_or_default();
    b.node(MS, "SkipSimplifiedLayerNormalization", "model.norm", &[&add, &residual, &lnf], &["final"], eps()?)?;
    b.matmul("lm_head.MatMul", "final", "logits", &w.lm_head)?;

    let Builder { mut graph, nodes, .. } = b;
    for n in nodes {
        graph.add_node(n)?;
    }
    let mut model = Model::new([Opset::new(ONNX_DOMAIN, 21)?, Opset::new(MS, 1)?])?;
    model.set_graph(graph)?;
    Ok(model)
}

/// A greedy generation: the tokens chosen and timings.
#[derive(Debug, Clone, Default)]
pub struct Generation {
    /// The prompt's next token, then one per decode step.
    pub tokens: Vec<i64>,
    /// The last position's logits of each step (prefill first).
    pub logits: Vec<Vec<f32>>,
    pub prefill_ms: f64,
    /// Wall time of each decode step.
    pub step_ms: Vec<f64>,
    /// The session's first generation (graph building and kernel compilation included):
    /// its prefill and its whole time. The other figures are from the generations after it
    /// (tokens and logits from the second; times as [`crate::llm::compare_with`] reports them).
    pub cold_prefill_ms: f64,
    pub cold_total_ms: f64,
}

impl Generation {
    /// Records a step (the prefill is step 0): its time, its last logits and greedy token;
    /// returns the token to feed next (`forced[step]` under teacher forcing).
    pub fn record(&mut self, step: usize, ms: f64, last: Vec<f32>, forced: Option<&[i64]>) -> i64 {
        // Progress on long runs (a cold GPU compiles kernels for minutes): MLX_EP_RUN_PROGRESS=1.
        if std::env::var_os("MLX_EP_RUN_PROGRESS").is_some() {
            eprintln!("  step {step}: {ms:.1} ms");
        }
        if step == 0 {
            self.prefill_ms = ms;
        } else {
            self.step_ms.push(ms);
        }
        let next = argmax(&last);
        self.tokens.push(next);
        self.logits.push(last);
        forced.and_then(|f| f.get(step).copied()).unwrap_or(next)
    }

    /// Decode tokens per second (median step).
    pub fn decode_tokens_per_s(&self) -> f64 {
        let mut v = self.step_ms.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() { 0.0 } else { 1000.0 / v[v.len() / 2] }
    }

    pub fn median_step_ms(&self) -> f64 {
        let mut v = self.step_ms.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
}

/// A deterministic prompt of `len` tokens.
pub fn prompt(cfg: &DecoderConfig, len: usize) -> Vec<i64> {
    (0..len as i64).map(|i| (i * 7919 + 13) % cfg.vocab).collect()
}

fn argmax(v: &[f32]) -> i64 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as i64
}

fn i64_tensor(shape: &[i64], data: Vec<i64>) -> Result<DynValue> {
    Ok(Tensor::from_array((shape.to_vec(), data))?.into_dyn())
}

/// Greedy generation with a growing KV cache (present of one step is the next step's past):
/// a prefill of `prompt`, then `steps` one-token decode steps.
///
/// With `forced`, step `i` feeds `forced[i]` instead of its own greedy token (teacher forcing:
/// two EPs fed the same tokens see the same contexts, so their logits compare step by step).
pub fn generate(
    session: &mut Session,
    cfg: &DecoderConfig,
    prompt: &[i64],
    steps: usize,
    forced: Option<&[i64]>,
) -> Result<Generation> {
    let mut past: Vec<(String, DynValue)> = Vec::new();
    for i in 0..cfg.layers {
        for kv in ["key", "value"] {
            let empty = crate::values::tensor_from_f64(float_type(cfg), &[1, cfg.kv_heads, 0, cfg.head], &[])?;
            past.push((format!("past_key_values.{i}.{kv}"), empty));
        }
    }
    let mut out = Generation::default();
    let mut ids = prompt.to_vec();
    let mut total = 0usize;
    for step in 0..=steps {
        let seq = ids.len();
        total += seq;
        let mut feed: Vec<(String, SessionInputValue<'_>)> = vec![
            ("input_ids".into(), i64_tensor(&[1, seq as i64], ids.clone())?.into()),
            ("attention_mask".into(), i64_tensor(&[1, total as i64], vec![1; total])?.into()),
        ];
        for (name, v) in &past {
            feed.push((name.clone(), SessionInputValue::from(v.view())));
        }
        let started = Instant::now();
        let mut outputs = session.run(feed)?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let last = last_logits(&outputs["logits"], seq)?;
        let mut next_past = Vec::with_capacity(past.len());
        for (name, _) in &past {
            let present = name.replace("past_key_values", "present");
            let v = outputs.remove(&present).ok_or_else(|| format!("the model has no output '{present}'"))?;
            next_past.push((name.clone(), v));
        }
        drop(outputs);
        past = next_past;
        ids = vec![out.record(step, ms, last, forced)];
    }
    Ok(out)
}

/// Greedy generation with one max-length KV buffer per cache, bound through ORT's IOBinding
/// as both `past_key_values.*` and `present.*` (as onnxruntime-genai binds a shared buffer):
/// `[1, kv_heads, max_len, head]`, zero at the start, written in place by the model.
/// With `device`, the buffers live in that EP device's memory (a step moves token, mask, logits).
pub fn generate_shared(
    session: &mut Session,
    cfg: &DecoderConfig,
    prompt: &[i64],
    steps: usize,
    max_len: i64,
    forced: Option<&[i64]>,
    device: Option<&ort::device::Device<'_>>,
) -> Result<Generation> {
    if prompt.len() + steps > max_len as usize {
        return Err(format!("{} prompt tokens + {steps} steps exceed the buffer of {max_len}", prompt.len()).into());
    }
    let mut caches = Vec::new();
    for i in 0..cfg.layers {
        for kv in ["key", "value"] {
            let shape = [1, cfg.kv_heads, max_len, cfg.head];
            let zeros = || vec![0.0; shape.iter().product::<i64>() as usize];
            let t = match device {
                Some(d) => crate::ort_raw::device_tensor(crate::environment()?, d, float_type(cfg), &shape)?,
                None => crate::values::ort_tensor_from_f64(float_type(cfg), &shape, &zeros())?,
            };
            caches.push((format!("past_key_values.{i}.{kv}"), format!("present.{i}.{kv}"), t));
        }
    }
    let mut binding = session.create_binding()?;
    for (past, present, t) in caches.iter_mut() {
        binding.bind_input(past.as_str(), &*t)?;
        binding.bind_output(present.as_str(), &mut *t)?;
    }
    let mut out = Generation::default();
    let mut ids = prompt.to_vec();
    let mut total = 0usize;
    for step in 0..=steps {
        let seq = ids.len();
        total += seq;
        // ORT copies a bound host input to device memory at bind time: bind it again.
        for (past, _, t) in caches.iter().filter(|_| device.is_none() && step > 0) {
            binding.bind_input(past.as_str(), t)?;
        }
        binding.bind_input("input_ids", &i64_tensor(&[1, seq as i64], ids.clone())?)?;
        binding.bind_input("attention_mask", &i64_tensor(&[1, total as i64], vec![1; total])?)?;
        // Rebound each step: the logits' shape changes from the prefill to the decode steps.
        binding.bind_output_to_device("logits", Allocator::default().memory_info())?;
        let started = Instant::now();
        let outputs = session.run_binding(&binding)?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let last = last_logits(&outputs["logits"], seq)?;
        drop(outputs);
        ids = vec![out.record(step, ms, last, forced)];
    }
    Ok(out)
}

/// How a generation binds its KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvStyle {
    /// Each step's present is the next step's past (new tensors every step).
    Growing,
    /// One max-length buffer per cache, bound as past and present through IOBinding.
    Shared,
    /// As `Shared`, with the buffers in the MLX EP's memory (its device memory on a GPU).
    Device,
}

/// One MatMulNBits node (`x [1, K] -> [1, N]`, 4-bit, block 32) with random weights: the
/// quantized-matmul micro benchmark.
pub fn matmul_nbits_model(k: i64, n: i64, seed: u64) -> Result<Model> {
    let mut b = Builder { graph: Graph::new()?, nodes: Vec::new(), float16: false };
    let f32t = TensorElementType::Float32;
    b.graph.set_inputs([Outlet::new("x", io(f32t, &[1, k], &["", ""]))])?;
    b.graph.set_outputs([Outlet::new("y", io(f32t, &[1, n], &["", ""]))])?;
    let w = QuantizedWeight::random(n, k, 32, &mut fastrand::Rng::with_seed(seed));
    b.matmul("matmul", "x", "y", &w)?;
    finish(b)
}

/// One GroupQueryAttention decode step (packed QKV of one token, a past of `past` rows,
/// rotary): the attention micro benchmark. Inputs `qkv`, `past_key`, `past_value`,
/// `seqlens_k`, `total_sequence_length`.
pub fn gqa_step_model(cfg: &DecoderConfig, past: i64) -> Result<Model> {
    let mut b = Builder { graph: Graph::new()?, nodes: Vec::new(), float16: false };
    let (f32t, i32t) = (TensorElementType::Float32, TensorElementType::Int32);
    let (kvh, h) = (cfg.kv_heads, cfg.head);
    let width = (cfg.heads + 2 * kvh) * h;
    b.graph.set_inputs([
        Outlet::new("qkv", io(f32t, &[1, 1, width], &["", "", ""])),
        Outlet::new("past_key", io(f32t, &[1, kvh, past, h], &["", "", "", ""])),
        Outlet::new("past_value", io(f32t, &[1, kvh, past, h], &["", "", "", ""])),
        Outlet::new("seqlens_k", io(i32t, &[1], &[""])),
        Outlet::new("total_sequence_length", io(i32t, &[], &[])),
    ])?;
    b.graph.set_outputs([
        Outlet::new("y", io(f32t, &[1, 1, cfg.heads * h], &["", "", ""])),
        Outlet::new("present_key", io(f32t, &[1, kvh, past + 1, h], &["", "", "", ""])),
        Outlet::new("present_value", io(f32t, &[1, kvh, past + 1, h], &["", "", "", ""])),
    ])?;
    let w = DecoderWeights::generate(&DecoderConfig { layers: 0, vocab: 1, ..cfg.clone() }, 1);
    initializer(&mut b.graph, "cos_cache", &[cfg.max_len, h / 2], &w.cos)?;
    initializer(&mut b.graph, "sin_cache", &[cfg.max_len, h / 2], &w.sin)?;
    let attrs = vec![
        Attribute::new("num_heads", cfg.heads)?,
        Attribute::new("kv_num_heads", kvh)?,
        Attribute::new("do_rotary", 1i64)?,
    ];
    b.node(
        MS,
        "GroupQueryAttention",
        "attention",
        &["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"],
        &["y", "present_key", "present_value"],
        attrs,
    )?;
    finish(b)
}

fn finish(b: Builder) -> Result<Model> {
    let Builder { mut graph, nodes, .. } = b;
    for n in nodes {
        graph.add_node(n)?;
    }
    let mut model = Model::new([Opset::new(ONNX_DOMAIN, 21)?, Opset::new(MS, 1)?])?;
    model.set_graph(graph)?;
    Ok(model)
}
