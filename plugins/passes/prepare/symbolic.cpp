// Symbolic shape inference: ONNX shape inference does not follow shapes that
// the graph computes (Shape -> Gather -> Concat -> Reshape, as transformer
// exports do for `batch` and `sequence`). This pass evaluates those small
// integer tensors symbolically, declares the shapes of the Reshape, Expand and
// ConstantOfShape outputs they determine, and lets ONNX inference carry them
// on, until nothing more is learnt.
#include "passes.hpp"

namespace prepare_passes {

namespace {

// One dimension: a number, a symbol (dim_param) or unknown.
struct Dim {
    int64_t value = -1;
    std::string symbol;
    bool known() const { return value >= 0 || !symbol.empty(); }
    bool operator==(const Dim&) const = default;
};
using Dims = std::vector<Dim>;

// Longer shape tensors are not shapes: they are left alone.
constexpr int64_t kMaxShapeLength = 16;

std::map<std::string, Dims> declared_shapes(const onnx::GraphProto& graph) {
    std::map<std::string, Dims> out;
    for (const auto* list : {&graph.input(), &graph.value_info(), &graph.output()})
        for (const auto& v : *list) {
            if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) continue;
            Dims dims;
            for (const auto& d : v.type().tensor_type().shape().dim())
                dims.push_back(d.has_dim_value() ? Dim{d.dim_value(), {}} : Dim{-1, d.dim_param()});
            out[v.name()] = std::move(dims);
        }
    return out;
}

// Evaluates int64 shape tensors as lists of dimensions.
class ShapeValues {
  public:
    ShapeValues(const onnx::GraphProto& graph, std::map<std::string, Dims> shapes)
        : index_(graph), shapes_(std::move(shapes)) {}

    const Dims* get(const std::string& name) {
        if (auto it = values_.find(name); it != values_.end()) return &it->second;
        const auto t = vaiq::constant_tensor(index_, name);
        if (!t || t->size() > kMaxShapeLength) return nullptr;
        Dims dims;
        if (t->type() == vaiq::DataType::Int64)
            for (auto v : t->data<int64_t>()) dims.push_back({v, {}});
        else if (t->type() == vaiq::DataType::Int32)
            for (auto v : t->data<int32_t>()) dims.push_back({v, {}});
        else
            return nullptr;
        return &(values_[name] = std::move(dims));
    }

    std::optional<Dims> get_copy(const std::string& name) {
        const auto* v = get(name);
        return v ? std::optional<Dims>(*v) : std::nullopt;
    }

    const Dims* shape(const std::string& name) const {
        auto it = shapes_.find(name);
        return it == shapes_.end() ? nullptr : &it->second;
    }

    void evaluate(const onnx::NodeProto& node) {
        if (!vaiq::is_default_domain(node) || node.output_size() < 1) return;
        if (auto v = compute(node)) values_[node.output(0)] = std::move(*v);
    }

  private:
    std::optional<Dims> compute(const onnx::NodeProto& node) {
        const auto& op = node.op_type();
        if (op == "Constant") {
            const auto* value = vaiq::find_attribute(node, "value");
            if (!value || !value->has_t()) return std::nullopt;
            onnx::GraphProto holder;
            *holder.add_initializer() = value->t();
            holder.mutable_initializer(0)->set_name(node.output(0));
            return ShapeValues(holder, {}).get_copy(node.output(0));
        }
        if (op == "Shape") {
            const auto* s = shape(node.input(0));
            if (!s) return std::nullopt;
            const auto rank = static_cast<int64_t>(s->size());
            auto clamp = [&](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
            const auto start = clamp(vaiq::int_attribute(node, "start", 0));
            const auto end = clamp(vaiq::int_attribute(node, "end", rank));
            return Dims(s->begin() + start, s->begin() + std::max(start, end));
        }
        if (op == "Identity" || op == "Cast" || op == "Squeeze" || op == "Unsqueeze") {
            const auto* v = get(node.input(0));
            if (!v) return std::nullopt;
            return *v;
        }
        if (op == "Concat") {
            Dims out;
            for (const auto& in : node.input()) {
                const auto* v = get(in);
                if (!v) return std::nullopt;
                out.insert(out.end(), v->begin(), v->end());
            }
            return out;
        }
        if (op == "Gather") {
            const auto* data = get(node.input(0));
            const auto* idx = node.input_size() > 1 ? get(node.input(1)) : nullptr;
            if (!data || !idx || vaiq::int_attribute(node, "axis", 0) != 0) return std::nullopt;
            Dims out;
            for (const auto& i : *idx) {
                auto k = i.value < 0 ? i.value + static_cast<int64_t>(data->size()) : i.value;
                if (!i.symbol.empty() || k < 0 || k >= static_cast<int64_t>(data->size())) return std::nullopt;
                out.push_back((*data)[k]);
            }
            return out;
        }
        if (op == "Slice" && node.input_size() >= 3) {
            const auto* data = get(node.input(0));
            const auto* starts = get(node.input(1));
            const auto* ends = get(node.input(2));
            const Dims* steps = node.input_size() > 4 && !node.input(4).empty() ? get(node.input(4)) : nullptr;
            if (!data || !starts || !ends || starts->size() != 1 || ends->size() != 1) return std::nullopt;
            if ((steps && (steps->size() != 1 || (*steps)[0].value != 1))) return std::nullopt;
            const auto n = static_cast<int64_t>(data->size());
            auto clamp = [&](int64_t v) { return std::clamp(v < 0 ? v + n : v, int64_t{0}, n); };
            const auto b = clamp((*starts)[0].value), e = clamp((*ends)[0].value);
            return Dims(data->begin() + b, data->begin() + std::max(b, e));
        }
        if ((op == "Mul" || op == "Add") && node.input_size() == 2) {
            const auto* a = get(node.input(0));
            const auto* c = get(node.input(1));
            if (!a || !c || a->size() != c->size()) return std::nullopt;
            Dims out;
            for (size_t i = 0; i < a->size(); ++i) {
                const auto &x = (*a)[i], &y = (*c)[i];
                const int64_t identity = op == "Mul" ? 1 : 0;
                if (x.value >= 0 && y.value >= 0)
                    out.push_back({op == "Mul" ? x.value * y.value : x.value + y.value, {}});
                else if (y.value == identity)
                    out.push_back(x);
                else if (x.value == identity)
                    out.push_back(y);
                else
                    out.push_back({});
            }
            return out;
        }
        return std::nullopt;
    }

    vaiq::GraphIndex index_;
    std::map<std::string, Dims> shapes_;
    std::map<std::string, Dims> values_;
};

// The output shape a computed shape value determines, for the ops that take one.
std::optional<Dims> output_shape(const onnx::NodeProto& node, ShapeValues& values) {
    const auto& op = node.op_type();
    if (op == "ConstantOfShape") {
        const auto* v = values.get(node.input(0));
        return v ? std::optional<Dims>(*v) : std::nullopt;
    }
    if (node.input_size() < 2) return std::nullopt;
    const auto* target = values.get(node.input(1));
    const auto* in = values.shape(node.input(0));
    if (!target) return std::nullopt;
    if (op == "Reshape") {
        Dims out = *target;
        const bool allow_zero = vaiq::int_attribute(node, "allowzero", 0) != 0;
        for (size_t i = 0; i < out.size(); ++i) {
            if (out[i].value == 0 && !allow_zero)
                out[i] = in && i < in->size() ? (*in)[i] : Dim{};
            else if (out[i].value == -1 && out[i].symbol.empty())
                out[i] = Dim{};  // inferred below when numeric
        }
        // One -1 with every other dimension numeric: the element count tells it.
        int unknown = 0;
        int64_t known_product = 1, total = 1;
        for (const auto& d : out) d.value >= 0 ? known_product *= d.value : ++unknown;
        const bool numeric_input = in && std::all_of(in->begin(), in->end(), [](const Dim& d) { return d.value >= 0; });
        if (numeric_input) {
            for (const auto& d : *in) total *= d.value;
            for (auto& d : out)
                if (!d.known() && unknown == 1 && known_product > 0) d.value = total / known_product;
        }
        return out;
    }
    if (op == "Expand" && in) {
        Dims out(std::max(in->size(), target->size()));
        for (size_t i = 0; i < out.size(); ++i) {
            const size_t from_end = out.size() - 1 - i;
            const Dim a = from_end < in->size() ? (*in)[in->size() - 1 - from_end] : Dim{1, {}};
            const Dim b = from_end < target->size() ? (*target)[target->size() - 1 - from_end] : Dim{1, {}};
            out[i] = b.value == 1 ? a : a.value == 1 ? b : (a.known() ? a : b);
        }
        return out;
    }
    return std::nullopt;
}

// Declares `dims` for `tensor` where its shape is not (fully) known yet.
bool declare(onnx::GraphProto& graph, const std::string& tensor, const Dims& dims,
             const std::map<std::string, Dims>& known, int32_t elem_type) {
    if (std::none_of(dims.begin(), dims.end(), [](const Dim& d) { return d.known(); })) return false;
    if (auto it = known.find(tensor); it != known.end()) {
        const auto& have = it->second;
        const auto known_count = [](const Dims& d) {
            return std::count_if(d.begin(), d.end(), [](const Dim& x) { return x.known(); });
        };
        if (have.size() == dims.size() && known_count(have) >= known_count(dims)) return false;
    }
    onnx::ValueInfoProto* info = nullptr;
    for (auto* list : {graph.mutable_value_info(), graph.mutable_output()})
        for (auto& v : *list)
            if (v.name() == tensor) info = &v;
    if (!info) {
        info = graph.add_value_info();
        info->set_name(tensor);
    }
    auto* type = info->mutable_type()->mutable_tensor_type();
    if (type->elem_type() == 0) type->set_elem_type(elem_type);
    auto* shape = type->mutable_shape();
    shape->clear_dim();
    for (const auto& d : dims) {
        auto* dim = shape->add_dim();
        if (d.value >= 0)
            dim->set_dim_value(d.value);
        else if (!d.symbol.empty())
            dim->set_dim_param(d.symbol);
    }
    return true;
}

}  // namespace

void SymbolicShapeInference::configure(const vaiq::Options& options) {
    options_.symbolic = true;
    options_.auto_merge = options.get_bool("auto_merge");
    options_.guess_output_rank = options.get_bool("guess_output_rank");
}

bool SymbolicShapeInference::run(vaiq::Model& model) {
    auto& graph = model.graph();
    int learnt = 0;
    for (int round = 0; round < 16; ++round) {
        learnt += vaiq::store_inferred_shapes(model, options_);
        const auto shapes = declared_shapes(graph);
        const auto types = vaiq::infer_types(model);
        ShapeValues values(graph, shapes);
        int declared = 0;
        for (int n : vaiq::topological_order(graph)) {
            const auto node = graph.node(n);
            values.evaluate(node);
            if (node.op_type() != "Reshape" && node.op_type() != "Expand" && node.op_type() != "ConstantOfShape")
                continue;
            const auto dims = output_shape(node, values);
            if (!dims) continue;
            int32_t type = onnx::TensorProto::FLOAT;  // ConstantOfShape's default
            if (node.op_type() != "ConstantOfShape") {
                const auto it = types.find(node.input(0));
                if (it == types.end()) continue;
                type = static_cast<int32_t>(it->second);
            } else if (const auto* value = vaiq::find_attribute(node, "value"); value && value->has_t()) {
                type = value->t().data_type();
            }
            declared += declare(graph, node.output(0), *dims, shapes, type);
        }
        learnt += declared;
        if (declared == 0) break;
    }
    vaiq::log_debug("infer_symbolic_shapes: {} tensors gained or refined a shape", learnt);
    return learnt > 0;
}

}  // namespace prepare_passes
