//! Large copies between two host ranges, split over a few threads: the host side of a copy
//! between ORT's (pageable) host memory and the pinned staging buffer the device copies from
//! and into. One thread copies a few GB/s on the GPU machines: a 128-token prompt's float16
//! logits (39 MB) came back 2.7 ms slower on one thread than on four (the H100's prefill, 14.3
//! against 11.65 ms); a detector's 4-5 MB inputs and outputs measured the same either way.

use std::sync::OnceLock;

/// Batches of at least this many bytes are split over the pool's threads.
const PARALLEL_MIN: usize = 1 << 20;
/// The pieces the threads take (a large copy is cut into these).
const PIECE: usize = 256 << 10;
/// The most threads a copy uses (memory bandwidth, not cores, bounds it).
const THREADS_MAX: usize = 4;

fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(THREADS_MAX);
        if threads < 2 {
            return None;
        }
        rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("mlx-ep-copy-{i}")).build().ok()
    })
    .as_ref()
}

/// Copies each `(dst, src, n)` between host ranges; a batch of [`PARALLEL_MIN`] bytes or more
/// is cut into pieces copied by a small thread pool (or by this thread where none could start).
///
/// # Safety
/// Each `src` is readable and each `dst` writable for `n` bytes, for the whole call; no two
/// ranges overlap where one is written.
pub(crate) unsafe fn copy(copies: &[(*mut u8, *const u8, usize)]) {
    let total: usize = copies.iter().map(|c| c.2).sum();
    let pool = if total >= PARALLEL_MIN { pool() } else { None };
    let Some(pool) = pool else {
        for &(dst, src, n) in copies {
            // SAFETY: per the caller.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        }
        return;
    };
    // Addresses as integers: the pieces cross threads; the caller vouches for the ranges.
    let pieces: Vec<(usize, usize, usize)> = copies
        .iter()
        .flat_map(|&(dst, src, n)| {
            (0..n).step_by(PIECE).map(move |at| (dst as usize + at, src as usize + at, PIECE.min(n - at)))
        })
        .collect();
    pool.install(|| {
        use rayon::prelude::*;
        pieces.par_iter().for_each(|&(dst, src, n)| {
            // SAFETY: a piece of one of the caller's ranges; pieces do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) };
        });
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn large_and_small_batches_copy_every_byte() {
        for sizes in [vec![3usize, 1000, 17], vec![5 << 20, 1, (1 << 20) + 13, PIECE_ODD]] {
            let srcs: Vec<Vec<u8>> =
                sizes.iter().enumerate().map(|(k, &n)| (0..n).map(|i| (i * 7 + k) as u8).collect()).collect();
            let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
            let copies: Vec<(*mut u8, *const u8, usize)> =
                dsts.iter_mut().zip(&srcs).map(|(d, s)| (d.as_mut_ptr(), s.as_ptr(), s.len())).collect();
            // SAFETY: each pair is two live vectors of the same length.
            unsafe { super::copy(&copies) };
            assert_eq!(dsts, srcs);
        }
    }

    const PIECE_ODD: usize = super::PIECE * 3 + 5;
}
