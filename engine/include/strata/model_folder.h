// Hugging Face model folders: config.json plus model.safetensors or a sharded
// model.safetensors.index.json. Tensors are memory-mapped (or, with use_mmap=false, read into one buffer per
// file) and handed out as views, never copied. Only regular files are opened (a FIFO would hang the load).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/json.h"

namespace strata {

// Raised for every problem with a model folder's files (Python: strata_lab._engine.ModelFolderError).
class ModelFolderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Element types a safetensors header may declare. Only F32/F16/BF16 are computed with.
enum class DType : uint8_t { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2, OTHER };
size_t dtype_size(DType d);
const char* dtype_name(DType d);
bool dtype_supported(DType d);  // F32, F16, BF16

// A row-major 2-D view [rows, cols] of weights in their stored dtype (1-D tensors have rows = 1).
struct Mat {
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
  const float* scale = nullptr;  // I8 (quantised at load): one scale per row, w[r] = scale[r] * q[r]
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::OTHER;
  std::string dtype_str;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping
  size_t nbytes = 0;
  int64_t numel() const;
};

// One safetensors file: the header is validated completely before any tensor is handed out.
class SafetensorsFile {
 public:
  // mmap (or read) + parse; throws ModelFolderError
  explicit SafetensorsFile(const std::string& path, bool use_mmap = true);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }
  size_t mapped_bytes() const { return map_ ? map_size_ : 0; }  // 0 when read into memory (use_mmap=false)

  // Parses and checks a header against a data area of data_size bytes (exposed for fuzzing).
  // Offsets in the result are relative to the data area (data pointers are offsets cast to pointers).
  static std::vector<TensorInfo> parse_header(const std::string& header, uint64_t data_size);

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  void* buffer_ = nullptr;  // use_mmap=false: the whole file, read at load
  std::vector<TensorInfo> tensors_;
};

// A model folder: the parsed config and every tensor of every shard by name.
class ModelFolder {
 public:
  // Parses and range-checks config.json, opens every shard; throws ModelFolderError naming the field or file.
  explicit ModelFolder(const std::string& dir, bool use_mmap = true);
  const std::string& dir() const { return dir_; }
  const Json& config() const { return config_; }

  // Config accessors: throw ModelFolderError naming the field when missing or mistyped.
  int64_t cfg_int(const std::string& key) const;
  int64_t cfg_int(const std::string& key, int64_t fallback) const;
  double cfg_float(const std::string& key, double fallback) const;
  bool cfg_bool(const std::string& key, bool fallback) const;
  std::string cfg_str(const std::string& key, const std::string& fallback) const;
  std::string model_type() const;

  bool has(const std::string& name) const { return by_name_.count(name) != 0; }
  // The tensor `name` with exactly `shape` in a computable dtype (F32, F16, BF16, I8); marks it used.
  const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& shape);
  // As a 2-D view: [rows, cols] for a 2-D tensor, [1, n] for a 1-D one. An I8 tensor (an int8-stored
  // model folder, docs/ENGINE.md "int8 model folders") comes with its per-row scales from `<name>_scale`
  // ([rows, 1] F32; missing, misshapen or non-positive scales throw naming the tensor).
  Mat mat(const std::string& name, const std::vector<int64_t>& shape);
  // A copy converted to float32 (for small tensors: norms).
  std::vector<float> to_f32(const std::string& name, const std::vector<int64_t>& shape);
  // Throws if a tensor was never requested (an extra tensor), except names starting with an ignored prefix.
  void check_all_used(const std::vector<std::string>& ignored_prefixes) const;
  std::vector<std::string> names() const;
  // Throws ModelFolderError naming the first tensor holding NaN or infinity (one pass over the weights).
  void check_finite() const;
  const TensorInfo& tensor_info(const std::string& name) const { return *by_name_.at(name); }
  // Bytes of the shards that are memory-mapped (0 when the weights were read into memory).
  size_t mapped_bytes() const {
    size_t b = 0;
    for (const auto& f : files_) b += f->mapped_bytes();
    return b;
  }

 private:
  std::string dir_;
  Json config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> by_name_;
  std::set<std::string> used_;
  std::vector<std::unique_ptr<float[]>> scales_;  // per-row scales of I8 tensors, as float32
  const float* int8_scale(const std::string& name, int64_t rows);
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace strata
