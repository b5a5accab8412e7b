//! The ONNX frontend: protobuf messages, tensor conversion, and the graph importer.

pub mod import;
pub mod proto;
pub mod tensor;

use crate::error::{FrontendError, Result};
use bytes::Bytes;
use import::ImportOptions;
use kiln_ir::{Graph, Tensor};
use prost::Message;
use std::path::{Path, PathBuf};

/// An imported model: the IR graph and what the file said about itself.
#[derive(Debug)]
pub struct Model {
    pub graph: Graph,
    /// Default-domain opset version.
    pub opset: i64,
    pub ir_version: i64,
    pub producer: String,
    /// Every `(domain, version)` the model imports.
    pub opset_imports: Vec<(String, i64)>,
}

/// Reads and decodes an ONNX file without importing it.
pub fn read_model_proto(path: &Path) -> Result<proto::ModelProto> {
    let bytes = crate::files::read_regular(path).map_err(|source| FrontendError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode_model(Bytes::from(bytes), path)
}

fn decode_model(bytes: Bytes, path: &Path) -> Result<proto::ModelProto> {
    let decode_err = |msg: String| FrontendError::Decode {
        path: path.to_path_buf(),
        msg,
    };
    if bytes.is_empty() {
        return Err(decode_err("the file is empty".into()));
    }
    let model = proto::ModelProto::decode(bytes).map_err(|e| {
        decode_err(format!(
            "protobuf decoding failed ({e}); the file is truncated or not an ONNX model"
        ))
    })?;
    if model.graph.is_none() {
        return Err(decode_err("it has no graph (is it an ONNX model?)".into()));
    }
    if model.ir_version <= 0 {
        return Err(decode_err("it has no IR version (is it an ONNX model?)".into()));
    }
    Ok(model)
}

/// The model's default-domain opset, checked against what kiln supports.
pub fn default_opset(model: &proto::ModelProto) -> Result<i64> {
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        // IR version 3+ requires an opset import; older files implied opset 1.
        .unwrap_or(1);
    if opset > import::MAX_OPSET {
        return Err(FrontendError::Model(format!(
            "opset {opset} is newer than the newest kiln supports ({})",
            import::MAX_OPSET
        )));
    }
    if opset < import::MIN_OPSET {
        return Err(FrontendError::Model(format!(
            "opset {opset} is older than the oldest kiln supports ({}); upgrade the model with onnx.version_converter",
            import::MIN_OPSET
        )));
    }
    Ok(opset)
}

/// Loads an ONNX model file (external data is read relative to its folder) and imports it.
pub fn load_model(path: &Path, opts: &ImportOptions) -> Result<Model> {
    let model = read_model_proto(path)?;
    import_model(&model, crate::files::model_folder(path), opts)
}

/// Decodes and imports a model held in memory (a fuzzer's input, an embedded model); external
/// data is looked up in `base_dir`, and errors name the model `<memory>`.
pub fn import_model_bytes(bytes: &[u8], base_dir: PathBuf, opts: &ImportOptions) -> Result<Model> {
    let model = decode_model(Bytes::copy_from_slice(bytes), Path::new("<memory>"))?;
    import_model(&model, base_dir, opts)
}

/// Imports a decoded model; `base_dir` is where external data files are looked up.
pub fn import_model(model: &proto::ModelProto, base_dir: PathBuf, opts: &ImportOptions) -> Result<Model> {
    let opset = default_opset(model)?;
    let g = model
        .graph
        .as_ref()
        .ok_or_else(|| FrontendError::Model("the model has no graph".into()))?;
    let mut ext = tensor::ExternalData::new(base_dir);
    let graph = import::import_graph(g, &model.opset_import, opset, &mut ext, opts)?;
    Ok(Model {
        graph,
        opset,
        ir_version: model.ir_version,
        producer: format!("{} {}", model.producer_name, model.producer_version)
            .trim()
            .to_string(),
        opset_imports: model
            .opset_import
            .iter()
            .map(|o| (o.domain.clone(), o.version))
            .collect(),
    })
}

/// The type of every value of a decoded model's main graph that kiln can type, by ONNX name
/// (see [`import::value_types`]); `base_dir` is where external data files are looked up.
pub fn value_types(
    model: &proto::ModelProto,
    base_dir: PathBuf,
    opts: &ImportOptions,
) -> Result<std::collections::HashMap<String, kiln_ir::TensorType>> {
    let opset = default_opset(model)?;
    let g = model
        .graph
        .as_ref()
        .ok_or_else(|| FrontendError::Model("the model has no graph".into()))?;
    let mut ext = tensor::ExternalData::new(base_dir);
    import::value_types(g, &model.opset_import, opset, &mut ext, opts)
}

/// Serializes a model (e.g. one built or edited through [`proto`]) to ONNX protobuf bytes.
pub fn encode_model(model: &proto::ModelProto) -> Vec<u8> {
    model.encode_to_vec()
}

/// Reads a serialized `TensorProto` (`.pb`, as in ONNX test data): its name and value.
pub fn read_tensor_pb(path: &Path) -> Result<(String, Tensor)> {
    let bytes = crate::files::read_regular(path).map_err(|source| FrontendError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let t = proto::TensorProto::decode(Bytes::from(bytes)).map_err(|e| FrontendError::Decode {
        path: path.to_path_buf(),
        msg: format!("not a TensorProto: {e}"),
    })?;
    let value = tensor::tensor_from_proto(&t, None)?;
    Ok((t.name, value))
}
