//! The generated genai-style decoder (int4 MatMulNBits, GroupQueryAttention with rotary,
//! simplified layer norms) runs whole on the MLX EP, and greedy generation matches ORT's CPU
//! EP token for token with logits within 1e-3.
//!
//! Needs `ORT_MLX_EP_LIB` and `ORT_DYLIB_PATH` (`cargo xtask test` provides both).

use mlx_ep_host::decoder::{self, DecoderConfig};

#[test]
fn the_tiny_decoder_generates_the_cpu_eps_tokens_on_mlx() {
    let cfg = DecoderConfig::tiny();
    let report = decoder::compare(&cfg, 12, 16).expect("generation runs on both EPs");
    assert_eq!(report.nodes_on_mlx, report.nodes_total, "every node of the decoder runs on the MLX EP");
    assert!(report.nodes_total > 20, "the decoder has {} nodes", report.nodes_total);
    assert_eq!(report.cpu.tokens.len(), 17, "prefill + 16 decode steps");
    assert!(report.all_tokens_agree(), "tokens: CPU {:?}, MLX {:?}", report.cpu.tokens, report.mlx.tokens);
    assert!(report.max_logit_diff < 1e-3, "largest logit difference {}", report.max_logit_diff);
    // Random weights soon repeat one token; the logits must still change with the growing
    // context for the comparison to cover attention over the cache.
    let l = &report.cpu.logits;
    let moved = l.windows(2).filter(|w| w[0].iter().zip(&w[1]).any(|(a, b)| (a - b).abs() > 1e-3)).count();
    assert_eq!(moved, l.len() - 1, "every step's logits differ from the previous step's");
}
