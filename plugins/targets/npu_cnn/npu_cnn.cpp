// npu_cnn: CNNs on the NPU (the DPU), as the documented "CNNs on NPU"
// configuration quantizes them (QDQ, MinMSE, uint8 activations, int8 weights,
// enable_dpu, ActivationSymmetric). The device computes per tensor with
// power-of-two scales, symmetric int8 weights and, by default, int8 biases
// with their own position; it fuses Conv+Relu and shifts integers between
// positions within fixed limits, which refinement enforces on the plan and
// the check phase verifies on the written model.
#include <vaiq/vaiq.hpp>

#include <set>

#include "positions.hpp"

namespace {

bool is_eight_bit(vaiq::QuantType t) { return t == vaiq::QuantType::QInt8 || t == vaiq::QuantType::QUInt8; }

// The enable_dpu graph transforms: documented switch -> pass plugin, in the order they run.
struct Transform {
    const char* key;
    const char* pass;
};
constexpr Transform kLegalizations[] = {
    {"extra_options.ConvertBNToConv", "convert_bn_to_conv"},
    {"extra_options.ConvertReduceMeanToGlobalAvgPool", "convert_reduce_mean_to_global_avg_pool"},
    {"extra_options.SplitLargeKernelPool", "split_large_kernel_pool"},
    {"extra_options.ConvertSplitToSlice", "convert_split_to_slice"},
    {"extra_options.FuseInstanceNorm", "fuse_instance_norm"},
    {"extra_options.FuseL2Norm", "fuse_l2_norm"},
};
constexpr Transform kSimulations[] = {
    {"extra_options.ConvertLeakyReluToDPUVersion", "convert_leaky_relu_to_dpu_version"},
    {"extra_options.ConvertSigmoidToHardSigmoid", "convert_sigmoid_to_hard_sigmoid"},
    {"extra_options.ConvertHardSigmoidToDPUVersion", "convert_hard_sigmoid_to_dpu_version"},
    {"extra_options.ConvertAvgPoolToDPUVersion", "convert_avg_pool_to_dpu_version"},
    {"extra_options.ConvertReduceMeanToDPUVersion", "convert_reduce_mean_to_dpu_version"},
    {"extra_options.ConvertSoftmaxToDPUVersion", "convert_softmax_to_dpu_version"},
};

// Ops whose output the device can run through an activation without
// requantizing in between.
const std::set<std::string, std::less<>> kFusingOps = {"Conv",        "ConvTranspose",     "Gemm",   "MatMul", "Add",
                                                       "AveragePool", "GlobalAveragePool", "MaxPool"};
// Ops the DPU rescales after the fact (see the simulation passes).
const std::set<std::string, std::less<>> kRescaled = {"AveragePool", "GlobalAveragePool", "ReduceMean", "HardSigmoid"};

class NpuCnn final : public vaiq::Target {
  public:
    void configure(const vaiq::Options& options) override {
        int32_bias_ = options.get_bool("int32_bias");
        max_sweeps_ = static_cast<int>(options.get_int("max_refinement_sweeps"));
    }

    bool supports(const onnx::NodeProto& node) const override {
        static const std::set<std::string, std::less<>> kOps = {
            // compute
            "Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "Mul", "BatchNormalization",
            "InstanceNormalization", "Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish",
            "Softmax", "AveragePool", "GlobalAveragePool", "MaxPool", "ReduceMean", "LpNormalization",
            // data movement
            "Concat", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Pad", "Resize",
            "DepthToSpace", "SpaceToDepth"};
        return vaiq::is_default_domain(node) && kOps.count(node.op_type()) > 0;
    }

    vaiq::QuantSpec default_spec(vaiq::TensorRole role, const vaiq::Options& config) const override {
        auto spec = vaiq::spec_from_config(role, config);
        spec.power_of_two = true;
        spec.symmetric = true;
        spec.per_channel = false;
        spec.reduce_range = false;
        if (role == vaiq::TensorRole::Bias && !int32_bias_) spec.type = vaiq::QuantType::QInt8;  // a weight of its own
        return spec;
    }

    void check(const vaiq::Options& config) const override {
        auto refuse = [](const std::string& what) { throw vaiq::InputError("target 'npu_cnn' " + what); };
        if (config.get_bool("per_channel")) refuse("computes per tensor: set per_channel to false");
        if (config.get_bool("reduce_range")) refuse("uses the full 8-bit weight range: set reduce_range to false");
        if (!config.get_bool("extra_options.WeightSymmetric"))
            refuse("needs symmetric weights: set extra_options.WeightSymmetric to true");
        if (!config.get_bool("extra_options.ActivationSymmetric"))
            refuse("needs symmetric activations: set extra_options.ActivationSymmetric to true "
                   "(extra_options.UseUnsignedReLU makes ReLU outputs unsigned)");
        if (!config.get_bool("extra_options.QuantizeBias"))
            refuse("computes biases in integers: set extra_options.QuantizeBias to true");
        const auto weight = *vaiq::parse_quant_type(config.get_string("weight_type"));
        if (weight != vaiq::QuantType::QInt8)
            refuse(fmt::format("takes int8 weights (weight_type: QInt8), not {}", vaiq::quant_type_name(weight)));
        const auto act = *vaiq::parse_quant_type(config.get_string("activation_type"));
        if (!is_eight_bit(act))
            refuse(fmt::format("takes 8-bit activations (QUInt8 or QInt8), not {}", vaiq::quant_type_name(act)));
    }

    std::vector<std::string> legalization_passes(const vaiq::Options& config) const override {
        std::vector<std::string> out;
        if (!config.get_bool("enable_dpu")) return out;
        for (const auto& t : kLegalizations)
            if (config.get_bool(t.key)) out.emplace_back(t.pass);
        if (!config.get_bool("extra_options.SimulateDPU")) return out;
        for (const auto& t : kSimulations)
            if (config.get_bool(t.key)) out.emplace_back(t.pass);
        return out;
    }

    bool fuses(const onnx::NodeProto& producer, const onnx::NodeProto& consumer, const vaiq::GraphIndex& index,
               const vaiq::Options& config) const override {
        if (index.marked(consumer, vaiq::kDeviceRescale)) return kRescaled.count(producer.op_type()) > 0;
        // A zero Pad before an average pool is the pool's own padding on the device.
        if (consumer.op_type() == "AveragePool") return vaiq::pads_with_zeros(producer, index);
        if (!kFusingOps.count(producer.op_type())) return false;
        const auto& op = consumer.op_type();
        if (op == "Relu") return true;
        if (op == "Clip") {
            const auto bounds = vaiq::clip_bounds(consumer, index);
            return bounds && bounds->first == 0.0f && (bounds->second == 6.0f || bounds->second == 1.0f);
        }
        if (op == "LeakyRelu") return config.get_bool("extra_options.RemoveQDQConvLeakyRelu");
        if (op == "PRelu") return config.get_bool("extra_options.RemoveQDQConvPRelu");
        return false;
    }

    std::vector<vaiq::ConstraintCount> refine(const vaiq::Model& model, vaiq::QuantPlan& plan,
                                              const vaiq::Options& config) const override {
        if (!checks_limits(config)) return {};
        const vaiq::GraphIndex index(model);
        return npu_cnn::refine_positions(model.graph(), plan, rules(config), fused(index, config), max_sweeps_);
    }

    std::vector<vaiq::ConstraintCount> verify(const vaiq::Model& quantized, const vaiq::Options& config) const override {
        const auto view = vaiq::read_qdq(quantized);
        const vaiq::GraphIndex index(view.graph);
        const auto r = checks_limits(config) ? rules(config) : npu_cnn::Rules::none();
        return npu_cnn::check_positions(view.graph.graph(), view.plan, r, fused(index, config));
    }

  private:
    static bool checks_limits(const vaiq::Options& config) {
        return config.get_bool("enable_dpu") && config.get_bool("extra_options.IPULimitationCheck");
    }

    static npu_cnn::Rules rules(const vaiq::Options& c) {
        npu_cnn::Rules r;
        r.align_concat = c.get_bool("extra_options.AlignConcat");
        r.align_pool = c.get_bool("extra_options.AlignPool");
        r.shift_read = c.get_bool("extra_options.AdjustShiftRead");
        r.shift_write = c.get_bool("extra_options.AdjustShiftWrite");
        r.shift_cut = c.get_bool("extra_options.AdjustShiftCut");
        r.shift_bias = c.get_bool("extra_options.AdjustShiftBias");
        r.hard_sigmoid = c.get_bool("extra_options.AdjustHardSigmoid");
        r.shift_swish = c.get_bool("extra_options.AdjustShiftSwish");
        return r;
    }

    npu_cnn::Fused fused(const vaiq::GraphIndex& index, const vaiq::Options& config) const {
        return [this, &index, &config](const onnx::NodeProto& producer, const onnx::NodeProto& consumer) {
            return fuses(producer, consumer, index, config);
        };
    }

    bool int32_bias_ = false;
    int max_sweeps_ = 20;
};

const vaiq_option_descriptor kOptions[] = {
    {"int32_bias", VAIQ_OPTION_BOOL, "false",
     "Quantize biases to int32 at input scale x weight scale instead of int8 with their own position."},
    {"max_refinement_sweeps", VAIQ_OPTION_INT, "20",
     "Sweeps of the limitation checks before refinement gives up on a fixed point."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<NpuCnn>("npu_cnn", "0.1.0",
                                    "NPU for CNNs: power-of-two scales, per-tensor int8, DPU transforms and limits",
                                    kOptions))
