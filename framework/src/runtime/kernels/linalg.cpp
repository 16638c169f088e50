// MatMul (numpy semantics, batch broadcasting) and Gemm: float through oneDNN,
// other element types through Eigen.
#include <Eigen/Core>

#include "runtime/kernels/ort_float.hpp"
#include "runtime/qdq_fusion.hpp"

#include "runtime/kernels/common.hpp"
#include "runtime/kernels/dnnl_util.hpp"
#include "runtime/layout.hpp"

namespace vaiq::runtime {
namespace {

template <typename T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A float product through oneDNN's matmul for one set of operand layouts (the
// key: input shapes and transposes), kept across runs. A constant B is laid out
// as oneDNN prefers, once.
struct DnnlProduct {
    std::vector<int64_t> key;
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul primitive;
    dnnl::memory::desc a, b, c;
    ConstantOperand cached_b;
    bool exact_gelu = false;  ///< MLAS's Gelu after the product, not oneDNN's inside it
};

// Writes input 0 x input 1 (+ `bias`, one value per column, when given) into
// `y`, laid out as `a`, `b` and `c` describe; then the Gelu of attribute
// activation = "gelu" (the executor's fusion): oneDNN's, as it writes, or
// MLAS's after it in a model that quantizes (where its last bits decide roundings).
void dnnl_product(KernelContext& ctx, std::vector<int64_t> key, const dnnl::memory::desc& a_desc,
                  const dnnl::memory::desc& b_desc, const dnnl::memory::desc& c_desc, Tensor& y,
                  const Tensor* bias = nullptr) {
    const bool gelu = ctx.attributes.get_string("activation", "") == "gelu";
    if (!gelu && ctx.attributes.has("activation"))
        ctx.fail("unknown activation " + ctx.attributes.get_string("activation", ""));
    dnnl::memory::dims bias_dims(c_desc.dims().size(), 1);
    bias_dims.back() = c_desc.dims().back();
    const dnnl::memory::desc bias_desc(bias_dims, dnnl::memory::data_type::f32, plain_tag(bias_dims.size()));
    key.push_back(bias != nullptr);
    const auto& a = ctx.input(0);
    const auto& b = ctx.input(1);
    // A constant B is kept in oneDNN's blocked layout, a copy beside the model's, unless it is large.
    const bool constant_b = ctx.is_constant(1) && ctx.input(1).bytes().size() < kLargeConstantBytes;
    auto state = std::static_pointer_cast<DnnlProduct>(ctx.state);
    if (!state || state->key != key) {
        state = std::make_shared<DnnlProduct>();
        state->key = std::move(key);
        state->a = a_desc;
        state->b = b_desc;
        state->c = c_desc;
        const auto& weights_desc = constant_b ? constant_weights_desc(b_desc) : b_desc;
        state->exact_gelu = gelu && quantizes(ctx.model);
        dnnl::post_ops ops;
        if (gelu && !state->exact_gelu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
        dnnl::primitive_attr attr;
        attr.set_post_ops(ops);
        state->pd = dnnl::matmul::primitive_desc(bias ? dnnl::matmul::desc(a_desc, weights_desc, bias_desc, c_desc)
                                                      : dnnl::matmul::desc(a_desc, weights_desc, c_desc),
                                                 attr, cpu_engine());
        state->primitive = dnnl::matmul(state->pd);
        ctx.state = state;
    }
    dnnl::stream stream(cpu_engine());
    Tensor b_storage;  // this call's reordered B, where it is not a constant
    const dnnl::memory weights =
        operand(stream, b, constant_b, state->b, state->pd.weights_desc(), state->cached_b, b_storage);
    dnnl::memory c(state->c, cpu_engine(), y.mutable_bytes().data());
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, wrap(state->a, a)}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, c}};
    if (bias) args.emplace(DNNL_ARG_BIAS, wrap(bias_desc, *bias));
    state->primitive.execute(stream, args);
    stream.wait();
    if (state->exact_gelu) {
        auto v = y.mutable_data<float>();
        ort_gelu(v.data(), v.data(), static_cast<int64_t>(v.size()));
    }
}

// Float MatMul: both operands brought to the same rank (batch dimensions of 1 broadcast).
void dnnl_matmul(KernelContext& ctx, const std::vector<int64_t>& as, const std::vector<int64_t>& bs,
                 const std::vector<int64_t>& out_shape, std::vector<Tensor>& out, const Tensor* bias) {
    const size_t rank = std::max(as.size(), bs.size());
    auto pad = [&](std::vector<int64_t> s) {
        s.insert(s.begin(), rank - s.size(), 1);
        return s;
    };
    const auto pa = pad(as), pb = pad(bs);
    auto pc = pa;
    for (size_t d = 0; d + 2 < rank; ++d) pc[d] = std::max(pa[d], pb[d]);
    pc[rank - 1] = pb[rank - 1];
    using dnnl::memory;
    std::vector<int64_t> key = pa;
    key.insert(key.end(), pb.begin(), pb.end());
    Tensor y = Tensor::uninitialized(DataType::Float, out_shape);
    dnnl_product(ctx, std::move(key), memory::desc(dims_of(pa), memory::data_type::f32, plain_tag(rank)),
                 memory::desc(dims_of(pb), memory::data_type::f32, plain_tag(rank)),
                 memory::desc(dims_of(pc), memory::data_type::f32, plain_tag(rank)), y, bias);
    out[0] = std::move(y);
}

// MatMul; with a third input (the executor's MatMul + Add fusion, see
// runtime/layout.hpp), a bias of one float per output column added to the product.
void matmul(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& a = ctx.input(0);
    const auto& b = ctx.input(1);
    if (a.type() != b.type()) ctx.fail("the inputs have different element types");
    const Tensor* bias = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    if (bias && (a.type() != DataType::Float || bias->type() != DataType::Float || b.shape().size() < 2 ||
                 bias->size() != b.shape().back()))
        ctx.fail("the bias must be float with one value per column of B");
    if (a.shape().empty() || b.shape().empty()) ctx.fail("the inputs must have at least one dimension");
    // 1-D operands become matrices and the added dimension is dropped again.
    auto as = a.shape(), bs = b.shape();
    const bool a_vector = as.size() == 1, b_vector = bs.size() == 1;
    if (a_vector) as.insert(as.begin(), 1);
    if (b_vector) bs.push_back(1);
    const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
    if (bs[bs.size() - 2] != k) ctx.fail(fmt::format("inner dimensions differ: {} and {}", k, bs[bs.size() - 2]));
    const std::vector<int64_t> a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
    const auto batch = broadcast_shapes(ctx, a_batch, b_batch);
    const auto ia = broadcast_index(a_batch, batch);
    const auto ib = broadcast_index(b_batch, batch);
    std::vector<int64_t> shape = batch;
    if (!a_vector) shape.push_back(m);
    if (!b_vector) shape.push_back(n);
    // Between DequantizeLinear and QuantizeLinear a float MatMul is summed in MLAS's
    // order (the QDQ fusion marks it), so the Q after it rounds as in ONNX Runtime.
    if (a.type() == DataType::Float && !bias && ctx.attributes.get_int(kOrtOrderAttribute, 0) != 0) {
        out[0] = Tensor::uninitialized(DataType::Float, shape);
        auto o = out[0].mutable_data<float>();
        // One B for every batch: the batches are one taller A (the same sums per output).
        if (std::all_of(b_batch.begin(), b_batch.end(), [](int64_t d) { return d == 1; }) &&
            ia.size() == static_cast<size_t>(element_count(a_batch)) && !a_batch.empty()) {
            ort_sgemm(a.data<float>().data(), b.data<float>().data(), o.data(), m * static_cast<int64_t>(ia.size()), k,
                      n);
            return;
        }
        for (size_t i = 0; i < ia.size(); ++i)
            ort_sgemm(a.data<float>().data() + ia[i] * m * k, b.data<float>().data() + ib[i] * k * n,
                      o.data() + i * m * n, m, k, n);
        return;
    }
    if (a.type() == DataType::Float && m > 0 && n > 0 && k > 0) {
        // A B shared by every batch (a weight) makes the batches one tall matrix: a
        // (seq, 1, k) x (k, n) projection is then one GEMM instead of seq products of one row.
        const bool shared_b = std::all_of(b_batch.begin(), b_batch.end(), [](int64_t d) { return d == 1; });
        if (shared_b && !a_batch.empty()) {
            int64_t rows = m;
            for (int64_t d : batch) rows *= d;
            return dnnl_matmul(ctx, {rows, k}, {k, n}, shape, out, bias);
        }
        return dnnl_matmul(ctx, as, bs, shape, out, bias);
    }
    if (bias) {  // nothing to multiply: every output is its column's bias
        out[0] = Tensor::uninitialized(DataType::Float, shape);
        auto o = out[0].mutable_data<float>();
        for (size_t i = 0; i < o.size(); ++i) o[i] = bias->data<float>()[i % n];
        return;
    }
    dispatch_numeric(a.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        {
            out[0] = make_tensor<T>(shape);
            auto o = mutable_view<T>(out[0]);
            const auto av = view<T>(a);
            const auto bv = view<T>(b);
            for (size_t i = 0; i < ia.size(); ++i) {
                Eigen::Map<const RowMatrix<T>> x(av.data() + ia[i] * m * k, m, k);
                Eigen::Map<const RowMatrix<T>> y(bv.data() + ib[i] * k * n, k, n);
                Eigen::Map<RowMatrix<T>> z(o.data() + i * m * n, m, n);
                z.noalias() = x * y;
            }
        }
    });
}

// A x B for an A of a few rows (a classifier at batch 1): B is read once,
// straight through, which is all the work there is (oneDNN's packed product
// reads it about half as fast here).
void few_rows_product(const float* a, const float* b, float* y, int64_t m, int64_t k, int64_t n, bool tb) {
    if (tb) {  // B is [N, K]: one dot product per row of B
        parallel_for(n, n * k > kParallelGrain, [&](int64_t j) {
            for (int64_t i = 0; i < m; ++i) {
                const float* row = b + j * k;
                const float* x = a + i * k;
                float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int64_t q = 0; q < k; ++q) sum += x[q] * row[q];
                y[i * n + j] = sum;
            }
        });
        return;
    }
    // B is [K, N]: rows of B scaled into the output, columns split between threads.
    constexpr int64_t kColumns = 256;
    parallel_for_pieces(n, kColumns, n * k > kParallelGrain, [&](int64_t j0, int64_t j1) {
        for (int64_t i = 0; i < m; ++i) {
            float* out = y + i * n;
            for (int64_t j = j0; j < j1; ++j) out[j] = 0.0f;
            for (int64_t q = 0; q < k; ++q) {
                const float scale = a[i * k + q];
                const float* row = b + q * n;
#pragma omp simd
                for (int64_t j = j0; j < j1; ++j) out[j] += scale * row[j];
            }
        }
    });
}

// Float A x B of Gemm: a transposed operand is read through its strides.
void dnnl_gemm_product(KernelContext& ctx, bool ta, bool tb, int64_t m, int64_t k, int64_t n, Tensor& y,
                       const Tensor* bias) {
    using dnnl::memory;
    const memory::desc a({m, k}, memory::data_type::f32, ta ? memory::dims{1, m} : memory::dims{k, 1});
    const memory::desc b({k, n}, memory::data_type::f32, tb ? memory::dims{1, k} : memory::dims{n, 1});
    dnnl_product(ctx, {m, k, n, ta, tb}, a, b, memory::desc({m, n}, memory::data_type::f32, memory::format_tag::ab), y,
                 bias);
}

void gemm(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& a = ctx.input(0);
    const auto& b = ctx.input(1);
    if (a.shape().size() != 2 || b.shape().size() != 2) ctx.fail("A and B must be matrices");
    const bool ta = ctx.attributes.get_int("transA", 0) != 0;
    const bool tb = ctx.attributes.get_int("transB", 0) != 0;
    const double alpha = ctx.attributes.get_float("alpha", 1.0f);
    const double beta = ctx.attributes.get_float("beta", 1.0f);
    const int64_t m = ta ? a.shape()[1] : a.shape()[0], k = ta ? a.shape()[0] : a.shape()[1];
    const int64_t n = tb ? b.shape()[0] : b.shape()[1];
    if ((tb ? b.shape()[1] : b.shape()[0]) != k) ctx.fail("the inner dimensions of A and B differ");
    dispatch_numeric(a.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        {
            out[0] = make_tensor<T>({m, n});
            Eigen::Map<RowMatrix<T>> z(mutable_view<T>(out[0]).data(), m, n);
            if constexpr (std::is_same_v<T, float>) {
                // A C of one value per column (a layer's bias) is added by oneDNN as it writes.
                const Tensor* c = ctx.has_input(2) ? &ctx.input(2) : nullptr;
                if (c &&
                    (alpha != 1.0 || beta != 1.0 || c->size() != n || c->shape().empty() || c->shape().back() != n))
                    c = nullptr;
                if (m > 0 && m <= 2 && !ta && n > 0 && k > 0) {
                    few_rows_product(view<float>(a).data(), view<float>(b).data(), z.data(), m, k, n, tb);
                } else if (m > 0 && n > 0 && k > 0) {
                    dnnl_gemm_product(ctx, ta, tb, m, k, n, out[0], c);
                    if (c) return;
                }
            } else {
                Eigen::Map<const RowMatrix<T>> x(view<T>(a).data(), a.shape()[0], a.shape()[1]);
                Eigen::Map<const RowMatrix<T>> y(view<T>(b).data(), b.shape()[0], b.shape()[1]);
                if (ta && tb)
                    z.noalias() = x.transpose() * y.transpose();
                else if (ta)
                    z.noalias() = x.transpose() * y;
                else if (tb)
                    z.noalias() = x * y.transpose();
                else
                    z.noalias() = x * y;
            }
            if (alpha != 1.0) z *= static_cast<T>(alpha);
            if (ctx.has_input(2) && beta != 0.0) {
                const auto& c = ctx.input(2);
                const std::vector<int64_t> shape{m, n};
                if (broadcast_shapes(ctx, c.shape(), shape) != shape) ctx.fail("C does not broadcast to (M, N)");
                const auto index = broadcast_index(c.shape(), shape);
                const auto cv = view<T>(c);
                T* zp = z.data();
                for (size_t i = 0; i < index.size(); ++i) zp[i] = static_cast<T>(zp[i] + beta * cv[index[i]]);
            }
        }
    });
}

const KernelRegistration kKernels[] = {
    {"", "MatMul", 1, 21, matmul},
    {kInternalDomain, "MatMul", 0, 1, matmul},
    {"", "Gemm", 7, 21, gemm},
};

}  // namespace
}  // namespace vaiq::runtime
