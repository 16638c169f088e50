#include "runtime/kernels/dnnl_util.hpp"

#include <string_view>

namespace vaiq::runtime {

using dnnl::memory;

dnnl::engine& cpu_engine() {
    static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    return engine;
}

memory::format_tag plain_tag(size_t rank, bool grouped) {
    using t = memory::format_tag;
    if (grouped) {
        switch (rank) {
            case 4: return t::goiw;
            case 5: return t::goihw;
            case 6: return t::goidhw;
        }
    }
    switch (rank) {
        case 1: return t::a;
        case 2: return t::ab;
        case 3: return t::abc;
        case 4: return t::abcd;
        case 5: return t::abcde;
        case 6: return t::abcdef;
    }
    return t::undef;
}

bool is_reference(const dnnl::primitive_desc_base& pd) {
    return std::string_view(pd.impl_info_str()).starts_with("ref");
}

memory::dims dims_of(const std::vector<int64_t>& shape) { return memory::dims(shape.begin(), shape.end()); }

memory::desc constant_weights_desc(const memory::desc& b) {
    const auto dims = b.dims();
    constexpr int64_t kAliasingFloats = 1024, kPadding = 16;
    // Measured on AVX2 only: with AVX-512 oneDNN keeps its own choice.
    if (dims.size() < 2 || dims.back() % kAliasingFloats != 0 || cpu_features().avx512f)
        return memory::desc(dims, memory::data_type::f32, memory::format_tag::any);
    memory::dims strides(dims.size(), 1);
    strides[dims.size() - 2] = dims.back() + kPadding;
    for (size_t i = dims.size() - 2; i-- > 0;) strides[i] = strides[i + 1] * dims[i + 1];
    return memory::desc(dims, memory::data_type::f32, strides);
}

memory wrap(const memory::desc& desc, const Tensor& t) {
    // oneDNN takes a non-const handle but only reads inputs.
    return memory(desc, cpu_engine(), const_cast<std::byte*>(t.bytes().data()));
}

memory call_memory(const memory::desc& desc, Tensor& storage) {
    storage = Tensor::uninitialized(DataType::UInt8, {static_cast<int64_t>(desc.get_size())});
    return memory(desc, cpu_engine(), storage.mutable_bytes().data());
}

memory reordered(dnnl::stream& stream, memory src, const memory::desc& wanted, Tensor* storage) {
    if (src.get_desc() == wanted) return src;
    memory dst = storage ? call_memory(wanted, *storage) : memory(wanted, cpu_engine());
    dnnl::reorder(src, dst).execute(stream, src, dst);
    return dst;
}

memory operand(dnnl::stream& stream, const Tensor& t, bool constant, const memory::desc& user,
               const memory::desc& wanted, ConstantOperand& cache, Tensor& storage) {
    if (constant && cache.of == &t) return cache.memory;
    memory m = reordered(stream, wrap(user, t), wanted, constant ? nullptr : &storage);
    if (!constant) return m;
    // Keep a copy of our own: the cache must not alias a tensor it does not own.
    if (m.get_data_handle() == t.bytes().data()) {
        memory copy(wanted, cpu_engine());
        copy_bytes(copy.get_data_handle(), t.bytes().data(), t.bytes().size());
        m = copy;
    }
    cache = {&t, m};
    return m;
}

}  // namespace vaiq::runtime
