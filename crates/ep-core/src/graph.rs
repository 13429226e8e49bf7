//! An owned, safe description of the graph ORT hands the EP: nodes in ORT's order, each with
//! its typed attributes and the value infos of its inputs and outputs. Built by `ort_abi` from
//! ORT's graph API; everything after that (claim, partition, lowering) works on this.

use crate::mlx::Dtype;
use std::collections::BTreeMap;

/// ONNX tensor element types, by ORT's numbers (`ONNXTensorElementDataType`, equal to ONNX's
/// `TensorProto.DataType` below 24; see [`ElemType::UINT2`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemType {
    F32,
    U8,
    I8,
    U16,
    I16,
    I32,
    I64,
    String,
    Bool,
    F16,
    F64,
    U32,
    U64,
    BF16,
    /// Any other ONNX type (complex, float8, int4, ...), by its ONNX number.
    Other(i32),
}

impl ElemType {
    pub fn from_onnx(v: i32) -> ElemType {
        match v {
            1 => ElemType::F32,
            2 => ElemType::U8,
            3 => ElemType::I8,
            4 => ElemType::U16,
            5 => ElemType::I16,
            6 => ElemType::I32,
            7 => ElemType::I64,
            8 => ElemType::String,
            9 => ElemType::Bool,
            10 => ElemType::F16,
            11 => ElemType::F64,
            12 => ElemType::U32,
            13 => ElemType::U64,
            16 => ElemType::BF16,
            other => ElemType::Other(other),
        }
    }

    /// An element type written in a model by ONNX's `TensorProto.DataType` number (an
    /// attribute such as Cast's `to`): ONNX's numbers part from ORT's from 24 on.
    pub fn from_tensor_proto(v: i32) -> ElemType {
        match v {
            24 => ElemType::Other(26), // float8e8m0
            25 => ElemType::UINT2,
            26 => ElemType::INT2,
            other => ElemType::from_onnx(other),
        }
    }

    pub fn to_onnx(self) -> i32 {
        match self {
            ElemType::F32 => 1,
            ElemType::U8 => 2,
            ElemType::I8 => 3,
            ElemType::U16 => 4,
            ElemType::I16 => 5,
            ElemType::I32 => 6,
            ElemType::I64 => 7,
            ElemType::String => 8,
            ElemType::Bool => 9,
            ElemType::F16 => 10,
            ElemType::F64 => 11,
            ElemType::U32 => 12,
            ElemType::U64 => 13,
            ElemType::BF16 => 16,
            ElemType::Other(v) => v,
        }
    }

    /// The MLX dtype that holds this type bit for bit, if any.
    pub fn to_mlx(self) -> Option<Dtype> {
        Some(match self {
            ElemType::F32 => Dtype::F32,
            ElemType::U8 => Dtype::U8,
            ElemType::I8 => Dtype::I8,
            ElemType::U16 => Dtype::U16,
            ElemType::I16 => Dtype::I16,
            ElemType::I32 => Dtype::I32,
            ElemType::I64 => Dtype::I64,
            ElemType::Bool => Dtype::Bool,
            ElemType::F16 => Dtype::F16,
            ElemType::F64 => Dtype::F64,
            ElemType::U32 => Dtype::U32,
            ElemType::U64 => Dtype::U64,
            ElemType::BF16 => Dtype::BF16,
            ElemType::String | ElemType::Other(_) => return None,
        })
    }

    /// uint4 (21) and int4 (22): two elements per byte, the even one in the low nibble; uint2
    /// and int2: four per byte, the first in the lowest two bits. The EP holds them unpacked,
    /// one per byte, as uint8 / int8 (signed ones sign-extended). The 2-bit types carry ORT's
    /// numbers (`ONNXTensorElementDataType`: 24 and 25), which the EP reads its types as; in
    /// ONNX's `TensorProto` (attributes such as Cast's `to`) they are 25 and 26, and 24 is
    /// float8e8m0. Below 24 the two numberings agree.
    pub const UINT4: ElemType = ElemType::Other(21);
    pub const INT4: ElemType = ElemType::Other(22);
    pub const UINT2: ElemType = ElemType::Other(24);
    pub const INT2: ElemType = ElemType::Other(25);
    /// float4e2m1 (23, opset 23): packed two per byte as uint4 is, and held unpacked as its
    /// 4-bit codes, one per byte in uint8 ([`crate::float4`]).
    pub const FLOAT4E2M1: ElemType = ElemType::Other(23);

    /// The MLX type the EP holds a value of this type in: the type itself ([`Self::to_mlx`]),
    /// the sub-byte integers unpacked ([`Self::unpacked_sub_byte`]), or the float8 types'
    /// bytes as uint8 ([`crate::float8`]). Only lowerings that name such a type read or write it.
    pub fn held_as(self) -> Option<Dtype> {
        self.to_mlx()
            .or_else(|| self.unpacked_sub_byte())
            .or_else(|| crate::float8::Float8::of(self).map(|_| Dtype::U8))
    }

    /// The width in bits of a packed sub-byte type (int4, uint4, int2, uint2, and float4e2m1's
    /// codes) and whether it is a signed integer.
    pub fn sub_byte_bits(self) -> Option<(u32, bool)> {
        match self {
            ElemType::UINT4 | ElemType::FLOAT4E2M1 => Some((4, false)),
            ElemType::INT4 => Some((4, true)),
            ElemType::UINT2 => Some((2, false)),
            ElemType::INT2 => Some((2, true)),
            _ => None,
        }
    }

    /// The MLX type a packed sub-byte type is unpacked to.
    pub fn unpacked_sub_byte(self) -> Option<Dtype> {
        self.sub_byte_bits().map(|(_, signed)| if signed { Dtype::I8 } else { Dtype::U8 })
    }
}

/// Packs `bits`-wide elements held one per byte (`values`) `8 / bits` per byte, the first in
/// the lowest bits, into `out` (`ceil(n * bits / 8)` bytes).
pub fn pack_bits(values: &[u8], bits: u32, out: &mut [u8]) -> Result<(), String> {
    let per = (8 / bits) as usize;
    if out.len() != values.len().div_ceil(per) {
        return Err(format!("{} {bits}-bit values do not fill {} bytes", values.len(), out.len()));
    }
    let mask = (1u8 << bits) - 1;
    for (byte, chunk) in out.iter_mut().zip(values.chunks(per)) {
        *byte = chunk.iter().enumerate().fold(0, |b, (j, v)| b | ((v & mask) << (bits as usize * j)));
    }
    Ok(())
}

/// The `count` elements of a packed tensor of `bits`-wide elements, one per byte (signed ones
/// sign-extended).
pub fn unpack_bits(bytes: &[u8], count: usize, bits: u32, signed: bool) -> Vec<u8> {
    let per = (8 / bits) as usize;
    let mask = (1u8 << bits) - 1;
    let sign = 1u8 << (bits - 1);
    (0..count)
        .map(|i| {
            let v = (bytes.get(i / per).copied().unwrap_or(0) >> (bits as usize * (i % per))) & mask;
            if signed && v & sign != 0 { v | !mask } else { v }
        })
        .collect()
}

/// One value (tensor) of the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueInfo {
    pub name: String,
    /// `None` when the value is not a tensor (sequence, map, optional).
    pub elem_type: Option<ElemType>,
    /// Dimensions, `None` for a symbolic or unknown one; `None` as a whole for an unknown rank.
    pub shape: Option<Vec<Option<i64>>>,
    /// A constant initializer (its data is known when the graph is compiled).
    pub is_constant: bool,
}

impl ValueInfo {
    pub fn rank(&self) -> Option<usize> {
        self.shape.as_ref().map(Vec::len)
    }
}

/// A tensor held on the host: an attribute's value or a subgraph's initializer.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorData {
    pub elem_type: ElemType,
    pub shape: Vec<i64>,
    /// Row-major element bytes.
    pub bytes: Vec<u8>,
}

/// A subgraph attribute (a branch of If, the body of Loop or Scan): its formal inputs and
/// outputs, its nodes in ORT's order, and its own constant initializers. Names it uses but
/// does not define come from the enclosing scope.
#[derive(Debug, Clone, PartialEq)]
pub struct Subgraph {
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
    pub nodes: Vec<NodeInfo>,
    pub initializers: Vec<(String, TensorData)>,
}

/// A typed ONNX attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Int(i64),
    Float(f32),
    String(String),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Strings(Vec<String>),
    Tensor(TensorData),
    Graph(Box<Subgraph>),
    Undefined,
    /// An attribute the EP cannot read (a string tensor, a type proto, ...), with the reason;
    /// a lowering that needs it declines the node.
    Unreadable(String),
}

/// One node, as lowerings see it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    pub op_type: String,
    /// `""` for the default ONNX domain.
    pub domain: String,
    pub since_version: i32,
    /// `None` for an omitted optional input.
    pub inputs: Vec<Option<ValueInfo>>,
    pub outputs: Vec<Option<ValueInfo>>,
    pub attributes: BTreeMap<String, AttrValue>,
    /// Values of the enclosing scopes that the node's subgraphs use.
    pub implicit_inputs: Vec<ValueInfo>,
}

impl NodeInfo {
    pub fn input(&self, i: usize) -> Option<&ValueInfo> {
        self.inputs.get(i).and_then(Option::as_ref)
    }

    pub fn output(&self, i: usize) -> Option<&ValueInfo> {
        self.outputs.get(i).and_then(Option::as_ref)
    }

    pub fn attr(&self, name: &str) -> Option<&AttrValue> {
        self.attributes.get(name)
    }

    /// An int attribute, `default` when absent; an error when present with another type.
    pub fn attr_int(&self, name: &str, default: i64) -> Result<i64, String> {
        match self.attr(name) {
            None => Ok(default),
            Some(AttrValue::Int(v)) => Ok(*v),
            Some(other) => Err(format!("attribute '{name}' should be an int, found {other:?}")),
        }
    }

    /// A float attribute, `default` when absent.
    pub fn attr_float(&self, name: &str, default: f32) -> Result<f32, String> {
        match self.attr(name) {
            None => Ok(default),
            Some(AttrValue::Float(v)) => Ok(*v),
            Some(other) => Err(format!("attribute '{name}' should be a float, found {other:?}")),
        }
    }

    /// An ints attribute, `None` when absent.
    pub fn attr_ints(&self, name: &str) -> Result<Option<&[i64]>, String> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::Ints(v)) => Ok(Some(v)),
            Some(other) => Err(format!("attribute '{name}' should be ints, found {other:?}")),
        }
    }

    /// A subgraph attribute, `None` when absent.
    pub fn attr_graph(&self, name: &str) -> Result<Option<&Subgraph>, String> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::Graph(g)) => Ok(Some(g)),
            Some(other) => Err(format!("attribute '{name}' should be a graph, found {other:?}")),
        }
    }

    /// A tensor attribute, `None` when absent.
    pub fn attr_tensor(&self, name: &str) -> Result<Option<&TensorData>, String> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::Tensor(t)) => Ok(Some(t)),
            Some(other) => Err(format!("attribute '{name}' should be a tensor, found {other:?}")),
        }
    }

    /// `op_type`, with the domain in front when it is not the ONNX one.
    pub fn qualified_op(&self) -> String {
        if is_onnx_domain(&self.domain) { self.op_type.clone() } else { format!("{}:{}", self.domain, self.op_type) }
    }
}

/// `""` and `"ai.onnx"` both name the default ONNX domain.
pub fn is_onnx_domain(domain: &str) -> bool {
    domain.is_empty() || domain == "ai.onnx"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_byte_values_pack_first_in_the_lowest_bits() {
        let mut out = [0u8; 2];
        pack_bits(&[1, 2, 3], 4, &mut out).unwrap();
        assert_eq!(out, [0x21, 0x03]);
        let mut out = [0u8; 2];
        pack_bits(&[1, 2, 3, 0, 1], 2, &mut out).unwrap();
        assert_eq!(out, [0b00_11_10_01, 0b01]);
        assert!(pack_bits(&[1, 2, 3], 2, &mut [0u8; 2]).is_err());
    }

    #[test]
    fn sub_byte_values_round_trip_sign_extended() {
        for (t, values) in [
            (ElemType::INT4, vec![-8i8, -1, 0, 7, 3]),
            (ElemType::UINT4, vec![0, 15, 9, 1, 2]),
            (ElemType::INT2, vec![-2, -1, 0, 1, 1]),
            (ElemType::UINT2, vec![0, 3, 2, 1, 3]),
        ] {
            let (bits, signed) = t.sub_byte_bits().unwrap();
            let held: Vec<u8> = values.iter().map(|&v| v as u8).collect();
            let mut packed = vec![0u8; held.len().div_ceil((8 / bits) as usize)];
            pack_bits(&held, bits, &mut packed).unwrap();
            assert_eq!(unpack_bits(&packed, held.len(), bits, signed), held, "{t:?}");
            assert_eq!(t.unpacked_sub_byte(), Some(if signed { Dtype::I8 } else { Dtype::U8 }));
        }
    }
}
