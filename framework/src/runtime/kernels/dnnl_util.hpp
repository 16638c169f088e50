// Shared oneDNN plumbing: one CPU engine, plain layouts, wrapping tensors.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include "runtime/kernels/common.hpp"

namespace vaiq::runtime {

dnnl::engine& cpu_engine();

/// The row-major layout tag of a rank (a, ab, abc, ...), or goiw/goihw/goidhw for grouped weights.
dnnl::memory::format_tag plain_tag(size_t rank, bool grouped = false);

/// Whether oneDNN found no optimised kernel for `pd` and runs its reference loops.
bool is_reference(const dnnl::primitive_desc_base& pd);

dnnl::memory::dims dims_of(const std::vector<int64_t>& shape);

/// A memory object over a tensor's bytes (no copy).
dnnl::memory wrap(const dnnl::memory::desc& desc, const Tensor& t);

/// Memory of layout `desc` for one call, in `storage` (made here): tensor
/// storage, which keeps freed blocks for the next call (large ones in huge
/// pages), where oneDNN's own allocation is the C library's heap, which a large
/// free trims. A 1024 x 1024 convolution's channels-first input and output,
/// reordered to and from oneDNN's blocked layout, were faulted in page by page
/// on every call.
dnnl::memory call_memory(const dnnl::memory::desc& desc, Tensor& storage);

/// `src` in layout `wanted`: itself when it already is, else a reordered copy in
/// `storage` (call_memory), or, without it, in memory oneDNN allocates and owns.
dnnl::memory reordered(dnnl::stream& stream, dnnl::memory src, const dnnl::memory::desc& wanted,
                       Tensor* storage = nullptr);

/// The layout a constant matrix product operand B (float, plain `b`) is kept
/// in: oneDNN's choice, except that without AVX-512 rows a multiple of 4 KB
/// apart get 16 floats of padding each. Rows that far apart share cache sets:
/// oneDNN's AVX2 SGEMM took 2.2 ms for 197 x 256 x 1024 (vit_small's first MLP
/// layer) with B kept 4 KB-aligned, 1.1 ms with the padding (ONNX Runtime 1.3).
dnnl::memory::desc constant_weights_desc(const dnnl::memory::desc& b);

/// A constant operand (an initializer: same object every run) kept in a
/// primitive's layout after its first reorder.
struct ConstantOperand {
    const Tensor* of = nullptr;
    dnnl::memory memory;
};

/// `t` in layout `wanted`. When `constant`, the reordered copy is made once and
/// kept in `cache`; otherwise it is made per call in `storage` (or `t` is used in place).
dnnl::memory operand(dnnl::stream& stream, const Tensor& t, bool constant, const dnnl::memory::desc& user,
                     const dnnl::memory::desc& wanted, ConstantOperand& cache, Tensor& storage);

}  // namespace vaiq::runtime
