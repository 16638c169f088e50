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

// The enable_dpu graph transforms: documented switch -> pass plugin, in the order they run.
struct Transform {
    const char* option;
    const char* pass;
};
constexpr Transform kLegalizations[] = {
    {"ConvertBNToConv", "convert_bn_to_conv"},
    {"ConvertReduceMeanToGlobalAvgPool", "convert_reduce_mean_to_global_avg_pool"},
    {"SplitLargeKernelPool", "split_large_kernel_pool"},
    {"ConvertSplitToSlice", "convert_split_to_slice"},
    {"FuseInstanceNorm", "fuse_instance_norm"},
    {"FuseL2Norm", "fuse_l2_norm"},
};
// Under SimulateDPU.
constexpr Transform kSimulations[] = {
    {"ConvertLeakyReluToDPUVersion", "convert_leaky_relu_to_dpu_version"},
    {"ConvertSigmoidToHardSigmoid", "convert_sigmoid_to_hard_sigmoid"},
    {"ConvertHardSigmoidToDPUVersion", "convert_hard_sigmoid_to_dpu_version"},
    {"ConvertAvgPoolToDPUVersion", "convert_avg_pool_to_dpu_version"},
    {"ConvertReduceMeanToDPUVersion", "convert_reduce_mean_to_dpu_version"},
    {"ConvertSoftmaxToDPUVersion", "convert_softmax_to_dpu_version"},
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
        enable_dpu_ = options.get_bool("enable_dpu");
        int32_bias_ = options.get_bool("int32_bias");
        max_sweeps_ = static_cast<int>(options.get_int("max_refinement_sweeps"));
        for (const auto& t : kLegalizations)
            if (options.get_bool(t.option)) legalizations_.emplace_back(t.pass);
        if (options.get_bool("SimulateDPU"))
            for (const auto& t : kSimulations)
                if (options.get_bool(t.option)) simulations_.emplace_back(t.pass);
        check_limits_ = options.get_bool("IPULimitationCheck");
        rules_.align_concat = options.get_bool("AlignConcat");
        rules_.align_pool = options.get_bool("AlignPool");
        rules_.shift_read = options.get_bool("AdjustShiftRead");
        rules_.shift_write = options.get_bool("AdjustShiftWrite");
        rules_.shift_cut = options.get_bool("AdjustShiftCut");
        rules_.shift_bias = options.get_bool("AdjustShiftBias");
        rules_.hard_sigmoid = options.get_bool("AdjustHardSigmoid");
        rules_.shift_swish = options.get_bool("AdjustShiftSwish");
        fuse_leaky_relu_ = options.get_bool("RemoveQDQConvLeakyRelu");
        fuse_prelu_ = options.get_bool("RemoveQDQConvPRelu");
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

    vaiq::QuantSpec default_spec(vaiq::TensorRole role, const vaiq::QuantRequest& request) const override {
        auto spec = vaiq::spec_from_request(role, request);
        spec.power_of_two = true;
        spec.symmetric = true;
        spec.per_channel = false;
        spec.reduce_range = false;
        if (role == vaiq::TensorRole::Bias && !int32_bias_) spec.type = vaiq::QuantType::QInt8;  // a weight of its own
        return spec;
    }

    void check(const vaiq::QuantRequest& run) const override {
        auto refuse = [](const std::string& what) { throw vaiq::InputError("target 'npu_cnn' " + what); };
        if (run.per_channel) refuse("computes per tensor: set per_channel to false");
        if (run.reduce_range) refuse("uses the full 8-bit weight range: set reduce_range to false");
        if (!run.weight_symmetric) refuse("needs symmetric weights: set extra_options.WeightSymmetric to true");
        if (!run.activation_symmetric)
            refuse(
                "needs symmetric activations: set extra_options.ActivationSymmetric to true "
                "(extra_options.UseUnsignedReLU makes ReLU outputs unsigned)");
        if (!run.quantize_bias) refuse("computes biases in integers: set extra_options.QuantizeBias to true");
        if (run.weight_type != vaiq::QuantType::QInt8)
            refuse(
                fmt::format("takes int8 weights (weight_type: QInt8), not {}", vaiq::quant_type_name(run.weight_type)));
        if (!vaiq::is_eight_bit(run.activation_type))
            refuse(fmt::format("takes 8-bit activations (QUInt8 or QInt8), not {}",
                               vaiq::quant_type_name(run.activation_type)));
    }

    std::vector<std::string> legalization_passes(const vaiq::QuantRequest&) const override {
        if (!enable_dpu_) return {};
        auto out = legalizations_;
        out.insert(out.end(), simulations_.begin(), simulations_.end());
        return out;
    }

    bool fuses(const onnx::NodeProto& producer, const onnx::NodeProto& consumer, const vaiq::GraphIndex& index,
               const vaiq::QuantRequest&) const override {
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
        if (op == "LeakyRelu") return fuse_leaky_relu_;
        if (op == "PRelu") return fuse_prelu_;
        return false;
    }

    std::vector<vaiq::ConstraintCount> refine(const vaiq::Model& model, vaiq::QuantPlan& plan,
                                              const vaiq::QuantRequest& run) const override {
        if (!checks_limits()) return {};
        const vaiq::GraphIndex index(model);
        return npu_cnn::refine_positions(model.graph(), plan, rules_, fused(index, run), max_sweeps_);
    }

    std::vector<vaiq::ConstraintCount> verify(const vaiq::Model& quantized,
                                              const vaiq::QuantRequest& run) const override {
        const auto view = vaiq::read_qdq(quantized);
        warn_if_not_a_cnn(view.graph);
        const vaiq::GraphIndex index(view.graph);
        const auto r = checks_limits() ? rules_ : npu_cnn::Rules::none();
        return npu_cnn::check_positions(view.graph.graph(), view.plan, r, fused(index, run));
    }

  private:
    bool checks_limits() const { return enable_dpu_ && check_limits_; }

    // This target's per-tensor power-of-two scales suit convolutions; attention
    // and linear layers lose far more (a ViT: 98 % top-1 to 24 %), and the
    // transformer target is made for them.
    static void warn_if_not_a_cnn(const vaiq::Model& model) {
        int convs = 0, matmuls = 0;
        for (const auto& n : model.graph().node()) {
            if (!vaiq::is_default_domain(n)) continue;
            convs += n.op_type() == "Conv" || n.op_type() == "ConvTranspose";
            matmuls += n.op_type() == "MatMul" || n.op_type() == "Gemm";
        }
        if (matmuls > convs)
            vaiq::log_warn(
                "target npu_cnn is made for CNNs, but this model has {} MatMul/Gemm against {} Conv: a "
                "transformer or MLP loses much more accuracy with its per-tensor power-of-two scales; "
                "transformer_npu.yaml (target npu_transformer) suits it",
                matmuls, convs);
    }

    npu_cnn::Fused fused(const vaiq::GraphIndex& index, const vaiq::QuantRequest& run) const {
        return [this, &index, &run](const onnx::NodeProto& producer, const onnx::NodeProto& consumer) {
            return fuses(producer, consumer, index, run);
        };
    }

    bool enable_dpu_ = false;
    bool int32_bias_ = false;
    int max_sweeps_ = 20;
    std::vector<std::string> legalizations_, simulations_;
    bool check_limits_ = true;
    npu_cnn::Rules rules_;
    bool fuse_leaky_relu_ = false, fuse_prelu_ = false;
};

// Options whose names start with a capital are documented extra_options: a
// recipe sets them under extra_options, as in a quantize_static call.
const vaiq_option_descriptor kOptions[] = {
    {"enable_dpu", VAIQ_OPTION_BOOL, "false",
     "The device's graph transforms and limits apply (the recipe's documented enable_dpu)."},
    {"int32_bias", VAIQ_OPTION_BOOL, "false",
     "Quantize biases to int32 at input scale x weight scale instead of int8 with their own position."},
    {"max_refinement_sweeps", VAIQ_OPTION_INT, "20",
     "Sweeps of the limitation checks before refinement gives up on a fixed point."},
    // enable_dpu transforms
    {"ConvertBNToConv", VAIQ_OPTION_BOOL, "true", "BatchNormalization to Conv."},
    {"ConvertReduceMeanToGlobalAvgPool", VAIQ_OPTION_BOOL, "true", "ReduceMean to GlobalAveragePool."},
    {"SplitLargeKernelPool", VAIQ_OPTION_BOOL, "true", "Split large-kernel global average pools."},
    {"ConvertSplitToSlice", VAIQ_OPTION_BOOL, "true", "Split to Slice."},
    {"FuseInstanceNorm", VAIQ_OPTION_BOOL, "false", "Fuse split instance norms."},
    {"FuseL2Norm", VAIQ_OPTION_BOOL, "false", "Fuse L2 norm patterns."},
    {"SimulateDPU", VAIQ_OPTION_BOOL, "true",
     "Replace some ops with the DPU's approximations (the Convert*DPUVersion "
     "switches and ConvertSigmoidToHardSigmoid)."},
    {"ConvertLeakyReluToDPUVersion", VAIQ_OPTION_BOOL, "true", "DPU LeakyRelu."},
    {"ConvertSigmoidToHardSigmoid", VAIQ_OPTION_BOOL, "true", "Sigmoid to HardSigmoid."},
    {"ConvertHardSigmoidToDPUVersion", VAIQ_OPTION_BOOL, "true", "DPU HardSigmoid."},
    {"ConvertAvgPoolToDPUVersion", VAIQ_OPTION_BOOL, "true", "DPU average pooling."},
    {"ConvertReduceMeanToDPUVersion", VAIQ_OPTION_BOOL, "true", "DPU ReduceMean."},
    {"ConvertSoftmaxToDPUVersion", VAIQ_OPTION_BOOL, "false", "DPU Softmax."},
    // enable_dpu limits
    {"IPULimitationCheck", VAIQ_OPTION_BOOL, "true",
     "Adjust scales to the NPU's limitations (the Adjust*/Align* switches)."},
    {"AdjustShiftCut", VAIQ_OPTION_BOOL, "true", "Adjust shift cut."},
    {"AdjustShiftBias", VAIQ_OPTION_BOOL, "true", "Adjust shift bias."},
    {"AdjustShiftRead", VAIQ_OPTION_BOOL, "true", "Adjust shift read."},
    {"AdjustShiftWrite", VAIQ_OPTION_BOOL, "true", "Adjust shift write."},
    {"AdjustHardSigmoid", VAIQ_OPTION_BOOL, "true", "Adjust HardSigmoid positions."},
    {"AdjustShiftSwish", VAIQ_OPTION_BOOL, "true", "Adjust shift swish."},
    {"AlignConcat", VAIQ_OPTION_BOOL, "true", "Align Concat positions."},
    {"AlignPool", VAIQ_OPTION_BOOL, "true", "Align pooling positions."},
    {"RemoveQDQConvLeakyRelu", VAIQ_OPTION_BOOL, "false", "Remove the QDQ between Conv and LeakyRelu (enable_dpu)."},
    {"RemoveQDQConvPRelu", VAIQ_OPTION_BOOL, "false", "Remove the QDQ between Conv and PRelu (enable_dpu)."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<NpuCnn>("npu_cnn", "0.1.0",
                                    "NPU for CNNs: power-of-two scales, per-tensor int8, DPU transforms and limits",
                                    kOptions))
