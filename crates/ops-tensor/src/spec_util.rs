//! Strategies shared by this crate's specs.

use conformance_spec::DType;
use conformance_spec::strategy::*;

/// Element types the data-movement ops are checked on.
pub const DATA_TYPES: &[DType] = &[DType::F32, DType::F16, DType::I64, DType::I32, DType::U8, DType::Bool, DType::F64];

/// float32 most of the time, any of [`DATA_TYPES`] otherwise.
pub fn any_dtype() -> BoxedStrategy<DType> {
    prop_oneof![3 => Just(DType::F32), 4 => select(DATA_TYPES)].boxed()
}
