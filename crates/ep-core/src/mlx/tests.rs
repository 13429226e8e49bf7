//! Facts about MLX 0.32.2 the layer relies on, pinned by tests: round trips, errors as results,
//! compiled and shapeless replays.

use super::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn cpu() -> Stream {
    Stream::cpu().unwrap()
}

#[test]
fn arrays_round_trip_host_data() {
    let _g = lock();
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    assert_eq!(a.shape(), vec![2, 3]);
    assert_eq!(a.dtype(), Dtype::F32);
    assert_eq!(a.to_vec::<f32>(&cpu()).unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let t = ops::transpose(&a, &cpu()).unwrap();
    // Copy-out makes the transposed view row-major.
    assert_eq!(t.to_vec::<f32>(&cpu()).unwrap(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
}

#[test]
fn empty_and_scalar_arrays() {
    let _g = lock();
    let e = Array::from_slice::<f32>(&[], &[0, 4]).unwrap();
    assert_eq!(e.size(), 0);
    assert!(e.to_vec::<f32>(&cpu()).unwrap().is_empty());
    let s = Array::from_slice(&[7i64], &[]).unwrap();
    assert_eq!(s.ndim(), 0);
    assert_eq!(s.to_vec::<i64>(&cpu()).unwrap(), vec![7]);
}

#[test]
fn a_buffer_that_does_not_match_its_shape_is_an_error() {
    let err = Array::from_bytes(&[0u8; 12], &[2, 2], Dtype::F32).unwrap_err();
    assert!(err.0.contains("does not match"), "{err}");
    assert!(Array::from_bytes(&[], &[-1], Dtype::F32).is_err());
}

#[test]
fn an_mlx_error_is_a_result_not_an_exit() {
    let _g = lock();
    let a = Array::from_slice(&[1.0f32; 6], &[2, 3]).unwrap();
    let b = Array::from_slice(&[1.0f32; 8], &[4, 2]).unwrap();
    let err = ops::matmul(&a, &b, &cpu()).unwrap_err();
    assert!(!err.0.is_empty());
    assert!(err.to_string().starts_with("MLX error:"), "{err}");
    // The process is still alive and MLX still works afterwards.
    let ok = ops::add(&a, &a, &cpu()).unwrap();
    assert_eq!(ok.to_vec::<f32>(&cpu()).unwrap(), vec![2.0; 6]);
}

#[test]
fn dropping_arrays_releases_their_memory() {
    let _g = lock();
    let s = cpu();
    // Warm up allocator bookkeeping, then measure a steady state.
    drop(ops::add(&Array::scalar_f32(1.0), &Array::scalar_f32(1.0), &s).unwrap().to_vec::<f32>(&s).unwrap());
    let before = active_memory().unwrap();
    for _ in 0..20 {
        let a = Array::from_slice(&vec![1.0f32; 1 << 16], &[1 << 16]).unwrap();
        let b = ops::exp(&a, &s).unwrap();
        let c = b.clone();
        c.eval().unwrap();
        assert!(active_memory().unwrap() >= before + (1 << 18), "the evaluated array holds memory");
    }
    assert_eq!(active_memory().unwrap(), before, "arrays leaked");
}

#[test]
fn vectors_evaluate_together() {
    let _g = lock();
    let s = cpu();
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let outs = [ops::add(&a, &a, &s).unwrap(), ops::multiply(&a, &a, &s).unwrap()];
    let v = VectorArray::from_arrays(outs.iter()).unwrap();
    assert_eq!(v.len(), 2);
    v.eval().unwrap();
    assert_eq!(v.get(1).unwrap().to_vec::<f32>(&s).unwrap(), vec![1.0, 4.0]);
    assert!(v.get(5).is_err());
}

#[test]
fn closures_apply_and_free_their_state() {
    let _g = lock();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let closure = Closure::new(move |args: &[Array]| {
        seen.fetch_add(1, Ordering::SeqCst);
        let s = Stream::cpu()?;
        Ok(vec![ops::multiply(&args[0], &args[0], &s)?])
    });
    let x = Array::from_slice(&[3.0f32], &[1]).unwrap();
    let out = closure.apply(&[x]).unwrap();
    assert_eq!(out[0].to_vec::<f32>(&cpu()).unwrap(), vec![9.0]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(Arc::strong_count(&calls), 2);
    drop(closure);
    assert_eq!(Arc::strong_count(&calls), 1, "the closure's state was not freed");
}

#[test]
fn a_failing_closure_returns_its_error() {
    let _g = lock();
    let closure = Closure::new(|_: &[Array]| Err(MlxError("deliberate failure".into())));
    let err = closure.apply(&[]).unwrap_err();
    assert!(err.0.contains("deliberate failure"), "{err}");
}

#[test]
fn a_panicking_closure_is_contained() {
    let _g = lock();
    let closure = Closure::new(|_: &[Array]| panic!("boom"));
    assert!(closure.apply(&[]).is_err());
}

#[test]
fn the_version_is_the_pinned_one() {
    assert_eq!(version().unwrap(), "0.32.2");
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}

#[test]
fn quantized_matmul_matches_the_dequantized_product() {
    let _g = lock();
    let s = cpu();
    let w: Vec<f32> = (0..4 * 64).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
    let x: Vec<f32> = (0..2 * 64).map(|i| ((i * 13 % 17) as f32 - 8.0) / 8.0).collect();
    let w = Array::from_slice(&w, &[4, 64]).unwrap();
    let x = Array::from_slice(&x, &[2, 64]).unwrap();
    let (q, scales, biases) = ops::quantize(&w, 32, 4, &s).unwrap();
    assert_eq!(q.dtype(), Dtype::U32);
    assert_eq!(scales.shape(), vec![4, 2]);
    let deq = ops::dequantize(&q, &scales, &biases, 32, 4, Dtype::F32, &s).unwrap();
    let reference = ops::matmul(&x, &ops::transpose(&deq, &s).unwrap(), &s).unwrap();
    let fused = ops::quantized_matmul(&x, &q, &scales, &biases, true, 32, 4, &s).unwrap();
    close(&fused.to_vec::<f32>(&s).unwrap(), &reference.to_vec::<f32>(&s).unwrap(), 1e-5);
}

#[test]
fn gather_mm_multiplies_each_row_by_the_matrix_it_picks() {
    let _g = lock();
    let s = cpu();
    // Three 2x2 matrices; two one-row inputs, each times the matrix its index picks.
    let b: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let b = Array::from_slice(&b, &[3, 2, 2]).unwrap();
    let a = Array::from_slice(&[1.0f32, 2.0, -1.0, 1.0], &[2, 1, 2]).unwrap();
    let pick = Array::from_slice(&[2u32, 0], &[2]).unwrap();
    let got = ops::gather_mm(&a, &b, None, Some(&pick), &s).unwrap();
    assert_eq!(got.shape(), vec![2, 1, 2]);
    // [1, 2] @ [[8, 9], [10, 11]] and [-1, 1] @ [[0, 1], [2, 3]].
    assert_eq!(got.to_vec::<f32>(&s).unwrap(), vec![28.0, 31.0, 2.0, 2.0]);
}

#[test]
fn fused_rope_attention_and_rms_norm_match_their_definitions() {
    let _g = lock();
    let s = cpu();
    // Rope of [1, 1, 3, 4] with offset 2, half-split pairs, inverse frequencies [1, 0.5].
    let xv: Vec<f32> = (0..12).map(|i| i as f32 / 6.0 - 1.0).collect();
    let x = Array::from_slice(&xv, &[1, 1, 3, 4]).unwrap();
    let freqs = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let got = ops::rope(&x, 4, false, &freqs, 2, &s).unwrap().to_vec::<f32>(&s).unwrap();
    let mut want = vec![0f32; 12];
    for p in 0..3 {
        for j in 0..2 {
            // MLX's `freqs` are periods: the angle is position / freq.
            let theta = (p + 2) as f32 / [1.0f32, 2.0][j];
            let (a, b) = (xv[p * 4 + j], xv[p * 4 + j + 2]);
            want[p * 4 + j] = a * theta.cos() - b * theta.sin();
            want[p * 4 + j + 2] = a * theta.sin() + b * theta.cos();
        }
    }
    close(&got, &want, 1e-5);
    // Attention of one query over two keys.
    let q = Array::from_slice(&[1.0f32, 0.0], &[1, 1, 1, 2]).unwrap();
    let k = Array::from_slice(&[1.0f32, 0.0, 0.0, 1.0], &[1, 1, 2, 2]).unwrap();
    let v = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2]).unwrap();
    let y = ops::scaled_dot_product_attention(&q, &k, &v, 1.0, None, false, &s).unwrap();
    let p0 = 1.0f32.exp() / (1.0f32.exp() + 1.0);
    close(&y.to_vec::<f32>(&s).unwrap(), &[p0 + 3.0 * (1.0 - p0), 2.0 * p0 + 4.0 * (1.0 - p0)], 1e-5);
    // RMS norm of [3, 4] with weight [1, 2].
    let r = ops::rms_norm(
        &Array::from_slice(&[3.0f32, 4.0], &[1, 2]).unwrap(),
        &Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap(),
        0.0,
        &s,
    )
    .unwrap();
    let rms = 12.5f32.sqrt();
    close(&r.to_vec::<f32>(&s).unwrap(), &[3.0 / rms, 8.0 / rms], 1e-5);
}

/// What the decode slot relies on (MLX 0.32.2): a shapeless closure replayed on a new shape
/// recomputes each primitive's output shape and refuses primitives that cannot (a reshape to
/// a baked shape; a cumulative sum, already on its first run); constants built from the traced shape (an arange) are
/// baked in and NOT refused, so lowerings must not build them on dims that change.
#[test]
fn shapeless_replays_refuse_baked_reshapes_but_keep_baked_constants() {
    let _g = lock();
    let s = cpu();
    let replay = |build: fn(&Array, &Stream) -> Result<Array>| {
        let closure = Closure::new(move |args: &[Array]| Ok(vec![build(&args[0], &Stream::cpu()?)?]));
        let compiled = closure.compile(true).unwrap();
        compiled.apply(&[Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap()])?;
        compiled.apply(&[Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[6]).unwrap()])
    };
    let err = replay(|x, s| ops::reshape(x, &[2, x.shape()[0] / 2], s)).unwrap_err();
    assert!(err.0.contains("reshape"), "{err}");
    assert!(replay(|x, s| ops::cumulative(x, 0, false, false, true, s)).is_err());
    // Shape-agnostic ops replay right.
    let grown = replay(|x, s| ops::concatenate(&[x.clone(), x.clone()], 0, s)).unwrap();
    assert_eq!(grown[0].shape(), vec![12]);
    let summed = replay(|x, s| ops::sum_axes(x, &[0], true, s)).unwrap();
    assert_eq!(summed[0].to_vec::<f32>(&s).unwrap(), vec![21.0]);
    // A mean's element count is computed when evaluated (MLX's number_of_elements).
    let mean = replay(|x, s| ops::mean_axes(x, &[0], true, s)).unwrap();
    assert_eq!(mean[0].to_vec::<f32>(&s).unwrap(), vec![3.5]);
    // A baked arange of the traced length is not refused: only its 4 values are added.
    let baked = replay(|x, s| ops::add(x, &ops::arange(0.0, x.shape()[0] as f64, 1.0, Dtype::F32, s)?, s)).unwrap();
    assert_ne!(baked[0].to_vec::<f32>(&s).unwrap(), vec![1.0, 3.0, 5.0, 7.0, 9.0, 11.0]);
}

#[test]
fn a_graph_is_counted_by_its_primitives() {
    let _g = lock();
    let s = cpu();
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let y = ops::exp(&ops::add(&x, &x, &s).unwrap(), &s).unwrap();
    let dot = VectorArray::from_arrays([&y]).unwrap().graph_dot().unwrap();
    let size = crate::stats::GraphSize::from_dot("test", &dot);
    // The input is drawn but is no primitive; Add and Exp are.
    assert_eq!(size.primitives, 2, "{dot}");
    assert_eq!(size.fused, 0);
    assert!(size.by_name.contains(&("Add".to_owned(), 1)) && size.by_name.contains(&("Exp".to_owned(), 1)), "{dot}");
}

/// A fixed slice in a shapeless closure: a plain slice is refused on replay (MLX cannot
/// re-derive its shape), the gather of `take_range` replays while another input grows.
#[test]
fn a_fixed_slice_replays_in_a_shapeless_closure() {
    let _g = lock();
    let s = cpu();
    let replay = |fixed: bool| {
        let closure = Closure::new(move |args: &[Array]| {
            let s = Stream::cpu()?;
            let part = if fixed {
                ops::take_range(&args[0], 1, 2, 1, &s)?
            } else {
                ops::slice(&args[0], &[0, 1], &[2, 3], &s)?
            };
            Ok(vec![part, ops::sum_axes(&args[1], &[0], false, &s)?])
        });
        let compiled = closure.compile(true).unwrap();
        let x = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], &[2, 4]).unwrap();
        let mut last = Vec::new();
        for n in [3, 5] {
            let grow = Array::from_slice(&vec![1.0f32; n], &[n as i64]).unwrap();
            last = compiled.apply(&[x.clone(), grow])?;
        }
        Ok::<_, crate::mlx::MlxError>(last)
    };
    assert!(replay(false).is_err(), "a plain slice replays shapeless");
    let out = replay(true).unwrap();
    assert_eq!(out[0].shape(), vec![2, 2]);
    assert_eq!(out[0].to_vec::<f32>(&s).unwrap(), vec![1.0, 2.0, 5.0, 6.0]);
    assert_eq!(out[1].to_vec::<f32>(&s).unwrap(), vec![5.0]);
    let err = ops::take_range(&Array::from_slice(&[1.0f32; 4], &[4]).unwrap(), 3, 2, 0, &s).unwrap_err();
    assert!(err.0.contains("entries [3, 5)"), "{err}");
}

/// `unfused` ends a fused chain (MLX's compiler fuses the two exponentials without it, not
/// with it), keeps the values, and replays in a shapeless closure on a new shape.
#[test]
fn unfused_ends_a_fused_chain_and_replays_shapeless() {
    let _g = lock();
    let s = cpu();
    let fused_kernels = |barrier: bool, shapeless: bool| {
        let closure = Closure::new(move |args: &[Array]| {
            let s = Stream::cpu()?;
            let e = ops::exp(&args[0], &s)?;
            let e = if barrier { ops::unfused(&e, &s)? } else { e };
            Ok(vec![ops::exp(&e, &s)?])
        });
        let compiled = closure.compile(shapeless).unwrap();
        let mut last = (0, Vec::new());
        for n in [3usize, 5] {
            let x = Array::from_slice(&vec![0.5f32; n], &[n as i64]).unwrap();
            let out = compiled.apply(&[x]).unwrap();
            let dot = VectorArray::from_arrays(&out).unwrap().graph_dot().unwrap();
            last = (
                crate::stats::GraphSize::from_dot("test", &dot).fused,
                out[0].to_vec::<f32>(&Stream::cpu().unwrap()).unwrap(),
            );
        }
        last
    };
    let x = Array::from_slice(&[0.5f32; 5], &[5]).unwrap();
    let want = ops::exp(&ops::exp(&x, &s).unwrap(), &s).unwrap().to_vec::<f32>(&s).unwrap();
    assert_eq!(fused_kernels(false, false).0, 1);
    for shapeless in [false, true] {
        let (fused, values) = fused_kernels(true, shapeless);
        assert_eq!(fused, 0, "shapeless={shapeless}");
        assert_eq!(values, want, "shapeless={shapeless}");
    }
}

/// `host_f32` reads a host array's values in each type it knows, exactly as MLX converts
/// them, and declines a type it does not.
#[test]
fn host_f32_reads_host_values_as_mlx_converts_them() {
    let _g = lock();
    let s = cpu();
    let values = [0.1f32, -2.5, 65504.0, 1e-8, 3.0];
    let x = Array::from_slice(&values, &[5]).unwrap();
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::U8, Dtype::I8] {
        let a = ops::astype(&x, dtype, &s).unwrap();
        let mut bytes = vec![0u8; 5 * dtype.size_in_bytes()];
        a.copy_to(&mut bytes, &s).unwrap();
        let a = Array::from_bytes(&bytes, &[5], dtype).unwrap();
        let want = ops::astype(&a, Dtype::F32, &s).unwrap().to_vec::<f32>(&s).unwrap();
        assert_eq!(a.host_f32().unwrap(), want, "{dtype:?}");
    }
    let ints = Array::from_slice(&[1i32, 2], &[2]).unwrap();
    assert!(ints.host_f32().is_none());
}

/// Without MLX's CUDA backend a custom CUDA kernel is an error as a result (the lowerings
/// that use one check `device::is_cuda` first), never an abort of the host.
#[test]
fn a_cuda_kernel_without_cuda_is_an_error() {
    use kernel::{CudaKernel, Launch, TemplateArg};
    let _g = lock();
    if device::is_cuda() {
        return;
    }
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let made = CudaKernel::new("mlx_ep_test_copy", &["x"], &["y"], "y[threadIdx.x] = x[threadIdx.x];", true);
    let err = match made {
        Err(e) => e,
        Ok(k) => {
            let launch = Launch {
                outputs: &[(&[2], Dtype::F32)],
                grid: [2, 1, 1],
                block: [2, 1, 1],
                constants: &[("T", TemplateArg::Dtype(Dtype::F32)), ("N", TemplateArg::Int(2))],
            };
            match k.apply(&[&x], &launch, &Stream::default_device().unwrap()).and_then(|y| {
                VectorArray::from_arrays(&y)?.eval()?;
                Ok(y)
            }) {
                Err(e) => e,
                Ok(_) => panic!("a CUDA kernel ran without CUDA"),
            }
        }
    };
    assert!(!err.0.is_empty());
}
