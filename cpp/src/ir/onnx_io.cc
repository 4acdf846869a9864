#include "graphtrain/onnx_io.h"

#include <google/protobuf/io/coded_stream.h>

#include <climits>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "graphtrain/error.h"
#include "graphtrain/file_util.h"
#include "graphtrain/strings.h"
#include "ir/onnx_subset.pb.h"

namespace graphtrain {
namespace pb = onnxpb;
namespace {

constexpr int64_t kMinOpset = 13;
constexpr int64_t kMaxOpset = 23;

// ---- reading ------------------------------------------------------------------------------------

struct Reader {
  std::string origin;
  std::string base_dir;
  std::unordered_map<std::string, std::string> external_files;  // cache: location -> bytes

  [[noreturn]] void fail(const std::string& what) const {
    throw ModelFileError("ONNX model '" + origin + "': " + what);
  }

  const std::string& external_file(const std::string& location) {
    auto it = external_files.find(location);
    if (it != external_files.end()) return it->second;
    if (location.empty() || location[0] == '/' || location.find("..") != std::string::npos)
      fail("external data location '" + location +
           "' must be a relative path inside the model's folder");
    std::string path = (base_dir.empty() ? std::string(".") : base_dir) + "/" + location;
    try {
      return external_files[location] = read_file(path);
    } catch (const ModelFileError& e) {
      fail(std::string("external data: ") + e.what());
    }
  }

  Tensor tensor(const pb::Tensor& t, const std::string& what) {
    std::string name = what + " '" + t.name() + "'";
    DType dtype = from_onnx(t.data_type());
    if (dtype == DType::kUndefined)
      fail(str_cat(name, " has data type ", onnx_type_name(t.data_type()), " (", t.data_type(),
                   "), which graphtrain does not support"));
    Shape shape(t.dims().begin(), t.dims().end());
    // Check the size against the data actually present before allocating anything.
    uint64_t count = 1;
    for (int64_t d : shape) {
      if (d < 0) fail(str_cat(name, " has a negative dimension in ", shape));
      if (d > 0 && count > (uint64_t{1} << 50) / static_cast<uint64_t>(d))
        fail(str_cat(name, " has an impossible shape ", shape));
      count *= static_cast<uint64_t>(d);
    }
    size_t n = static_cast<size_t>(count);
    size_t nbytes = n * dtype_size(dtype);
    bool external = t.data_location() == 1;
    size_t present = external ? 0
                     : t.has_raw_data()
                         ? t.raw_data().size()
                         : static_cast<size_t>(t.float_data_size() + t.double_data_size() +
                                               t.int64_data_size() + t.int32_data_size()) *
                               dtype_size(dtype);
    if (!external && nbytes > present)
      fail(str_cat(name, " of shape ", shape, " (", to_string(dtype), ") needs ", nbytes,
                   " bytes of data but holds ", present));
    const char* external_bytes = nullptr;
    if (external) {
      std::string location;
      int64_t offset = 0, length = -1;
      for (const auto& kv : t.external_data()) {
        if (kv.key() == "location")
          location = kv.value();
        else if (kv.key() == "offset")
          offset = std::atoll(kv.value().c_str());
        else if (kv.key() == "length")
          length = std::atoll(kv.value().c_str());
      }
      const std::string& file = external_file(location);
      if (length < 0) length = static_cast<int64_t>(nbytes);
      if (offset < 0 || static_cast<size_t>(length) != nbytes ||
          static_cast<size_t>(offset) > file.size() ||
          nbytes > file.size() - static_cast<size_t>(offset))
        fail(str_cat(name, ": external data at offset ", offset, ", length ", length, " in '",
                     location, "' (", file.size(), " bytes) does not hold ", nbytes, " bytes"));
      external_bytes = file.data() + offset;
    }
    Tensor out = Tensor::empty(dtype, shape);
    auto expect_count = [&](size_t got, const char* field) {
      if (got != n)
        fail(str_cat(name, " of shape ", shape, " needs ", n, " values but ", field, " holds ",
                     got));
    };
    if (external) {
      if (nbytes) std::memcpy(out.raw_data(), external_bytes, nbytes);
    } else if (t.has_raw_data()) {
      if (t.raw_data().size() != nbytes)
        fail(str_cat(name, " of shape ", shape, " needs ", nbytes, " bytes of raw data, has ",
                     t.raw_data().size()));
      if (nbytes) std::memcpy(out.raw_data(), t.raw_data().data(), nbytes);
    } else {
      switch (dtype) {
        case DType::kFloat32:
          expect_count(t.float_data_size(), "float_data");
          std::copy(t.float_data().begin(), t.float_data().end(), out.data<float>());
          break;
        case DType::kFloat64:
          expect_count(t.double_data_size(), "double_data");
          std::copy(t.double_data().begin(), t.double_data().end(), out.data<double>());
          break;
        case DType::kInt64:
          expect_count(t.int64_data_size(), "int64_data");
          std::copy(t.int64_data().begin(), t.int64_data().end(), out.data<int64_t>());
          break;
        case DType::kInt32:
          expect_count(t.int32_data_size(), "int32_data");
          std::copy(t.int32_data().begin(), t.int32_data().end(), out.data<int32_t>());
          break;
        case DType::kFloat16:
        case DType::kBFloat16:
          expect_count(t.int32_data_size(), "int32_data");
          for (size_t i = 0; i < n; ++i)
            out.data<uint16_t>()[i] = static_cast<uint16_t>(t.int32_data(static_cast<int>(i)));
          break;
        case DType::kInt8:
        case DType::kUInt8:
        case DType::kBool:
          expect_count(t.int32_data_size(), "int32_data");
          for (size_t i = 0; i < n; ++i)
            out.data<uint8_t>()[i] = static_cast<uint8_t>(t.int32_data(static_cast<int>(i)));
          break;
        case DType::kUndefined:
          break;
      }
    }
    return out;
  }

  TensorType type(const pb::ValueInfo& vi) {
    TensorType out;
    if (!vi.has_type()) return out;
    const pb::Type& t = vi.type();
    if (!t.has_tensor_type())
      fail("value '" + vi.name() +
           "' is not a tensor (sequence, map, optional or sparse values "
           "are not supported)");
    const auto& tt = t.tensor_type();
    out.dtype = from_onnx(tt.elem_type());
    if (out.dtype == DType::kUndefined && tt.elem_type() != 0)
      fail(str_cat("value '", vi.name(), "' has data type ", onnx_type_name(tt.elem_type()),
                   ", which graphtrain does not support"));
    if (tt.has_shape()) {
      SymShape shape;
      for (const auto& d : tt.shape().dim()) {
        if (d.has_dim_value())
          shape.emplace_back(d.dim_value());
        else if (d.has_dim_param() && !d.dim_param().empty())
          shape.push_back(SymDim::parse(d.dim_param()));
        else
          shape.push_back(SymDim::fresh("unk"));
      }
      out.shape = shape;
    }
    return out;
  }

  Attribute attribute(const pb::Attribute& a, const std::string& node) {
    if (!a.ref_attr_name().empty())
      fail("node '" + node + "': attribute '" + a.name() +
           "' refers to a function attribute; "
           "model-local functions are not supported");
    switch (a.type()) {
      case 1:
        return Attribute::of(a.f());
      case 2:
        return Attribute::of(static_cast<int64_t>(a.i()));
      case 3:
        return Attribute::of(a.s());
      case 4:
        return Attribute::of(tensor(a.t(), "attribute '" + a.name() + "' tensor"));
      case 6:
        return Attribute::of(std::vector<float>(a.floats().begin(), a.floats().end()));
      case 7:
        return Attribute::of(std::vector<int64_t>(a.ints().begin(), a.ints().end()));
      case 8:
        return Attribute::of(std::vector<std::string>(a.strings().begin(), a.strings().end()));
      case 5:
      case 10:
        fail("node '" + node + "': attribute '" + a.name() +
             "' is a subgraph; control flow (If, Loop, Scan) is not supported");
      default:
        fail(str_cat("node '", node, "': attribute '", a.name(), "' has type ", a.type(),
                     ", which graphtrain does not support"));
    }
  }

  Graph graph(const pb::Model& model) {
    Graph g;
    if (!model.has_graph()) fail("the file holds no graph (is it an ONNX model?)");
    if (!model.functions().empty())
      fail("the model defines local functions, which graphtrain does not support");
    g.ir_version = model.ir_version();
    for (const auto& op : model.opset_import()) g.opset_imports[op.domain()] = op.version();
    if (g.opset_imports.count("ai.onnx")) g.opset_imports[""] = g.opset_imports["ai.onnx"];
    int64_t opset = g.opset("");
    if (opset == 0) fail("the model imports no version of the standard ONNX operator set");
    if (opset < kMinOpset || opset > kMaxOpset)
      fail(str_cat("the model uses ONNX opset ", opset, "; graphtrain supports opsets ", kMinOpset,
                   " to ", kMaxOpset, " (re-export with opset_version in that range)"));
    const pb::Graph& pg = model.graph();
    g.name = pg.name().empty() ? "graph" : pg.name();
    if (!pg.sparse_initializer().empty()) fail("sparse initializers are not supported");

    std::unordered_set<std::string> init_names;
    for (const auto& t : pg.initializer()) {
      if (t.name().empty()) fail("an initializer has no name");
      if (!init_names.insert(t.name()).second)
        fail("initializer '" + t.name() + "' is defined twice");
      g.add_initializer(t.name(), tensor(t, "initializer"));
    }
    for (const auto& vi : pg.input()) {
      if (init_names.count(vi.name())) continue;  // IR < 4 lists initializers as inputs too
      if (vi.name().empty()) fail("a graph input has no name");
      if (g.find(vi.name())) fail("graph input '" + vi.name() + "' is defined twice");
      g.add_input(vi.name(), type(vi));
    }

    // Nodes in dependency order (the format asks for topological order; be lenient).
    const int n = pg.node_size();
    std::unordered_map<std::string, int> producer;
    for (int i = 0; i < n; ++i)
      for (const auto& out : pg.node(i).output()) {
        if (out.empty()) continue;
        if (g.find(out) || !producer.emplace(out, i).second)
          fail("value '" + out + "' is produced twice (node '" + pg.node(i).name() + "')");
      }
    std::vector<int> pending(static_cast<size_t>(n), 0);
    std::vector<std::vector<int>> users(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      const auto& node = pg.node(i);
      for (int k = 0; k < node.input_size(); ++k) {
        const std::string& in = node.input(k);
        if (in.empty() || g.find(in)) continue;
        auto it = producer.find(in);
        if (it == producer.end())
          fail(str_cat("node '", node.name(), "' (", node.op_type(), ") input ", k, " '", in,
                       "' is not a graph input, an initializer or any node's output"));
        ++pending[static_cast<size_t>(i)];
        users[static_cast<size_t>(it->second)].push_back(i);
      }
    }
    std::vector<int> ready;
    for (int i = n - 1; i >= 0; --i)
      if (pending[static_cast<size_t>(i)] == 0) ready.push_back(i);
    int added = 0;
    while (!ready.empty()) {
      int i = ready.back();
      ready.pop_back();
      const auto& pn = pg.node(i);
      std::vector<Value*> inputs;
      for (const auto& in : pn.input()) inputs.push_back(in.empty() ? nullptr : g.get(in));
      std::vector<std::string> outputs(pn.output().begin(), pn.output().end());
      std::string name = pn.name().empty() ? g.unique_name(pn.op_type()) : pn.name();
      std::string domain = pn.domain() == "ai.onnx" ? "" : pn.domain();
      if (pn.op_type().empty()) fail("node '" + name + "' has no op_type");
      Node* node = g.add_node(pn.op_type(), inputs, outputs, domain, name);
      for (const auto& a : pn.attribute()) node->attributes[a.name()] = attribute(a, name);
      for (const auto& kv : pn.metadata_props())
        if (kv.key() == "graphtrain.scope") node->scope = kv.value();
      ++added;
      for (auto it = users[static_cast<size_t>(i)].rbegin();
           it != users[static_cast<size_t>(i)].rend(); ++it)
        if (--pending[static_cast<size_t>(*it)] == 0) ready.push_back(*it);
    }
    if (added != n) {
      for (int i = 0; i < n; ++i)
        if (pending[static_cast<size_t>(i)] > 0)
          fail("the graph has a cycle through node '" + pg.node(i).name() + "' (" +
               pg.node(i).op_type() + ")");
    }
    for (const auto& vi : pg.value_info()) {
      Value* v = g.find(vi.name());
      if (v && !v->is_initializer()) v->type = type(vi);
    }
    for (const auto& vi : pg.output()) {
      Value* v = g.find(vi.name());
      if (!v) fail("graph output '" + vi.name() + "' is not produced by any node or input");
      TensorType t = type(vi);
      if (t.dtype != DType::kUndefined || t.shape) v->type = t;
      g.add_output(v);
    }
    return g;
  }
};

// ---- writing ------------------------------------------------------------------------------------

void write_tensor(const Tensor& t, const std::string& name, pb::Tensor* out) {
  out->set_name(name);
  out->set_data_type(to_onnx(t.dtype()));
  for (int64_t d : t.shape()) out->add_dims(d);
  out->set_raw_data(t.raw_data(), t.nbytes());  // raw data is little-endian, as on this host
}

void write_type(const TensorType& type, pb::ValueInfo* out) {
  auto* tt = out->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(to_onnx(type.dtype));
  if (!type.shape) return;
  auto* shape = tt->mutable_shape();
  for (const SymDim& d : *type.shape) {
    auto* dim = shape->add_dim();
    if (auto c = d.constant())
      dim->set_dim_value(*c);
    else
      dim->set_dim_param(d.to_string());
  }
}

void write_attribute(const std::string& name, const Attribute& a, pb::Attribute* out) {
  out->set_name(name);
  switch (a.kind) {
    case Attribute::Kind::kFloat:
      out->set_type(1);
      out->set_f(a.f);
      break;
    case Attribute::Kind::kInt:
      out->set_type(2);
      out->set_i(a.i);
      break;
    case Attribute::Kind::kString:
      out->set_type(3);
      out->set_s(a.s);
      break;
    case Attribute::Kind::kTensor:
      out->set_type(4);
      write_tensor(a.t, "", out->mutable_t());
      break;
    case Attribute::Kind::kFloats:
      out->set_type(6);
      for (float f : a.floats) out->add_floats(f);
      break;
    case Attribute::Kind::kInts:
      out->set_type(7);
      for (int64_t i : a.ints) out->add_ints(i);
      break;
    case Attribute::Kind::kStrings:
      out->set_type(8);
      for (const auto& s : a.strings) out->add_strings(s);
      break;
  }
}

pb::Model to_proto(const Graph& g) {
  pb::Model m;
  bool scoped = false;
  for (Node* n : g.nodes()) scoped |= !n->scope.empty();
  m.set_ir_version(std::max<int64_t>(g.ir_version, scoped ? 10 : 8));
  m.set_producer_name("graphtrain");
  m.set_producer_version("0.1.0");
  std::map<std::string, int64_t> opsets = g.opset_imports;
  if (!opsets.count("")) opsets[""] = 18;
  for (Node* n : g.nodes())
    if (!n->domain.empty() && !opsets.count(n->domain)) opsets[n->domain] = 1;
  for (const auto& [domain, version] : opsets) {
    auto* op = m.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }
  pb::Graph* pg = m.mutable_graph();
  pg->set_name(g.name);
  for (Value* v : g.initializers()) write_tensor(v->initializer, v->name(), pg->add_initializer());
  for (Value* v : g.inputs()) {
    auto* vi = pg->add_input();
    vi->set_name(v->name());
    write_type(v->type, vi);
  }
  std::unordered_set<const Value*> io(g.inputs().begin(), g.inputs().end());
  for (Node* n : g.topological_order()) {
    auto* pn = pg->add_node();
    pn->set_name(n->name);
    pn->set_op_type(n->op_type);
    if (!n->domain.empty()) pn->set_domain(n->domain);
    for (Value* in : n->inputs()) pn->add_input(in ? in->name() : "");
    for (Value* out : n->outputs()) pn->add_output(out ? out->name() : "");
    for (const auto& [name, a] : n->attributes) write_attribute(name, a, pn->add_attribute());
    if (!n->scope.empty()) {
      auto* kv = pn->add_metadata_props();
      kv->set_key("graphtrain.scope");
      kv->set_value(n->scope);
    }
    for (Value* out : n->outputs()) {
      if (!out || out->type.dtype == DType::kUndefined) continue;
      bool is_output = false;
      for (Value* o : g.outputs()) is_output |= o == out;
      if (is_output) continue;
      auto* vi = pg->add_value_info();
      vi->set_name(out->name());
      write_type(out->type, vi);
    }
  }
  for (Value* v : g.outputs()) {
    auto* vi = pg->add_output();
    vi->set_name(v->name());
    write_type(v->type, vi);
  }
  return m;
}

}  // namespace

Graph parse_onnx(const std::string& bytes, const std::string& origin, const std::string& base_dir) {
  pb::Model model;
  google::protobuf::io::CodedInputStream stream(
      reinterpret_cast<const uint8_t*>(bytes.data()),
      static_cast<int>(std::min<size_t>(bytes.size(), INT_MAX)));
  stream.SetTotalBytesLimit(INT_MAX);
  if (bytes.empty() || !model.ParseFromCodedStream(&stream) || !stream.ConsumedEntireMessage())
    throw ModelFileError("ONNX model '" + origin + "': the file is not a valid ONNX protobuf (" +
                         std::to_string(bytes.size()) + " bytes; truncated or corrupted?)");
  Reader reader{origin, base_dir, {}};
  return reader.graph(model);
}

Graph load_onnx(const std::string& path) {
  return parse_onnx(read_file(path), path, parent_dir(path));
}

std::string serialize_onnx(const Graph& g) {
  std::string out;
  if (!to_proto(g).SerializeToString(&out))
    throw ModelFileError("graph '" + g.name +
                         "' cannot be serialized (over 2 GB? save it to a file "
                         "with external data)");
  return out;
}

void save_onnx(const Graph& g, const std::string& path, const SaveOptions& options) {
  pb::Model m = to_proto(g);
  size_t total = 0;
  for (const auto& t : m.graph().initializer()) total += t.raw_data().size();
  size_t threshold = options.external_data_threshold;
  if (threshold == 0 && options.auto_external_over_2gb && total > (size_t{1} << 30) * 3 / 2)
    threshold = 1024;
  if (threshold > 0) {
    std::string data_name = file_name(path) + ".data";
    std::string data;
    for (auto& t : *m.mutable_graph()->mutable_initializer()) {
      if (t.raw_data().size() < threshold) continue;
      size_t offset = (data.size() + 63) / 64 * 64;  // aligned for memory mapping
      data.resize(offset, '\0');
      data += t.raw_data();
      t.clear_raw_data();
      t.set_data_location(1);
      auto add = [&](const char* k, const std::string& v) {
        auto* kv = t.add_external_data();
        kv->set_key(k);
        kv->set_value(v);
      };
      add("location", data_name);
      add("offset", std::to_string(offset));
      add("length", std::to_string(data.size() - offset));
    }
    // The data first: a model never points at data that is not there yet.
    write_file_atomic(parent_dir(path) + "/" + data_name, data);
  }
  std::string bytes;
  if (!m.SerializeToString(&bytes))
    throw ModelFileError("cannot serialize the model for '" + path + "' (over 2 GB)");
  write_file_atomic(path, bytes);
}

}  // namespace graphtrain
