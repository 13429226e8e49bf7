//! Reads ORT's graph objects (`OrtGraph`, `OrtNode`, `OrtValueInfo`, `OrtOpAttr`) into the owned
//! descriptions of [`crate::graph`], and initializer data into MLX arrays.

use super::{c_str, ort_call};
use crate::graph::{AttrValue, ElemType, NodeInfo, Subgraph, TensorData, ValueInfo};
use crate::mlx::Array;
use crate::{Error, Result};
use ort_sys::{ONNXType, OrtGraph, OrtNode, OrtOpAttr, OrtOpAttrType, OrtTypeInfo, OrtValue, OrtValueInfo};
use std::collections::BTreeMap;
use std::ffi::c_char;
use std::ptr::{null, null_mut};

/// Reads an ORT list: `count` reports its length, `fill` writes that many entries.
fn read_list<T>(
    count: impl FnOnce(&mut usize) -> Result<()>,
    fill: impl FnOnce(*mut *const T, usize) -> Result<()>,
) -> Result<Vec<*const T>> {
    let mut n = 0usize;
    count(&mut n)?;
    let mut items = vec![null::<T>(); n];
    if n > 0 {
        fill(items.as_mut_ptr(), n)?;
    }
    Ok(items)
}

/// The graph's nodes, in ORT's order.
pub(crate) fn graph_nodes(graph: *const OrtGraph) -> Result<Vec<*const OrtNode>> {
    read_list(|n| ort_call!(Graph_GetNumNodes(graph, n)), |p, n| ort_call!(Graph_GetNodes(graph, p, n)))
}

/// A node's input value infos (null entries for omitted optional inputs).
pub(crate) fn node_inputs(node: *const OrtNode) -> Result<Vec<*const OrtValueInfo>> {
    read_list(|n| ort_call!(Node_GetNumInputs(node, n)), |p, n| ort_call!(Node_GetInputs(node, p, n)))
}

/// A node's output value infos (null entries for omitted optional outputs).
pub(crate) fn node_outputs(node: *const OrtNode) -> Result<Vec<*const OrtValueInfo>> {
    read_list(|n| ort_call!(Node_GetNumOutputs(node, n)), |p, n| ort_call!(Node_GetOutputs(node, p, n)))
}

/// Values of enclosing scopes the node's subgraphs use.
pub(crate) fn node_implicit_inputs(node: *const OrtNode) -> Result<Vec<*const OrtValueInfo>> {
    let list = read_list(
        |n| ort_call!(Node_GetNumImplicitInputs(node, n)),
        |p, n| ort_call!(Node_GetImplicitInputs(node, p, n)),
    )?;
    Ok(list.into_iter().filter(|v| !v.is_null()).collect())
}

pub(crate) fn node_name(node: *const OrtNode) -> Result<String> {
    let mut p: *const c_char = null();
    ort_call!(Node_GetName(node, &mut p))?;
    Ok(c_str(p))
}

/// Reads one node: identity, typed attributes, and its inputs' and outputs' value infos.
pub(crate) fn read_node(node: *const OrtNode) -> Result<NodeInfo> {
    let name = node_name(node)?;
    let mut p: *const c_char = null();
    ort_call!(Node_GetOperatorType(node, &mut p))?;
    let op_type = c_str(p);
    ort_call!(Node_GetDomain(node, &mut p))?;
    let domain = c_str(p);
    let mut since_version = 0i32;
    ort_call!(Node_GetSinceVersion(node, &mut since_version))?;
    let inputs = node_inputs(node)?.into_iter().map(read_optional_value).collect::<Result<_>>()?;
    let outputs = node_outputs(node)?.into_iter().map(read_optional_value).collect::<Result<_>>()?;
    let attributes = read_attributes(node).map_err(|e| e.at_node(&name, &op_type))?;
    let implicit_inputs = node_implicit_inputs(node)?.into_iter().map(read_value_info).collect::<Result<_>>()?;
    Ok(NodeInfo { name, op_type, domain, since_version, inputs, outputs, attributes, implicit_inputs })
}

fn read_optional_value(v: *const OrtValueInfo) -> Result<Option<ValueInfo>> {
    if v.is_null() { Ok(None) } else { read_value_info(v).map(Some) }
}

/// Reads a value info: name, element type, shape, and whether it is a constant initializer.
pub(crate) fn read_value_info(v: *const OrtValueInfo) -> Result<ValueInfo> {
    let mut p: *const c_char = null();
    ort_call!(GetValueInfoName(v, &mut p))?;
    let name = c_str(p);
    // An empty name marks an omitted optional value.
    let mut type_info: *const OrtTypeInfo = null();
    ort_call!(GetValueInfoTypeInfo(v, &mut type_info))?;
    let (elem_type, shape) = if type_info.is_null() { (None, None) } else { read_tensor_type(type_info)? };
    let mut is_constant = false;
    ort_call!(ValueInfo_IsConstantInitializer(v, &mut is_constant))?;
    Ok(ValueInfo { name, elem_type, shape, is_constant })
}

type TensorType = (Option<ElemType>, Option<Vec<Option<i64>>>);

fn read_tensor_type(type_info: *const OrtTypeInfo) -> Result<TensorType> {
    let mut onnx_type = ONNXType::ONNX_TYPE_UNKNOWN;
    ort_call!(GetOnnxTypeFromTypeInfo(type_info, &mut onnx_type))?;
    if onnx_type != ONNXType::ONNX_TYPE_TENSOR {
        return Ok((None, None));
    }
    let mut info = null();
    ort_call!(CastTypeInfoToTensorInfo(type_info, &mut info))?;
    if info.is_null() {
        return Ok((None, None));
    }
    let mut elem = ort_sys::ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    ort_call!(GetTensorElementType(info, &mut elem))?;
    let elem_type = ElemType::from_onnx(elem as i32);
    // SAFETY: `info` is a valid tensor type info owned by ORT.
    let has_shape = unsafe { (super::api().TensorTypeAndShape_HasShape)(info) };
    if !has_shape {
        return Ok((Some(elem_type), None));
    }
    let mut rank = 0usize;
    ort_call!(GetDimensionsCount(info, &mut rank))?;
    let mut dims = vec![0i64; rank];
    if rank > 0 {
        ort_call!(GetDimensions(info, dims.as_mut_ptr(), rank))?;
    }
    Ok((Some(elem_type), Some(dims.into_iter().map(|d| (d >= 0).then_some(d)).collect())))
}

fn read_attributes(node: *const OrtNode) -> Result<BTreeMap<String, AttrValue>> {
    let subgraphs = read_subgraphs(node)?;
    let attrs =
        read_list(|n| ort_call!(Node_GetNumAttributes(node, n)), |p, n| ort_call!(Node_GetAttributes(node, p, n)))?;
    let mut out = BTreeMap::new();
    for a in attrs {
        let mut p: *const c_char = null();
        ort_call!(OpAttr_GetName(a, &mut p))?;
        let name = c_str(p);
        let value = read_attribute(a, &name, &subgraphs).unwrap_or_else(|e| AttrValue::Unreadable(e.to_string()));
        out.insert(name, value);
    }
    Ok(out)
}

/// One attribute's value; an error for a type the EP cannot represent.
fn read_attribute(a: *const OrtOpAttr, name: &str, subgraphs: &[(String, Subgraph)]) -> Result<AttrValue> {
    let mut ty = OrtOpAttrType::ORT_OP_ATTR_UNDEFINED;
    ort_call!(OpAttr_GetType(a, &mut ty))?;
    let value = match ty {
        OrtOpAttrType::ORT_OP_ATTR_INT => AttrValue::Int(read_scalar::<i64>(a, ty)?),
        OrtOpAttrType::ORT_OP_ATTR_FLOAT => AttrValue::Float(read_scalar::<f32>(a, ty)?),
        OrtOpAttrType::ORT_OP_ATTR_INTS => AttrValue::Ints(pod_vec(&read_bytes(a, ty)?)),
        OrtOpAttrType::ORT_OP_ATTR_FLOATS => AttrValue::Floats(pod_vec(&read_bytes(a, ty)?)),
        OrtOpAttrType::ORT_OP_ATTR_STRING => {
            AttrValue::String(String::from_utf8_lossy(&read_bytes(a, ty)?).trim_end_matches('\0').to_owned())
        }
        OrtOpAttrType::ORT_OP_ATTR_STRINGS => {
            let bytes = read_bytes(a, ty)?;
            let mut parts: Vec<String> =
                bytes.split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
            if bytes.last() == Some(&0) {
                parts.pop();
            }
            AttrValue::Strings(parts)
        }
        OrtOpAttrType::ORT_OP_ATTR_TENSOR => AttrValue::Tensor(read_tensor_attribute(a)?),
        OrtOpAttrType::ORT_OP_ATTR_GRAPH => match subgraphs.iter().find(|(n, _)| *n == name) {
            Some((_, g)) => AttrValue::Graph(Box::new(g.clone())),
            None => return Err(Error::new(format!("graph attribute '{name}' has no subgraph"))),
        },
        OrtOpAttrType::ORT_OP_ATTR_UNDEFINED => AttrValue::Undefined,
    };
    Ok(value)
}

fn read_tensor_attribute(a: *const OrtOpAttr) -> Result<TensorData> {
    let mut value: *mut OrtValue = null_mut();
    ort_call!(OpAttr_GetTensorAttributeAsOrtValue(a, &mut value))?;
    if value.is_null() {
        return Err(Error::new("a tensor attribute has no value"));
    }
    // SAFETY: `value` is a tensor ORT created for us; it is released right after the copy.
    let data = unsafe {
        tensor_ref(value).map(|t| TensorData { elem_type: t.elem_type, shape: t.shape, bytes: t.bytes.to_vec() })
    };
    // SAFETY: we own `value`.
    unsafe { (super::api().ReleaseValue)(value) };
    data
}

/// The node's subgraph attributes, by attribute name.
fn read_subgraphs(node: *const OrtNode) -> Result<Vec<(String, Subgraph)>> {
    let mut n = 0usize;
    ort_call!(Node_GetNumSubgraphs(node, &mut n))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut graphs = vec![null::<OrtGraph>(); n];
    let mut names = vec![null::<c_char>(); n];
    ort_call!(Node_GetSubgraphs(node, graphs.as_mut_ptr(), n, names.as_mut_ptr()))?;
    graphs.into_iter().zip(names).map(|(g, name)| Ok((c_str(name), read_subgraph(g)?))).collect()
}

/// Reads a subgraph: formal inputs and outputs, nodes (recursively), constant initializers.
pub(crate) fn read_subgraph(graph: *const OrtGraph) -> Result<Subgraph> {
    let inputs =
        read_list(|n| ort_call!(Graph_GetNumInputs(graph, n)), |p, n| ort_call!(Graph_GetInputs(graph, p, n)))?;
    let outputs =
        read_list(|n| ort_call!(Graph_GetNumOutputs(graph, n)), |p, n| ort_call!(Graph_GetOutputs(graph, p, n)))?;
    let inits = read_list(
        |n| ort_call!(Graph_GetNumInitializers(graph, n)),
        |p, n| ort_call!(Graph_GetInitializers(graph, p, n)),
    )?;
    let nodes = graph_nodes(graph)?.into_iter().map(read_node).collect::<Result<Vec<_>>>()?;
    let mut initializers = Vec::new();
    for v in inits {
        let info = read_value_info(v)?;
        let mut value: *const OrtValue = null();
        ort_call!(ValueInfo_GetInitializerValue(v, &mut value))?;
        if value.is_null() {
            continue;
        }
        // SAFETY: ORT keeps the initializer alive during this call. An initializer the EP cannot
        // hold (a string tensor) is left out: a node reading it declines on its type.
        if let Ok(t) = unsafe { tensor_ref(value) } {
            let data = TensorData { elem_type: t.elem_type, shape: t.shape, bytes: t.bytes.to_vec() };
            initializers.push((info.name, data));
        }
    }
    Ok(Subgraph {
        inputs: inputs.into_iter().map(read_value_info).collect::<Result<_>>()?,
        outputs: outputs.into_iter().map(read_value_info).collect::<Result<_>>()?,
        nodes,
        initializers,
    })
}

fn read_scalar<T: Default + Copy>(a: *const OrtOpAttr, ty: OrtOpAttrType) -> Result<T> {
    let mut v = T::default();
    let mut written = 0usize;
    ort_call!(ReadOpAttr(a, ty, (&mut v as *mut T).cast(), std::mem::size_of::<T>(), &mut written))?;
    Ok(v)
}

/// Reads an attribute's payload: a first call learns the size, a second fills the buffer.
fn read_bytes(a: *const OrtOpAttr, ty: OrtOpAttrType) -> Result<Vec<u8>> {
    let mut size = 0usize;
    // SAFETY: with a zero-length buffer ORT only reports the size needed (as an error status).
    let status = unsafe { (super::api().ReadOpAttr)(a, ty, null_mut(), 0, &mut size) };
    let _ = super::check_status(status, "ReadOpAttr");
    let mut buf = vec![0u8; size];
    if size > 0 {
        ort_call!(ReadOpAttr(a, ty, buf.as_mut_ptr().cast(), size, &mut size))?;
        buf.truncate(size);
    }
    Ok(buf)
}

fn pod_vec<T: Copy + Default>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut v = vec![T::default(); n];
    // SAFETY: `v` has room for exactly `n * size_of::<T>()` bytes; T is plain data (i64/f32).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<T>()) };
    v
}

/// Element type, shape and bytes of a tensor `OrtValue` (borrowed from ORT for the call).
pub(crate) struct TensorRef<'a> {
    pub elem_type: ElemType,
    pub shape: Vec<i64>,
    pub bytes: &'a [u8],
}

/// Borrows a tensor value's data.
///
/// # Safety
/// `value` must be a valid tensor `OrtValue` that outlives the returned reference.
pub(crate) unsafe fn tensor_ref<'a>(value: *const OrtValue) -> Result<TensorRef<'a>> {
    let mut elem = ort_sys::ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    let mut dims: *const i64 = null();
    let mut rank = 0usize;
    ort_call!(GetTensorElementTypeAndShapeDataReference(value, &mut elem, &mut dims, &mut rank))?;
    // SAFETY: ORT returns `rank` dims valid while the value lives.
    let shape = if rank == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(dims, rank) }.to_vec() };
    let mut size = 0usize;
    ort_call!(GetTensorSizeInBytes(value, &mut size))?;
    let mut data: *const std::ffi::c_void = null();
    ort_call!(GetTensorData(value, &mut data))?;
    let bytes = if size == 0 || data.is_null() {
        &[][..]
    } else {
        // SAFETY: the tensor's buffer holds `size` bytes while the value lives.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) }
    };
    Ok(TensorRef { elem_type: ElemType::from_onnx(elem as i32), shape, bytes })
}

/// Whether a host tensor is read in place rather than copied: on the CPU device, a non-empty
/// buffer aligned to 64 bytes (ORT's allocations) of a type MLX holds as is, unless the
/// session's `zero_copy` option is off.
pub(crate) fn reads_in_place(t: &TensorRef<'_>, zero_copy: bool) -> bool {
    zero_copy
        && !crate::mlx::default_device_is_gpu()
        && t.elem_type.to_mlx().is_some()
        && !t.bytes.is_empty()
        && (t.bytes.as_ptr() as usize).is_multiple_of(64)
}

/// A tensor as an MLX array: borrowed when `in_place` (decided by [`reads_in_place`]), else
/// copied. Sub-byte integer tensors (int4, uint4, int2, uint2) are unpacked, one element per byte.
///
/// # Safety
/// A borrowed array must be used only while `t`'s buffer lives (the current compute call),
/// with another reference held until its results are evaluated and copied out (see
/// [`Array::borrowed`]).
pub(crate) unsafe fn tensor_to_array(t: &TensorRef<'_>, in_place: bool) -> Result<Array> {
    let (bytes, dtype) = t.held()?;
    if in_place {
        // SAFETY: per the caller.
        return Ok(unsafe { Array::borrowed(t.bytes, &t.shape, dtype)? });
    }
    Ok(Array::from_bytes(&bytes, &t.shape, dtype)?)
}

impl TensorRef<'_> {
    /// The bytes and MLX type the EP holds this tensor as: as it is (float8 as uint8), or for
    /// the sub-byte integers unpacked to one element per byte.
    fn held(&self) -> Result<(std::borrow::Cow<'_, [u8]>, crate::mlx::Dtype)> {
        if let (Some(dtype), Some((bits, signed))) =
            (self.elem_type.unpacked_sub_byte(), self.elem_type.sub_byte_bits())
        {
            let count = self.shape.iter().product::<i64>().max(0) as usize;
            let bytes = crate::graph::unpack_bits(self.bytes, count, bits, signed);
            return Ok((bytes.into(), dtype));
        }
        let dtype = self
            .elem_type
            .held_as()
            .ok_or_else(|| Error::new(format!("element type {:?}, which MLX cannot hold", self.elem_type)))?;
        Ok((self.bytes.into(), dtype))
    }
}

/// The data of a constant initializer as an MLX array, shared with every other live plan of
/// the process that holds the same content (see [`crate::shared`]).
pub(crate) fn initializer_array(v: *const OrtValueInfo, name: &str) -> Result<std::sync::Arc<Array>> {
    let mut value: *const OrtValue = null();
    ort_call!(ValueInfo_GetInitializerValue(v, &mut value))?;
    if value.is_null() {
        return Err(Error::new(format!("initializer '{name}' has no value")));
    }
    // SAFETY: ORT keeps the initializer alive during Compile, when this is called.
    let t = unsafe { tensor_ref(value)? };
    let (bytes, dtype) = t.held().map_err(|e| Error::new(format!("initializer '{name}': {e}")))?;
    crate::shared::SharedConstants::global().get(&bytes, &t.shape, dtype)
}
