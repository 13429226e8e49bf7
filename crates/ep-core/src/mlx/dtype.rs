//! [`Dtype`]: MLX's element types, and their mapping to mlx-c's.

use mlx_sys::mlx_dtype;

/// MLX element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

impl Dtype {
    pub fn size_in_bytes(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
    }

    pub fn is_integer(self) -> bool {
        !self.is_float() && self != Dtype::Bool
    }

    pub(crate) fn to_raw(self) -> mlx_dtype {
        match self {
            Dtype::Bool => mlx_dtype::MLX_BOOL,
            Dtype::U8 => mlx_dtype::MLX_UINT8,
            Dtype::U16 => mlx_dtype::MLX_UINT16,
            Dtype::U32 => mlx_dtype::MLX_UINT32,
            Dtype::U64 => mlx_dtype::MLX_UINT64,
            Dtype::I8 => mlx_dtype::MLX_INT8,
            Dtype::I16 => mlx_dtype::MLX_INT16,
            Dtype::I32 => mlx_dtype::MLX_INT32,
            Dtype::I64 => mlx_dtype::MLX_INT64,
            Dtype::F16 => mlx_dtype::MLX_FLOAT16,
            Dtype::BF16 => mlx_dtype::MLX_BFLOAT16,
            Dtype::F32 => mlx_dtype::MLX_FLOAT32,
            Dtype::F64 => mlx_dtype::MLX_FLOAT64,
        }
    }

    pub(crate) fn from_raw(raw: mlx_dtype) -> Option<Dtype> {
        Some(match raw {
            mlx_dtype::MLX_BOOL => Dtype::Bool,
            mlx_dtype::MLX_UINT8 => Dtype::U8,
            mlx_dtype::MLX_UINT16 => Dtype::U16,
            mlx_dtype::MLX_UINT32 => Dtype::U32,
            mlx_dtype::MLX_UINT64 => Dtype::U64,
            mlx_dtype::MLX_INT8 => Dtype::I8,
            mlx_dtype::MLX_INT16 => Dtype::I16,
            mlx_dtype::MLX_INT32 => Dtype::I32,
            mlx_dtype::MLX_INT64 => Dtype::I64,
            mlx_dtype::MLX_FLOAT16 => Dtype::F16,
            mlx_dtype::MLX_BFLOAT16 => Dtype::BF16,
            mlx_dtype::MLX_FLOAT32 => Dtype::F32,
            mlx_dtype::MLX_FLOAT64 => Dtype::F64,
            mlx_dtype::MLX_COMPLEX64 => return None,
        })
    }
}
