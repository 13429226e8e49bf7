//! Criterion micro benchmarks: one quantized matmul and one attention decode step, on ORT's
//! CPU EP and on the MLX EP, in the same run (compare the two, never absolute times across
//! machines). Needs `ORT_MLX_EP_LIB` and `ORT_DYLIB_PATH` (`cargo xtask bench` sets both).

use criterion::{Criterion, criterion_group, criterion_main};
use mlx_ep_host::decoder::{self, DecoderConfig};
use mlx_ep_host::ort::session::Session;
use mlx_ep_host::ort::value::{DynValue, Tensor};
use mlx_ep_host::{Ep, session_builder, values};
use std::collections::HashMap;

fn session(model: mlx_ep_host::ort::editor::Model, ep: Ep) -> Session {
    model.into_session(&session_builder(ep).expect("session builder")).expect("session")
}

fn bench_pair(
    c: &mut Criterion,
    name: &str,
    build: &dyn Fn() -> mlx_ep_host::ort::editor::Model,
    inputs: &dyn Fn(&Session) -> Vec<(String, DynValue)>,
) {
    let mut group = c.benchmark_group(name);
    for ep in [Ep::Cpu, Ep::Mlx] {
        let mut s = session(build(), ep);
        let feed = inputs(&s);
        values::run(&mut s, &feed).expect("a first run");
        group.bench_function(ep.label(), |b| b.iter(|| values::run(&mut s, &feed).expect("run")));
    }
    group.finish();
}

fn micro(c: &mut Criterion) {
    let (k, n) = (1024, 1024);
    bench_pair(c, "matmul_nbits_1x1024x1024", &|| decoder::matmul_nbits_model(k, n, 3).expect("model"), &|s| {
        values::random_inputs(s, &HashMap::new(), 5).expect("inputs")
    });
    let cfg = DecoderConfig::small();
    let past = 256;
    bench_pair(c, "gqa_decode_step_past256", &|| decoder::gqa_step_model(&cfg, past).expect("model"), &|s| {
        let mut feed = values::random_inputs(s, &HashMap::new(), 7).expect("inputs");
        for (name, v) in feed.iter_mut() {
            match name.as_str() {
                "seqlens_k" => *v = Tensor::from_array((vec![1i64], vec![past as i32])).expect("tensor").into_dyn(),
                "total_sequence_length" => {
                    *v = Tensor::from_array((Vec::<i64>::new(), vec![past as i32 + 1])).expect("tensor").into_dyn()
                }
                _ => {}
            }
        }
        feed
    });
}

criterion_group!(benches, micro);
criterion_main!(benches);
