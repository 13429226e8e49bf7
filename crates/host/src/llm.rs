//! The decoder comparison: the same greedy generation on ORT's CPU EP and on the MLX EP, the
//! MLX EP teacher-forced with the CPU EP's tokens, reported side by side.

use crate::Result;
use crate::decoder::{DecoderConfig, Generation, KvStyle, build, generate, generate_shared, prompt};

/// A generation on the CPU EP and on the MLX EP, side by side.
pub struct LlmReport {
    pub kv: KvStyle,
    pub float16: bool,
    pub preset: String,
    pub prompt_len: usize,
    pub cpu: Generation,
    pub mlx: Generation,
    /// Steps whose greedy token is the same on both EPs (the MLX EP is fed the CPU EP's
    /// tokens).
    pub agreeing_tokens: usize,
    /// The largest difference between the EPs' logits over all steps.
    pub max_logit_diff: f64,
    pub nodes_on_mlx: usize,
    pub nodes_total: usize,
    /// Steady generations timed after the first (the figures are medians over them).
    pub repeat: usize,
}

/// The largest logit difference accepted against ORT's CPU EP: float32 matches to 1e-3;
/// float16 (where ORT's CPU kernels round differently) to 2e-2.
pub fn logit_bound(float16: bool) -> f64 {
    if float16 { 2e-2 } else { 1e-3 }
}

impl LlmReport {
    pub fn all_tokens_agree(&self) -> bool {
        self.agreeing_tokens == self.cpu.tokens.len()
    }

    /// Within the documented bounds: every greedy token agrees in float32 (in float16 a
    /// near-tie may flip one in 32), and logits within [`logit_bound`].
    pub fn within_bounds(&self) -> bool {
        let n = self.cpu.tokens.len();
        let tokens_ok = if self.float16 { self.agreeing_tokens + n / 32 >= n } else { self.all_tokens_agree() };
        tokens_ok && self.max_logit_diff < logit_bound(self.float16)
    }
}

/// Builds the decoder of `cfg`, runs the same greedy generation on both EPs and compares.
pub fn compare(cfg: &DecoderConfig, prompt_len: usize, steps: usize) -> Result<LlmReport> {
    compare_with(cfg, prompt_len, steps, KvStyle::Growing, 1)
}

/// [`compare`] with a choice of KV binding and of the number of steady generations timed
/// after the first (`repeat`, at least 1): the prefill reported is their median, the decode
/// step the median over all their steps (one prefill is one sample: on a shared GPU machine
/// single prefills of the same build spread by 1.5x).
pub fn compare_with(
    cfg: &DecoderConfig,
    prompt_len: usize,
    steps: usize,
    kv: KvStyle,
    repeat: usize,
) -> Result<LlmReport> {
    let prompt = prompt(cfg, prompt_len);
    let max_len = (prompt_len + steps).next_power_of_two().max(64) as i64;
    let run = |ep: crate::Ep, forced: Option<&[i64]>| -> Result<(Generation, Vec<crate::Assignment>)> {
        let builder = crate::session_builder(ep)?;
        let mut session = build(cfg, 1)?.into_session(&builder)?;
        let assignment = crate::assignment(&session)?;
        let once = |session: &mut ort::session::Session| -> Result<Generation> {
            match kv {
                KvStyle::Growing => generate(session, cfg, &prompt, steps, forced),
                KvStyle::Shared => generate_shared(session, cfg, &prompt, steps, max_len, forced, None),
                KvStyle::Device => {
                    let env = crate::environment()?;
                    let device =
                        env.devices().find(|d| ep == crate::Ep::Mlx && d.ep().is_ok_and(|n| n == crate::MLX_EP));
                    generate_shared(session, cfg, &prompt, steps, max_len, forced, device.as_ref())
                }
            }
        };
        // The first generation carries the one-time work (graph building, kernel
        // compilation); the second is the steady state.
        let cold = once(&mut session)?;
        let mut g = once(&mut session)?;
        let mut prefills = vec![g.prefill_ms];
        for k in 1..repeat {
            let again = once(&mut session)?;
            // The same inputs: the same greedy tokens, or the EP is not deterministic.
            if again.tokens != g.tokens {
                return Err(format!(
                    "{ep:?}: generation {} of the same prompt chose other tokens than generation 2 ({:?} against {:?})",
                    k + 2,
                    again.tokens,
                    g.tokens
                )
                .into());
            }
            prefills.push(again.prefill_ms);
            g.step_ms.extend(again.step_ms);
        }
        prefills.sort_by(f64::total_cmp);
        g.prefill_ms = prefills[prefills.len() / 2];
        g.cold_prefill_ms = cold.prefill_ms;
        g.cold_total_ms = cold.prefill_ms + cold.step_ms.iter().sum::<f64>();
        Ok((g, assignment))
    };
    // The MLX EP is fed the CPU EP's tokens: every step compares logits of the same context,
    // and where every step's greedy token agrees, free-running generation agrees too.
    let (cpu, _) = run(crate::Ep::Cpu, None)?;
    let (mlx, assignment) = run(crate::Ep::Mlx, Some(&cpu.tokens))?;
    let nodes_total: usize = assignment.iter().map(|a| a.nodes.len()).sum();
    let nodes_on_mlx: usize = assignment.iter().filter(|a| a.ep == crate::MLX_EP).map(|a| a.nodes.len()).sum();
    let agreeing_tokens = cpu.tokens.iter().zip(&mlx.tokens).filter(|(a, b)| a == b).count();
    let mut max_logit_diff = 0f64;
    for (a, b) in cpu.logits.iter().zip(&mlx.logits) {
        for (x, y) in a.iter().zip(b) {
            max_logit_diff = max_logit_diff.max((*x as f64 - *y as f64).abs());
        }
    }
    Ok(LlmReport {
        kv,
        float16: cfg.float16,
        preset: cfg.name.to_owned(),
        prompt_len,
        cpu,
        mlx,
        agreeing_tokens,
        max_logit_diff,
        nodes_on_mlx,
        nodes_total,
        repeat,
    })
}

/// Prints the report as the demo shows it.
pub fn print(r: &LlmReport) {
    println!(
        "decoder '{}' ({}, {} KV cache): prompt {} tokens, {} greedy decode steps; {}/{} nodes on {}",
        r.preset,
        if r.float16 { "float16" } else { "float32" },
        match r.kv {
            KvStyle::Growing => "growing",
            KvStyle::Shared => "shared-buffer",
            KvStyle::Device => "shared buffer in the EP's memory",
        },
        r.prompt_len,
        r.cpu.tokens.len().saturating_sub(1),
        r.nodes_on_mlx,
        r.nodes_total,
        crate::MLX_EP
    );
    for (label, g) in [(crate::CPU_EP, &r.cpu), (crate::MLX_EP, &r.mlx)] {
        println!(
            "  {label:<24} prefill {:>8.2} ms   decode {:>8.3} ms/token ({:>7.1} tokens/s)",
            g.prefill_ms,
            g.median_step_ms(),
            g.decode_tokens_per_s()
        );
        println!("  {:<24} first generation {:>8.1} ms (prefill {:.1} ms)", "", g.cold_total_ms, g.cold_prefill_ms);
    }
    println!(
        "  greedy tokens agree: {}/{}; largest logit difference {:.2e}",
        r.agreeing_tokens,
        r.cpu.tokens.len(),
        r.max_logit_diff
    );
    if r.repeat > 1 {
        println!("  (prefill and decode: medians over {} generations after the first)", r.repeat);
    }
}

/// The report as JSON.
pub fn to_json(r: &LlmReport) -> serde_json::Value {
    let side = |g: &Generation| {
        serde_json::json!({
            "prefill_ms": g.prefill_ms, "decode_ms_per_token": g.median_step_ms(), "tokens": g.tokens,
            "cold_prefill_ms": g.cold_prefill_ms, "cold_total_ms": g.cold_total_ms,
        })
    };
    serde_json::json!({
        "preset": r.preset, "prompt_len": r.prompt_len, "kv": format!("{:?}", r.kv), "float16": r.float16,
        "nodes_on_mlx": r.nodes_on_mlx, "nodes_total": r.nodes_total,
        "agreeing_tokens": r.agreeing_tokens, "steps": r.cpu.tokens.len(),
        "max_logit_diff": r.max_logit_diff, "repeat": r.repeat,
        "cpu": side(&r.cpu),
        "mlx": side(&r.mlx),
    })
}
