// vaiq/spool.hpp - tensors put aside to be read back later: in memory up to a
// budget, beyond it in an unnamed temporary file that disappears with the
// process, even a killed one. Lets a comparison run one model over its data,
// drop it, then run the other, instead of holding both models' weights at once;
// parks a model's weights on disk while another model runs; keeps what an
// algorithm records (a loop body's iterations) within a memory budget.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "vaiq/export.hpp"
#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

class VAIQ_API TensorSpool {
  public:
    explicit TensorSpool(size_t memory_budget = size_t{256} << 20);
    ~TensorSpool();
    TensorSpool(const TensorSpool&) = delete;
    TensorSpool& operator=(const TensorSpool&) = delete;

    /// Stores a copy of a numeric tensor; returns its index.
    size_t put(const Tensor& value);
    /// The tensor stored under `index`, read back from the file if it went there.
    Tensor get(size_t index) const;
    /// Frees what `index` holds in memory (the budget it took serves later puts);
    /// it cannot be read after.
    void drop(size_t index);
    size_t size() const { return entries_.size(); }
    /// Bytes that went to the file.
    size_t spilled_bytes() const { return file_bytes_; }

    /// Moves the data of `model`'s initializers of `min_bytes` and more into the
    /// file, leaving references that read it back when used (deferred external
    /// data), so that a large model in memory costs little while another runs.
    /// The model must not outlive the spool. Returns the bytes moved.
    size_t park_initializers(Model& model, size_t min_bytes);

  private:
    struct Entry {
        Tensor held;  ///< the value, unless it went to the file
        bool in_file = false;
        bool dropped = false;
        DataType type = DataType::Float;
        std::vector<int64_t> shape;
        size_t offset = 0;
    };
    size_t append(std::span<const std::byte> bytes);

    std::vector<Entry> entries_;
    size_t budget_;
    size_t held_bytes_ = 0;
    size_t file_bytes_ = 0;
    int fd_ = -1;
};

}  // namespace vaiq
