//! A compiled run retried because MLX loaded a JIT kernel library another process was still
//! writing counts once.

use super::*;

#[test]
fn a_run_retried_after_a_half_written_jit_library_counts_once() {
    let stats = SessionStats::default();
    let mut attempts = 0;
    let got = compiled::jit_retry(&stats, || {
        attempts += 1;
        if attempts < 3 {
            return Err(Error::new("[compile] Could not load C++ shared library /tmp/x.so"));
        }
        stats.evaluations.fetch_add(1, Ordering::Relaxed);
        Ok(attempts)
    });
    assert_eq!(got.unwrap(), 3);
    assert_eq!(SessionStats::count(&stats.jit_retries), 2);
    assert_eq!(SessionStats::count(&stats.evaluations), 1);
    // Any other error is returned at once.
    let mut tries = 0;
    let e = compiled::jit_retry(&stats, || -> Result<()> {
        tries += 1;
        Err(Error::new("shapes do not broadcast"))
    });
    assert!(e.is_err());
    assert_eq!(tries, 1);
}
