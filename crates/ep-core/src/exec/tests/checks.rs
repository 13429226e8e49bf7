//! Data checks: a failed one fails its run with the node's name and the reason; the
//! partition keeps running as it did.

use super::*;

/// `take(x, i)` along axis 0 with the indices checked against the rows of `x`.
static TAKE_CHECKED: TestLowering = TestLowering {
    op: "TakeChecked",
    safety: CompileSafety::ShapeKeyed,
    lower: |ctx, _| {
        let (x, i, s) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.stream());
        let rows = mlx::ops::scalar(x.shape()[0] as f64, Dtype::I64, s)?;
        let i = ctx.checked_indices(&i, &rows, "index out of range", s)?;
        Ok(vec![mlx::ops::take(&x, &i, 0, s)?])
    },
};

/// The same with the indices checked as a range (two reductions read on the host) and wrapped
/// by one remainder.
static TAKE_CHECKED_INDEX: TestLowering = TestLowering {
    op: "TakeChecked",
    safety: CompileSafety::ShapeKeyed,
    lower: |ctx, _| {
        let (x, i, s) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.stream());
        let i = ctx.checked_index(&i, x.shape()[0], "index out of range", s)?;
        Ok(vec![mlx::ops::take(&x, &i, 0, s)?])
    },
};

#[test]
fn a_failed_data_check_fails_the_run_naming_the_node_and_later_runs_still_replay() {
    let _g = mlx::lock();
    let s = Stream::cpu().unwrap();
    for (lowering, compile) in
        [(&TAKE_CHECKED, true), (&TAKE_CHECKED, false), (&TAKE_CHECKED_INDEX, true), (&TAKE_CHECKED_INDEX, false)]
    {
        let registry = Registry::build(&[lowering]).unwrap();
        let stats = Arc::new(SessionStats::default());
        let plan = make_plan(
            &registry,
            vec![node("TakeChecked", ["x", "i"], "y")],
            &["x", "i"],
            &["y"],
            vec![],
            &stats,
            compile,
        )
        .unwrap();
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
        let run = |idx: &[i64]| plan.run(vec![x.clone(), Array::from_slice(idx, &[idx.len() as i64]).unwrap()]);
        assert_eq!(run(&[3, -4]).unwrap().outputs[0].to_vec::<f32>(&s).unwrap(), vec![4.0, 1.0]);
        for bad in [[4i64, 0], [0, -5], [1 << 40, 0], [i64::MIN, 0]] {
            let err = run(&bad).err().expect("an out-of-range index fails the run");
            assert!(err.0.contains("TakeChecked_node") && err.0.contains("index out of range"), "{err}");
        }
        // A user's bad data is no reason to change how the partition runs.
        assert_eq!(run(&[2, -1]).unwrap().outputs[0].to_vec::<f32>(&s).unwrap(), vec![3.0, 4.0]);
        if compile {
            assert_eq!(plan.mode(), Mode::ShapeKeyed);
            assert_eq!(count(&stats.traces), 1, "every run replays the one trace");
        } else {
            assert!(matches!(plan.mode(), Mode::Eager(_)));
        }
    }
}

/// The int64 flag vector's layout: the boolean guard, two entries per range guard, then one
/// entry per boolean check or two per range check, each judged in that order.
#[test]
fn flags_are_judged_entry_by_entry_in_the_order_they_are_built() {
    use crate::exec::translate::{Flags, Verdict};
    let flags = Flags {
        guard: true,
        guard_ranges: vec![(2, 5)],
        checks: vec![(None, "first".into()), (Some((-3, 3)), "second".into()), (None, "third".into())],
    };
    assert_eq!(flags.count(), 1 + 2 + 1 + 2 + 1);
    let verdict = |v: &[i64], guarded| match flags.judge(v, guarded).unwrap() {
        Verdict::Valid => "valid".to_owned(),
        Verdict::GuardMiss => "guard miss".to_owned(),
        Verdict::Invalid(e) => e.0,
    };
    assert_eq!(verdict(&[1, 2, 5, 1, -3, 3, 1], true), "valid");
    // The boolean guard, then a range guard's minimum or maximum outside its bounds.
    for missed in [[0, 2, 5], [1, 1, 5], [1, 2, 6]] {
        let v: Vec<i64> = missed.iter().copied().chain([1, -3, 3, 1]).collect();
        assert_eq!(verdict(&v, true), "guard miss");
        // An exact run has no use for its guards.
        assert_eq!(verdict(&v, false), "valid");
    }
    assert_eq!(verdict(&[1, 2, 5, 0, -3, 3, 1], true), "first");
    assert_eq!(verdict(&[1, 2, 5, 1, -4, 3, 1], true), "second");
    assert_eq!(verdict(&[1, 2, 5, 1, -3, 4, 0], true), "second");
    assert_eq!(verdict(&[1, 2, 5, 1, 0, 0, 0], true), "third");
    assert!(flags.judge(&[1, 2, 5], true).is_err(), "a short vector is an error, not a verdict");
}
