#include "test_support.hpp"

#include <functional>

#include "pipeline/pipeline.hpp"
#include "recipe/recipe.hpp"
#include "vaiq/error.hpp"

#include <gtest/gtest.h>
#include <png.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>

namespace fs = std::filesystem;

namespace vaiq::test {

namespace {
std::string join_strings(const std::vector<std::string>& items) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
    return out;
}
}  // namespace

std::string slurp(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

CommandResult run_command(const std::string& command) {
    const auto dir = temp_dir();
    const std::string cmd = command + " > " + (dir / "out").string() + " 2> " + (dir / "err").string() + " < /dev/null";
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir / "out"), slurp(dir / "err")};
}

namespace {
std::vector<std::string>& args() {
    static std::vector<std::string> a;
    return a;
}

// Removes the test's temporary folders when the process ends.
struct TempRoot {
    fs::path path;
    TempRoot() {
        std::random_device r;
        path = fs::temp_directory_path() / ("vaiq-test-" + std::to_string(::getpid()) + "-" + std::to_string(r()));
        fs::create_directories(path);
    }
    ~TempRoot() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};
}  // namespace

const std::vector<std::string>& extra_args() { return args(); }

PluginRegistry registry_with_test_plugin() {
    if (args().empty()) throw std::runtime_error("this test needs the plugin library's path as its first argument");
    PluginRegistry registry;
    registry.load_library(args().front());
    return registry;
}

PluginRegistry registry_with_installed_plugins() {
    auto registry = registry_with_test_plugin();
    registry.load_default_paths();
    return registry;
}

Model matmul_model(const Tensor& w, int64_t rows, int64_t opset) {
    GraphBuilder b(opset);
    b.input("x", {1, rows, w.shape()[0]}).output("y", {1, rows, w.shape()[1]});
    b.initializer("w", w);
    b.node("MatMul", {"x", "w"}, {"y"});
    return b.build();
}

fs::path npm_modules() {
    const char* home = std::getenv("VAIQ_ORT_HOME");
    const fs::path base = home ? fs::path(home) : fs::path(std::getenv("HOME")) / ".cache/vaiq/onnxruntime-node";
    return base / "node_modules";
}

fs::path temp_dir() {
    static TempRoot root;
    static int counter = 0;
    auto dir = root.path / std::to_string(counter++);
    fs::create_directories(dir);
    return dir;
}

fs::path write_text(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path;
}

TestAlgorithmContext::TestAlgorithmContext(const Model& model, DataReader& data, QuantPlan given, TestEmitter emit)
    : plan(std::move(given)), context([&] {
          AlgorithmInputs in(model, plan, data, 1);
          in.fitted_weights = [this] { return fitted; };
          in.emit = emit ? std::move(emit) : [](const QuantPlan&, const std::map<std::string, Tensor>&) -> Model {
              throw std::runtime_error("no format in a test context");
          };
          in.keep_fitted = [this](std::map<std::string, Tensor> weights) {
              for (auto& [name, value] : weights) fitted.insert_or_assign(name, std::move(value));
          };
          in.keep_parameters = [this](const std::string& tensor, const QuantParams& params) {
              parameters[tensor] = params;
          };
          in.report = [this](nlohmann::json section) { report = std::move(section); };
          in.quantized_nodes = [] { return std::set<std::string>(); };
          in.default_spec = [](TensorRole) { return QuantSpec(); };
          in.replace_model = [this](Model m) { replaced = std::move(m); };
          in.replace_initializers = [this](std::map<std::string, Tensor> values) {
              for (auto& [name, value] : values) initializers.insert_or_assign(name, std::move(value));
          };
          return in;
      }()) {}

nlohmann::json run_recipe_in(const fs::path& dir, PluginRegistry& registry, const std::string& yaml,
                             const std::string& file) {
    const auto recipe =
        load_recipe(write_text(dir / file, "recipe_version: 1\nmodel_input: in.onnx\nmodel_output: out.onnx\n" + yaml));
    return run_pipeline(recipe, registry, {}).report_json;
}

GraphBuilder::GraphBuilder(int64_t opset) {
    proto_.set_ir_version(8);
    proto_.set_producer_name("vaiq-tests");
    auto* op = proto_.add_opset_import();
    op->set_domain("");
    op->set_version(opset);
    proto_.mutable_graph()->set_name("test");
}

namespace {
void fill_value_info(onnx::ValueInfoProto* info, const std::string& name, const std::vector<int64_t>& shape,
                     DataType type) {
    info->set_name(name);
    auto* t = info->mutable_type()->mutable_tensor_type();
    t->set_elem_type(static_cast<int32_t>(type));
    auto* s = t->mutable_shape();
    for (auto d : shape) s->add_dim()->set_dim_value(d);
}
}  // namespace

GraphBuilder& GraphBuilder::input(const std::string& name, std::vector<int64_t> shape, DataType type) {
    fill_value_info(proto_.mutable_graph()->add_input(), name, shape, type);
    return *this;
}

GraphBuilder& GraphBuilder::output(const std::string& name, std::vector<int64_t> shape, DataType type) {
    fill_value_info(proto_.mutable_graph()->add_output(), name, shape, type);
    return *this;
}

GraphBuilder& GraphBuilder::initializer(const std::string& name, const Tensor& value) {
    *proto_.mutable_graph()->add_initializer() = value.to_proto(name);
    return *this;
}

onnx::NodeProto& GraphBuilder::node(const std::string& op_type, std::vector<std::string> inputs,
                                    std::vector<std::string> outputs, const std::string& name) {
    auto* n = proto_.mutable_graph()->add_node();
    n->set_op_type(op_type);
    n->set_name(name.empty() ? op_type + "_" + std::to_string(proto_.graph().node_size()) : name);
    for (auto& i : inputs) n->add_input(i);
    for (auto& o : outputs) n->add_output(o);
    return *n;
}

Model GraphBuilder::build() const { return Model(proto_); }

Tensor ramp(std::vector<int64_t> shape, float start, float step) {
    Tensor t(DataType::Float, std::move(shape));
    auto data = t.mutable_data<float>();
    for (size_t i = 0; i < data.size(); ++i) data[i] = start + step * static_cast<float>(i);
    return t;
}

void set_ints_attribute(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& values) {
    auto* a = node.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto v : values) a->add_ints(v);
}

std::string dump_graph(const Model& model) {
    std::string out;
    for (const auto& n : model.graph().node()) {
        std::vector<std::string> ins(n.input().begin(), n.input().end());
        std::vector<std::string> outs(n.output().begin(), n.output().end());
        const std::string domain = n.domain().empty() ? "" : n.domain() + ".";
        out += domain + n.op_type() + "(" + join_strings(ins) + ") -> " + join_strings(outs) + "\n";
    }
    std::vector<std::string> inits;
    for (const auto& init : model.graph().initializer()) {
        std::vector<std::string> dims;
        for (auto d : init.dims()) dims.push_back(std::to_string(d));
        inits.push_back(init.name() + ": " + data_type_name(static_cast<DataType>(init.data_type())) + "[" +
                        join_strings(dims) + "]");
    }
    std::sort(inits.begin(), inits.end());
    for (const auto& i : inits) out += i + "\n";
    return out;
}

std::string compare_golden(const std::filesystem::path& golden, const std::string& actual) {
    if (const char* update = std::getenv("VAIQ_UPDATE_GOLDEN"); update && std::string(update) == "1") {
        write_text(golden, actual);
        return "";
    }
    const auto expected = slurp(golden);
    if (expected == actual) return "";
    return "golden file " + golden.string() + " (set VAIQ_UPDATE_GOLDEN=1 to rewrite it)\nexpected:\n" + expected +
           "actual:\n" + actual;
}

Model conv_relu_model(int64_t opset) {
    GraphBuilder b(opset);
    b.input("x", {1, 2, 4, 4})
        .output("y", {1, 3, 4, 4})
        .initializer("w", ramp({3, 2, 3, 3}, -0.5f, 0.02f))
        .initializer("b", ramp({3}, 0.1f, 0.1f));
    auto& conv = b.node("Conv", {"x", "w", "b"}, {"conv_out"}, "conv");
    set_ints_attribute(conv, "pads", {1, 1, 1, 1});
    b.node("Relu", {"conv_out"}, {"y"}, "relu");
    return b.build();
}

Model swish_model() {
    GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4});
    b.initializer("w", ramp({3, 2, 1, 1}, -1.8f, 0.6f));
    b.node("Conv", {"x", "w"}, {"c"});
    b.node("Sigmoid", {"c"}, {"s"});
    b.node("Mul", {"c", "s"}, {"y"});
    return b.build();
}

void add_spelled_layer_norm(GraphBuilder& b, const std::string& x, const std::string& y, int64_t width,
                            const std::string& prefix) {
    std::vector<float> gamma, beta;
    for (int64_t i = 0; i < width; ++i) {
        gamma.push_back(0.5f + 0.1f * static_cast<float>(i));
        beta.push_back(0.2f * static_cast<float>(i) - 0.3f);
    }
    b.initializer(prefix + "two", ramp({}, 2.0f)).initializer(prefix + "eps", ramp({}, 1e-5f));
    b.initializer(prefix + "gamma", Tensor::from_values<float>({width}, gamma));
    b.initializer(prefix + "beta", Tensor::from_values<float>({width}, beta));
    auto node = [&](const std::string& op, const std::string& name, std::vector<std::string> inputs,
                    const std::string& out = "") -> onnx::NodeProto& {
        for (auto& in : inputs)
            if (in != x && in.rfind(prefix, 0) != 0) in = prefix + in + "_out";
        return b.node(op, std::move(inputs), {out.empty() ? prefix + name + "_out" : out}, prefix + name);
    };
    set_ints_attribute(node("ReduceMean", "ReduceMean", {x}), "axes", {-1});
    node("Sub", "Sub", {x, "ReduceMean"});
    node("Pow", "Pow", {"Sub", prefix + "two"});
    set_ints_attribute(node("ReduceMean", "ReduceMean_1", {"Pow"}), "axes", {-1});
    node("Add", "Add", {"ReduceMean_1", prefix + "eps"});
    node("Sqrt", "Sqrt", {"Add"});
    node("Div", "Div", {"Sub", "Sqrt"});
    node("Mul", "Mul", {"Div", prefix + "gamma"});
    node("Add", "Add_1", {"Mul", prefix + "beta"}, y);
}

TensorQuant quant_entry(std::string tensor, TensorRole role, QuantType type, std::vector<float> scale,
                        std::vector<int64_t> zero_point, int axis) {
    TensorQuant t;
    t.tensor = std::move(tensor);
    t.role = role;
    t.params = {type, std::move(scale), std::move(zero_point), axis};
    return t;
}

void emit_with_format(const std::string& format_name, Model& model, const QuantPlan& plan,
                      const nlohmann::json& options) {
    auto registry = registry_with_test_plugin();
    const auto& info = registry.require(PluginKind::Format, format_name);
    registry.create<Format>(format_name, registry.resolve_options(info, options))->emit(model, plan);
}

std::vector<std::vector<float>> normal_batches(int count, int size, float stddev, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, stddev);
    std::vector<std::vector<float>> out(static_cast<size_t>(count));
    for (auto& batch : out) {
        batch.resize(static_cast<size_t>(size));
        for (auto& v : batch) v = normal(rng);
    }
    return out;
}

QuantSpec blocked_spec(QuantType type, bool symmetric, int64_t block_size) {
    QuantSpec spec;
    spec.type = type;
    spec.symmetric = symmetric;
    spec.axis = 0;
    spec.block_size = block_size;
    return spec;
}

std::string error_of(const std::function<void()>& body) {
    try {
        body();
    } catch (const InputError& e) {
        return e.what();
    }
    return "no error";
}

std::vector<Batch> all_batches(DataReader& reader) {
    std::vector<Batch> out;
    while (auto b = reader.next()) out.push_back(std::move(*b));
    return out;
}

void write_png(const fs::path& path, int64_t height, int64_t width, int64_t channels, const uint8_t* pixels) {
    png_image png{};
    png.version = PNG_IMAGE_VERSION;
    png.width = static_cast<png_uint_32>(width);
    png.height = static_cast<png_uint_32>(height);
    png.format = channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
    if (!png_image_write_to_file(&png, path.c_str(), 0, pixels, 0, nullptr))
        throw std::runtime_error(std::string("cannot write ") + path.string() + ": " + png.message);
}

ShardedCalibration calibrate_in_shards(const std::string& calibrator, const nlohmann::json& options,
                                       const QuantSpec& spec,
                                       const std::vector<std::vector<std::vector<float>>>& shards) {
    auto registry = registry_with_test_plugin();
    const auto& info = registry.require(PluginKind::Calibrator, calibrator);
    auto plugin = registry.create<Calibrator>(calibrator, registry.resolve_options(info, options));
    auto whole = plugin->make_observer("t", spec);
    auto merged = plugin->make_observer("t", spec);
    float extent = 0;
    for (const auto& shard : shards) {
        auto observer = plugin->make_observer("t", spec);
        for (const auto& batch : shard) {
            const std::vector<int64_t> shape{static_cast<int64_t>(batch.size())};
            whole->observe({shape, batch});
            observer->observe({shape, batch});
            for (float v : batch) extent = std::max(extent, std::abs(v));
        }
        merged->merge(observer->statistics());
    }
    return {whole->result(), merged->result(), extent};
}

// y = If(flag, then: Relu(x @ W), else: x @ V); the branches read x, W and V from the main graph.
Model branching_model() {
    GraphBuilder b;
    b.input("x", {1, 8}).input("flag", {}, DataType::Bool).output("y", {1, 8});
    b.initializer("W", ramp({8, 8}, -0.5f, 0.0157f)).initializer("V", ramp({8, 8}, 0.4f, -0.011f));
    auto branch = [](const std::string& name, const std::string& weight, bool relu) {
        onnx::GraphProto g;
        g.set_name(name);
        auto* mm = g.add_node();
        mm->set_op_type("MatMul");
        mm->set_name(name + "_mm");
        mm->add_input("x");
        mm->add_input(weight);
        mm->add_output(name + "_product");
        std::string out = name + "_product";
        if (relu) {
            auto* r = g.add_node();
            r->set_op_type("Relu");
            r->set_name(name + "_relu");
            r->add_input(out);
            out = name + "_out";
            r->add_output(out);
        }
        g.add_output()->set_name(out);  // typed by the If, as exporters leave it
        return g;
    };
    auto& node = b.node("If", {"flag"}, {"y"}, "choose");
    for (const auto& [attr, graph] :
         {std::pair{"then_branch", branch("then", "W", true)}, std::pair{"else_branch", branch("else", "V", false)}}) {
        auto* a = node.add_attribute();
        a->set_name(attr);
        a->set_type(onnx::AttributeProto::GRAPH);
        *a->mutable_g() = graph;
    }
    return b.build();
}

namespace {

onnx::ValueInfoProto typed_value(const std::string& name, DataType type, const std::vector<int64_t>& shape) {
    onnx::ValueInfoProto v;
    v.set_name(name);
    auto* t = v.mutable_type()->mutable_tensor_type();
    t->set_elem_type(static_cast<int>(type));
    auto* s = t->mutable_shape();
    for (auto d : shape) s->add_dim()->set_dim_value(d);
    return v;
}

onnx::NodeProto* add_node(onnx::GraphProto& g, const std::string& op, std::vector<std::string> inputs,
                          std::vector<std::string> outputs, const std::string& name) {
    auto* node = g.add_node();
    node->set_op_type(op);
    node->set_name(name);
    for (const auto& i : inputs) node->add_input(i);
    for (const auto& o : outputs) node->add_output(o);
    return node;
}

void set_body(onnx::NodeProto& node, onnx::GraphProto body) {
    auto* a = node.add_attribute();
    a->set_name("body");
    a->set_type(onnx::AttributeProto::GRAPH);
    *a->mutable_g() = std::move(body);
}

// (h, ys) = Loop(trips, x) whose body computes `product` from h_in and the
// main graph's `weights` (what `add_product` adds), then h <- Tanh(product)
// and ys stacks Relu(product).
// With `conditional`, no trip count: the body's condition (i < trips - 1) ends it.
Model loop_model(int64_t trips, const std::vector<std::pair<std::string, Tensor>>& weights,
                 const std::function<void(onnx::GraphProto&)>& add_product, bool conditional = false) {
    GraphBuilder b;
    b.input("x", {1, 8}).output("h", {1, 8}).output("ys", {trips, 1, 8});
    for (const auto& [name, value] : weights) b.initializer(name, value);
    b.initializer("trips", Tensor::from_values<int64_t>({}, std::vector<int64_t>{trips}));
    b.initializer("last", Tensor::from_values<int64_t>({}, std::vector<int64_t>{trips - 1}));
    onnx::GraphProto body;
    body.set_name("step");
    *body.add_input() = typed_value("i", DataType::Int64, {});
    *body.add_input() = typed_value("going", DataType::Bool, {});
    *body.add_input() = typed_value("h_in", DataType::Float, {1, 8});
    add_product(body);
    add_node(body, "Tanh", {"product"}, {"h_out"}, "loop_tanh");
    add_node(body, "Relu", {"product"}, {"y"}, "loop_relu");
    if (conditional)
        add_node(body, "Less", {"i", "last"}, {"going_out"}, "loop_going");
    else
        add_node(body, "Identity", {"going"}, {"going_out"}, "loop_going");
    for (const auto& name : {"going_out", "h_out", "y"}) body.add_output()->set_name(name);
    set_body(b.node("Loop", {conditional ? "" : "trips", "", "x"}, {"h", "ys"}, "repeat"), std::move(body));
    return b.build();
}

}  // namespace

Model looping_model(int64_t trips, bool conditional) {
    return loop_model(
        trips, {{"W", ramp({8, 8}, -0.45f, 0.0141f)}},
        [](onnx::GraphProto& body) {
            add_node(body, "MatMul", {"h_in", "W"}, {"product"}, "loop_mm");
        },
        conditional);
}

Model looping_branching_model(int64_t trips) {
    const std::vector<std::pair<std::string, Tensor>> weights = {
        {"W", ramp({8, 8}, -0.45f, 0.0141f)},
        {"V", ramp({8, 8}, 0.35f, -0.0102f)},
        {"two", Tensor::from_values<int64_t>({}, std::vector<int64_t>{2})}};
    return loop_model(trips, weights, [](onnx::GraphProto& body) {
        auto branch = [](const std::string& name, const std::string& weight) {
            onnx::GraphProto g;
            g.set_name(name);
            add_node(g, "MatMul", {"h_in", weight}, {name + "_product"}, name + "_mm");
            g.add_output()->set_name(name + "_product");
            return g;
        };
        add_node(body, "Less", {"i", "two"}, {"early"}, "loop_early");
        auto* choose = add_node(body, "If", {"early"}, {"product"}, "loop_choose");
        for (const auto& [attr, graph] :
             {std::pair{"then_branch", branch("then", "W")}, std::pair{"else_branch", branch("else", "V")}}) {
            auto* a = choose->add_attribute();
            a->set_name(attr);
            a->set_type(onnx::AttributeProto::GRAPH);
            *a->mutable_g() = graph;
        }
    });
}

Model scanning_model(int64_t steps) {
    GraphBuilder b;
    b.input("xs", {steps, 8}).output("s", {8}).output("zs", {steps, 8});
    b.initializer("U", ramp({8, 8}, 0.3f, -0.0093f));
    b.initializer("s0", Tensor(DataType::Float, {8}));
    onnx::GraphProto body;
    body.set_name("scan_step");
    *body.add_input() = typed_value("s_in", DataType::Float, {8});
    *body.add_input() = typed_value("x_t", DataType::Float, {8});
    add_node(body, "MatMul", {"x_t", "U"}, {"q"}, "scan_mm");
    add_node(body, "Add", {"s_in", "q"}, {"s_out"}, "scan_add");
    add_node(body, "Relu", {"q"}, {"z"}, "scan_relu");
    for (const auto& name : {"s_out", "z"}) body.add_output()->set_name(name);
    auto& scan = b.node("Scan", {"s0", "xs"}, {"s", "zs"}, "scan");
    set_attribute(scan, "num_scan_inputs", int64_t{1});
    set_body(scan, std::move(body));
    return b.build();
}

}  // namespace vaiq::test

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    for (int i = 1; i < argc; ++i) vaiq::test::args().push_back(argv[i]);
    return RUN_ALL_TESTS();
}
