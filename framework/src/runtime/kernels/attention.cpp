// ONNX Runtime's fused multi-head self-attention (com.microsoft Attention) and
// its dynamically quantized form (QAttention): one product of the input with
// the packed Q, K and V weights, then softmax(Q K^T * scale + mask) V per head.
// Supported: no past state, no attention bias; masks as 1-D end (or end and
// start) positions, or 2-D / 3-D raw 0/1 masks; unidirectional.
#include <algorithm>
#include <cmath>
#include <span>

#include "runtime/kernels/common.hpp"

namespace vaiq::runtime {
namespace {

struct AttentionShape {
    int64_t batch, seq, in_size, heads, q_hidden, k_hidden, v_hidden;
};

AttentionShape attention_shape(const KernelContext& ctx, const Tensor& input, const std::vector<int64_t>& weight) {
    if (input.shape().size() != 3) ctx.fail("input must be [batch, sequence, hidden]");
    if (weight.size() != 2 || weight[0] != input.shape()[2]) ctx.fail("weights must be [input hidden, 3 x hidden]");
    AttentionShape s{input.shape()[0], input.shape()[1], input.shape()[2], ctx.attributes.get_int("num_heads", 0), 0, 0, 0};
    if (s.heads <= 0) ctx.fail("num_heads must be positive");
    const auto sizes = ctx.attributes.get_ints("qkv_hidden_sizes");
    if (sizes.empty()) {
        if (weight[1] % 3 != 0) ctx.fail("the weights' columns must be 3 x hidden");
        s.q_hidden = s.k_hidden = s.v_hidden = weight[1] / 3;
    } else {
        if (sizes.size() != 3 || sizes[0] + sizes[1] + sizes[2] != weight[1])
            ctx.fail("qkv_hidden_sizes must hold three sizes adding up to the weights' columns");
        s.q_hidden = sizes[0];
        s.k_hidden = sizes[1];
        s.v_hidden = sizes[2];
    }
    if (s.q_hidden != s.k_hidden || s.q_hidden % s.heads != 0 || s.v_hidden % s.heads != 0)
        ctx.fail("Q and K must have one size, and Q and V sizes divide by num_heads");
    return s;
}

// Whether key position j is hidden from query position i of batch b.
class Mask {
  public:
    Mask(const KernelContext& ctx, const AttentionShape& s) : s_(s) {
        unidirectional_ = ctx.attributes.get_int("unidirectional", 0) != 0;
        if (!ctx.has_input(3)) return;
        const auto& m = ctx.input(3);
        if (m.type() != DataType::Int32) ctx.fail("mask_index must be int32");
        values_ = m.data<int32_t>();
        const auto& shape = m.shape();
        if (shape == std::vector<int64_t>{s.batch} || shape == std::vector<int64_t>{2 * s.batch})
            form_ = shape[0] == s.batch ? Form::End : Form::EndStart;
        else if (shape == std::vector<int64_t>{s.batch, s.seq})
            form_ = Form::Raw2D;
        else if (shape == std::vector<int64_t>{s.batch, s.seq, s.seq})
            form_ = Form::Raw3D;
        else
            ctx.fail("mask_index must be [batch], [2 x batch], [batch, sequence] or [batch, sequence, sequence]");
    }

    bool hidden(int64_t b, int64_t i, int64_t j) const {
        if (unidirectional_ && j > i) return true;
        switch (form_) {
            case Form::None: return false;
            case Form::End: return j >= values_[b];
            case Form::EndStart: return j >= values_[b] || j < values_[s_.batch + b];
            case Form::Raw2D: return values_[b * s_.seq + j] == 0;
            case Form::Raw3D: return values_[(b * s_.seq + i) * s_.seq + j] == 0;
        }
        return false;
    }

  private:
    enum class Form { None, End, EndStart, Raw2D, Raw3D };
    AttentionShape s_;
    bool unidirectional_ = false;
    Form form_ = Form::None;
    std::span<const int32_t> values_;
};

// softmax(Q K^T * scale + mask) V per head, from the projected [batch, seq, q + k + v] values.
Tensor attend(const KernelContext& ctx, const AttentionShape& s, std::span<const float> qkv) {
    const int64_t head = s.q_hidden / s.heads, v_head = s.v_hidden / s.heads;
    const int64_t width = s.q_hidden + s.k_hidden + s.v_hidden;
    const float scale = ctx.attributes.get_float("scale", 1.0f / std::sqrt(static_cast<float>(head)));
    const float filter = ctx.attributes.get_float("mask_filter_value", -10000.0f);
    const Mask mask(ctx, s);
    Tensor out(DataType::Float, {s.batch, s.seq, s.v_hidden});
    auto o = out.mutable_data<float>();
    std::vector<float> scores(static_cast<size_t>(s.seq));
    for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.heads; ++h)
            for (int64_t i = 0; i < s.seq; ++i) {
                const float* q = qkv.data() + (b * s.seq + i) * width + h * head;
                float top = -std::numeric_limits<float>::infinity();
                for (int64_t j = 0; j < s.seq; ++j) {
                    const float* k = qkv.data() + (b * s.seq + j) * width + s.q_hidden + h * head;
                    float dot = 0;
                    for (int64_t d = 0; d < head; ++d) dot += q[d] * k[d];
                    scores[j] = dot * scale + (mask.hidden(b, i, j) ? filter : 0.0f);
                    top = std::max(top, scores[j]);
                }
                float sum = 0;
                for (auto& v : scores) sum += v = std::exp(v - top);
                float* dst = o.data() + (b * s.seq + i) * s.v_hidden + h * v_head;
                std::fill(dst, dst + v_head, 0.0f);
                for (int64_t j = 0; j < s.seq; ++j) {
                    const float p = scores[j] / sum;
                    const float* v = qkv.data() + (b * s.seq + j) * width + s.q_hidden + s.k_hidden + h * v_head;
                    for (int64_t d = 0; d < v_head; ++d) dst[d] += p * v[d];
                }
            }
    return out;
}

// input [B, S, in] x weights [in, width] + bias, as float.
std::vector<float> project(const AttentionShape& s, std::span<const float> x, std::span<const float> w,
                           std::span<const float> bias, int64_t width) {
    std::vector<float> out(static_cast<size_t>(s.batch * s.seq * width));
    for (int64_t r = 0; r < s.batch * s.seq; ++r) {
        float* dst = out.data() + r * width;
        for (int64_t c = 0; c < width; ++c) dst[c] = bias.empty() ? 0.0f : bias[c];
        for (int64_t k = 0; k < s.in_size; ++k) {
            const float a = x[r * s.in_size + k];
            const float* row = w.data() + k * width;
            for (int64_t c = 0; c < width; ++c) dst[c] += a * row[c];
        }
    }
    return out;
}

std::span<const float> bias_of(const KernelContext& ctx, int64_t width) {
    if (!ctx.has_input(2)) return {};
    const auto& b = ctx.input(2);
    if (b.type() != DataType::Float || b.size() != width) ctx.fail("bias must be float [3 x hidden]");
    return b.data<float>();
}

void attention(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& w = ctx.input(1);
    if (x.type() != DataType::Float || w.type() != DataType::Float) ctx.fail("input and weights must be float");
    for (size_t slot = 4; slot < ctx.input_count(); ++slot)
        if (ctx.has_input(slot)) ctx.fail("past state, attention bias and the inputs after them are not supported");
    const auto s = attention_shape(ctx, x, w.shape());
    const int64_t width = w.shape()[1];
    const auto qkv = project(s, x.data<float>(), w.data<float>(), bias_of(ctx, width), width);
    out[0] = attend(ctx, s, qkv);
    if (out.size() > 1) ctx.fail("the present output is not supported");
}

// The real values of a quantized tensor: (q - zero point) x scale, the scale
// and zero point per tensor or, for the weights, per column.
template <typename T>
std::vector<float> dequantized(const Tensor& q, const Tensor& scale, const Tensor* zero_point, int64_t columns) {
    std::vector<float> out(static_cast<size_t>(q.size()));
    const auto v = q.data<T>();
    const auto sv = scale.data<float>();
    for (size_t i = 0; i < out.size(); ++i) {
        const size_t p = sv.size() == 1 ? 0 : i % static_cast<size_t>(columns);
        const int32_t zp = zero_point ? static_cast<int32_t>(zero_point->data<T>()[zero_point->size() == 1 ? 0 : p]) : 0;
        out[i] = static_cast<float>(static_cast<int32_t>(v[i]) - zp) * sv[p];
    }
    return out;
}

template <typename F>
void dispatch_8bit(const KernelContext& ctx, DataType type, F&& fn) {
    if (type == DataType::UInt8) return fn(TypeTag<uint8_t>{});
    if (type == DataType::Int8) return fn(TypeTag<int8_t>{});
    ctx.fail("quantized input and weights must be uint8 or int8");
}

// QAttention: input, weights, bias, input_scale, weight_scale, mask_index,
// input_zero_point, weight_zero_point, past. The integer product times the two
// scales is the float product of the dequantized values (exact in int32 and
// rounded once either way).
void qattention(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& w = ctx.input(1);
    if (ctx.has_input(8)) ctx.fail("past state is not supported");
    const auto s = attention_shape(ctx, x, w.shape());
    const int64_t width = w.shape()[1];
    const auto& x_scale = ctx.input(3);
    const auto& w_scale = ctx.input(4);
    if (x_scale.size() != 1 || (w_scale.size() != 1 && w_scale.size() != width))
        ctx.fail("input_scale must be a scalar, weight_scale a scalar or one per column");
    const Tensor* x_zp = ctx.has_input(6) ? &ctx.input(6) : nullptr;
    const Tensor* w_zp = ctx.has_input(7) ? &ctx.input(7) : nullptr;
    std::vector<float> xf, wf;
    dispatch_8bit(ctx, x.type(), [&](auto tag) { xf = dequantized<typename decltype(tag)::type>(x, x_scale, x_zp, 1); });
    dispatch_8bit(ctx, w.type(),
                  [&](auto tag) { wf = dequantized<typename decltype(tag)::type>(w, w_scale, w_zp, width); });
    // mask_index is input 5 here, 3 in Attention: the mask reads slot 3.
    KernelContext shifted = ctx;
    shifted.inputs.assign(ctx.inputs.begin(), ctx.inputs.begin() + 3);
    shifted.inputs.push_back(ctx.has_input(5) ? ctx.inputs[5] : nullptr);
    const auto qkv = project(s, xf, wf, bias_of(ctx, width), width);
    out[0] = attend(shifted, s, qkv);
    if (out.size() > 1) ctx.fail("the present output is not supported");
}

const KernelRegistration kKernels[] = {
    {"com.microsoft", "Attention", 1, 1, attention},
    {"com.microsoft", "QAttention", 1, 1, qattention},
};

}  // namespace
}  // namespace vaiq::runtime
