#include "strata/model_folder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "strata/kernels.h"

namespace strata {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::I8: case DType::U8: case DType::BOOL: case DType::F8_E4M3: case DType::F8_E5M2: return 1;
    default: return 0;
  }
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32"; case DType::F16: return "F16"; case DType::BF16: return "BF16";
    case DType::F64: return "F64"; case DType::I64: return "I64"; case DType::I32: return "I32";
    case DType::I16: return "I16"; case DType::I8: return "I8"; case DType::U8: return "U8";
    case DType::BOOL: return "BOOL"; case DType::F8_E4M3: return "F8_E4M3"; case DType::F8_E5M2: return "F8_E5M2";
    default: return "OTHER";
  }
}

bool dtype_supported(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

static DType parse_dtype(const std::string& s) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"F64", DType::F64},
      {"I64", DType::I64}, {"I32", DType::I32}, {"I16", DType::I16}, {"I8", DType::I8},
      {"U8", DType::U8}, {"BOOL", DType::BOOL}, {"F8_E4M3", DType::F8_E4M3}, {"F8_E5M2", DType::F8_E5M2}};
  for (const auto& p : table)
    if (s == p.first) return p.second;
  return DType::OTHER;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < shape.size(); ++i) o << (i ? ", " : "") << shape[i];
  o << "]";
  return o.str();
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorInfo> SafetensorsFile::parse_header(const std::string& header, uint64_t data_size) {
  Json j;
  try {
    j = Json::parse(header, 16);
  } catch (const std::invalid_argument& e) {
    throw ModelFolderError(std::string("safetensors header: ") + e.what());
  }
  if (!j.is_object()) throw ModelFolderError("safetensors header: not a JSON object");
  std::vector<TensorInfo> out;
  for (const auto& kv : j.object) {
    if (kv.first == "__metadata__") continue;
    const std::string& name = kv.first;
    const Json& t = kv.second;
    auto bad = [&](const std::string& why) {
      return ModelFolderError("safetensors header: tensor '" + name + "': " + why);
    };
    if (!t.is_object()) throw bad("entry is not an object");
    const Json* dt = t.find("dtype");
    const Json* sh = t.find("shape");
    const Json* off = t.find("data_offsets");
    if (!dt || !dt->is_string()) throw bad("missing string field 'dtype'");
    if (!sh || !sh->is_array()) throw bad("missing array field 'shape'");
    if (!off || !off->is_array() || off->array.size() != 2) throw bad("field 'data_offsets' must be [begin, end]");
    TensorInfo ti;
    ti.name = name;
    ti.dtype_str = dt->string;
    ti.dtype = parse_dtype(dt->string);
    if (ti.dtype == DType::OTHER) throw bad("unknown dtype '" + dt->string + "'");
    if (sh->array.size() > 8) throw bad("too many dimensions");
    uint64_t numel = 1;
    for (const Json& d : sh->array) {
      if (!d.is_number() || !d.integral || d.integer < 0) throw bad("shape entries must be non-negative integers");
      if (d.integer > (int64_t(1) << 40)) throw bad("dimension too large");
      ti.shape.push_back(d.integer);
      numel *= uint64_t(d.integer);
      if (numel > (uint64_t(1) << 42)) throw bad("too many elements");
    }
    uint64_t b = 0, e = 0;
    for (int k = 0; k < 2; ++k) {
      const Json& o = off->array[k];
      if (!o.is_number() || !o.integral || o.integer < 0) throw bad("data_offsets must be non-negative integers");
      (k == 0 ? b : e) = uint64_t(o.integer);
    }
    if (e < b) throw bad("data_offsets end before begin");
    if (e > data_size) {
      std::ostringstream m;
      m << "data_offsets end " << e << " past the end of the data (" << data_size << " bytes; file truncated?)";
      throw bad(m.str());
    }
    if (e - b != numel * dtype_size(ti.dtype)) {
      std::ostringstream m;
      m << "byte size " << (e - b) << " does not match shape " << shape_str(ti.shape) << " of " << ti.dtype_str;
      throw bad(m.str());
    }
    ti.data = reinterpret_cast<const uint8_t*>(uintptr_t(b));
    ti.nbytes = size_t(e - b);
    out.push_back(std::move(ti));
  }
  // Two tensors sharing bytes would alias each other's weights: refuse (empty tensors take no bytes).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : out)
    if (t.nbytes) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return uintptr_t(a->data) < uintptr_t(b->data);
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    if (uintptr_t(b.data) < uintptr_t(a.data) + a.nbytes)
      throw ModelFolderError("safetensors header: tensor '" + b.name + "': data_offsets overlap those of tensor '" +
                            a.name + "'");
  }
  return out;
}

static bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Opens `path` read-only if it is a regular file (O_NONBLOCK: a FIFO must not hang the open); returns fd and size.
static int open_regular(const std::string& path, size_t& size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw ModelFolderError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) { ::close(fd); throw ModelFolderError("cannot stat " + path); }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ModelFolderError(path + ": not a regular file (a FIFO, device or directory); refusing to read it");
  }
  size = size_t(st.st_size);
  return fd;
}

// Reads exactly `size` bytes from fd into dst; throws if the file is shorter now (changed while loading).
static void read_all(int fd, void* dst, size_t size, const std::string& path) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, static_cast<uint8_t*>(dst) + done, size - done, off_t(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw ModelFolderError(path + ": read failed or the file shrank while loading");
    done += size_t(n);
  }
}

SafetensorsFile::SafetensorsFile(const std::string& path, bool use_mmap) : path_(path) {
  size_t size = 0;
  int fd = open_regular(path, size);
  if (size < 8) { ::close(fd); throw ModelFolderError(path + ": truncated safetensors file (" + std::to_string(size) + " bytes)"); }
  const uint8_t* base = nullptr;
  if (use_mmap) {
    // A mapped file that is truncated or rewritten in place while the engine runs changes or loses pages
    // under it (SIGBUS on a truncation): replace checkpoints by renaming a new file, or load with mmap=false.
    void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) throw ModelFolderError("cannot mmap " + path);
    map_ = m;
    map_size_ = size;
    base = static_cast<const uint8_t*>(m);
  } else {
    // 2 MiB aligned (tensor data keeps the alignment it would have in a page-aligned mapping) and advised as
    // transparent huge pages: decode streams these rows (bf16 decode x1.02 over the 4 KiB-paged mapping)
    constexpr size_t kHuge = size_t(2) << 20;
    buffer_ = std::aligned_alloc(kHuge, (size + kHuge - 1) / kHuge * kHuge);
#ifdef MADV_HUGEPAGE
    if (buffer_) ::madvise(buffer_, (size + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);
#endif
    if (!buffer_) { ::close(fd); throw ModelFolderError(path + ": out of memory reading " + std::to_string(size) + " bytes"); }
    try {
      read_all(fd, buffer_, size, path);
    } catch (...) {
      ::close(fd);
      std::free(buffer_);
      buffer_ = nullptr;
      throw;
    }
    ::close(fd);
    base = static_cast<const uint8_t*>(buffer_);
  }
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | base[k];
  try {
    if (n > size - 8) {
      std::ostringstream msg;
      msg << path << ": truncated safetensors file (header claims " << n << " bytes, file has " << size << ")";
      throw ModelFolderError(msg.str());
    }
    std::string header(reinterpret_cast<const char*>(base + 8), size_t(n));
    tensors_ = parse_header(header, size - 8 - n);
  } catch (const ModelFolderError& e) {
    if (map_) munmap(map_, map_size_);
    map_ = nullptr;
    std::free(buffer_);
    buffer_ = nullptr;
    std::string msg = e.what();
    if (msg.rfind(path, 0) != 0) msg = path + ": " + msg;
    throw ModelFolderError(msg);
  }
  const uint8_t* data = base + 8 + n;
  for (auto& t : tensors_) t.data = data + reinterpret_cast<uintptr_t>(t.data);
  if (map_) madvise(map_, map_size_, MADV_WILLNEED);
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_size_);
  std::free(buffer_);
}

static std::string read_text(const std::string& path) {
  if (!exists(path)) throw ModelFolderError("missing file " + path);
  size_t size = 0;
  int fd = open_regular(path, size);
  if (size > (size_t(64) << 20)) { ::close(fd); throw ModelFolderError(path + ": larger than 64 MiB; not a config file"); }
  std::string out(size, '\0');
  try {
    read_all(fd, out.data(), size, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

// Config values that, out of range, would load silently and compute garbage (zeros, NaN) or huge buffers.
static void check_config_ranges(const Json& cfg, const std::string& cfg_path) {
  static const char* const positive_ints[] = {
      "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
      "intermediate_size", "max_position_embeddings", "full_attention_interval", "linear_num_key_heads",
      "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
      "decoder_sparse_step"};
  // 0 is meaningful here: a dense model has no experts
  static const char* const counts[] = {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                       "shared_expert_intermediate_size"};
  const int64_t limit = int64_t(1) << 24;
  auto check_int = [&](const char* key, int64_t lo) {
    const Json* v = cfg.find(key);
    if (!v || v->is_null()) return;
    if (!v->is_number() || !v->integral || v->integer < lo || v->integer > limit) {
      std::ostringstream m;
      m << cfg_path << ": field '" << key << "' must be an integer in " << lo << ".." << limit << ", got ";
      if (v->is_number()) m << v->number; else m << "a non-number";
      throw ModelFolderError(m.str());
    }
  };
  for (const char* key : positive_ints) check_int(key, 1);
  for (const char* key : counts) check_int(key, 0);
  auto check_float = [&](const Json* v, const std::string& key, bool allow_zero) {
    if (!v || v->is_null()) return;
    if (!v->is_number() || !std::isfinite(v->number) || v->number < 0 || (!allow_zero && v->number == 0)) {
      std::ostringstream m;
      m << cfg_path << ": field '" << key << "' must be a finite number " << (allow_zero ? ">= 0" : "> 0");
      if (v->is_number()) m << ", got " << v->number;
      throw ModelFolderError(m.str());
    }
  };
  check_float(cfg.find("rope_theta"), "rope_theta", false);
  check_float(cfg.find("rms_norm_eps"), "rms_norm_eps", true);
  check_float(cfg.find("partial_rotary_factor"), "partial_rotary_factor", false);
  if (const Json* rp = cfg.find("rope_parameters"); rp && rp->is_object()) {
    check_float(rp->find("rope_theta"), "rope_parameters.rope_theta", false);
    check_float(rp->find("partial_rotary_factor"), "rope_parameters.partial_rotary_factor", false);
  }
  if (const Json* v = cfg.find("partial_rotary_factor"); v && v->is_number() && v->number > 1)
    throw ModelFolderError(cfg_path + ": field 'partial_rotary_factor' must be <= 1");
}

ModelFolder::ModelFolder(const std::string& dir, bool use_mmap) : dir_(dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw ModelFolderError("not a model folder: " + dir);
  std::string cfg_path = dir + "/config.json";
  try {
    config_ = Json::parse(read_text(cfg_path));
  } catch (const std::invalid_argument& e) {
    throw ModelFolderError(cfg_path + ": " + e.what());
  }
  if (!config_.is_object()) throw ModelFolderError(cfg_path + ": not a JSON object");
  check_config_ranges(config_, cfg_path);

  std::vector<std::string> shard_names;
  std::string index_path = dir + "/model.safetensors.index.json";
  if (exists(dir + "/model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else if (exists(index_path)) {
    Json idx;
    try {
      idx = Json::parse(read_text(index_path));
    } catch (const std::invalid_argument& e) {
      throw ModelFolderError(index_path + ": " + e.what());
    }
    const Json* wm = idx.find("weight_map");
    if (!wm || !wm->is_object()) throw ModelFolderError(index_path + ": missing object 'weight_map'");
    std::set<std::string> seen;
    for (const auto& kv : wm->object) {
      if (!kv.second.is_string()) throw ModelFolderError(index_path + ": weight_map['" + kv.first + "'] is not a file name");
      const std::string& f = kv.second.string;
      if (f.find('/') != std::string::npos) throw ModelFolderError(index_path + ": shard name '" + f + "' has a path separator");
      if (seen.insert(f).second) shard_names.push_back(f);
    }
  } else {
    throw ModelFolderError(dir + ": neither model.safetensors nor model.safetensors.index.json found");
  }
  for (const auto& f : shard_names) {
    files_.push_back(std::make_unique<SafetensorsFile>(dir + "/" + f, use_mmap));
    for (const auto& t : files_.back()->tensors()) {
      if (by_name_.count(t.name)) throw ModelFolderError("tensor '" + t.name + "' appears in two shards");
      by_name_[t.name] = &t;
    }
  }
}

int64_t ModelFolder::cfg_int(const std::string& key) const {
  const Json* v = config_.find(key);
  if (!v) throw ModelFolderError("config.json: missing field '" + key + "'");
  if (!v->is_number() || !v->integral) throw ModelFolderError("config.json: field '" + key + "' must be an integer");
  return v->integer;
}

int64_t ModelFolder::cfg_int(const std::string& key, int64_t fallback) const {
  const Json* v = config_.find(key);
  if (!v || v->is_null()) return fallback;
  return cfg_int(key);
}

double ModelFolder::cfg_float(const std::string& key, double fallback) const {
  const Json* v = config_.find(key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_number()) throw ModelFolderError("config.json: field '" + key + "' must be a number");
  return v->number;
}

bool ModelFolder::cfg_bool(const std::string& key, bool fallback) const {
  const Json* v = config_.find(key);
  if (!v || v->is_null()) return fallback;
  if (v->kind != Json::Kind::Bool) throw ModelFolderError("config.json: field '" + key + "' must be true or false");
  return v->boolean;
}

std::string ModelFolder::cfg_str(const std::string& key, const std::string& fallback) const {
  const Json* v = config_.find(key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_string()) throw ModelFolderError("config.json: field '" + key + "' must be a string");
  return v->string;
}

std::string ModelFolder::model_type() const {
  std::string t = cfg_str("model_type", "");
  if (t.empty()) throw ModelFolderError("config.json: missing field 'model_type'");
  return t;
}

const TensorInfo& ModelFolder::tensor(const std::string& name, const std::vector<int64_t>& shape) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw ModelFolderError(dir_ + ": missing tensor '" + name + "' (expected shape " + shape_str(shape) + ")");
  const TensorInfo& t = *it->second;
  if (t.shape != shape)
    throw ModelFolderError(dir_ + ": tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected " + shape_str(shape));
  if (!dtype_supported(t.dtype) && t.dtype != DType::I8)
    throw ModelFolderError(dir_ + ": tensor '" + name + "' has unsupported dtype " + t.dtype_str +
                           " (supported: F32, F16, BF16, or I8 with a per-row '" + name + "_scale')");
  used_.insert(name);
  return t;
}

// An I8 tensor's per-row scales: `<name>_scale`, [rows, 1] or [rows], F32 (F16/BF16 converted), finite
// and > 0; w[r] = scale[r] * q[r] (symmetric, compressed-tensors' "channel" strategy). Copied into owned
// float32 (rows * 4 bytes): the int8 rows themselves stay views into the file.
const float* ModelFolder::int8_scale(const std::string& name, int64_t rows) {
  const std::string sn = name + "_scale";
  if (by_name_.count(name + "_zero_point"))
    throw ModelFolderError(dir_ + ": int8 tensor '" + name + "' has a zero point ('" + name +
                           "_zero_point'); only symmetric per-row scales are supported");
  auto it = by_name_.find(sn);
  if (it == by_name_.end())
    throw ModelFolderError(dir_ + ": int8 tensor '" + name + "' has no scale tensor '" + sn + "' (expected F32 [" +
                           std::to_string(rows) + ", 1])");
  const TensorInfo& t = *it->second;
  if (!(t.shape == std::vector<int64_t>{rows, 1} || t.shape == std::vector<int64_t>{rows}))
    throw ModelFolderError(dir_ + ": scale tensor '" + sn + "' of int8 tensor '" + name + "' has shape " +
                           shape_str(t.shape) + ", expected [" + std::to_string(rows) +
                           ", 1] (one scale per row; group-wise scales are not supported)");
  if (!dtype_supported(t.dtype))
    throw ModelFolderError(dir_ + ": scale tensor '" + sn + "' has unsupported dtype " + t.dtype_str +
                           " (supported: F32, F16, BF16)");
  Mat m;
  m.dtype = t.dtype;
  m.data = t.data;
  m.rows = 1;
  m.cols = rows;
  auto out = std::make_unique<float[]>(size_t(rows));
  kernels::row_f32(m, 0, out.get());
  for (int64_t r = 0; r < rows; ++r)
    if (!(std::isfinite(out[size_t(r)]) && out[size_t(r)] > 0.f))
      throw ModelFolderError(dir_ + ": scale tensor '" + sn + "' has a non-positive or non-finite scale at row " +
                             std::to_string(r));
  used_.insert(sn);
  scales_.push_back(std::move(out));
  return scales_.back().get();
}

Mat ModelFolder::mat(const std::string& name, const std::vector<int64_t>& shape) {
  const TensorInfo& t = tensor(name, shape);
  Mat m;
  m.dtype = t.dtype;
  m.data = t.data;
  if (shape.size() == 1) { m.rows = 1; m.cols = shape[0]; }
  else if (shape.size() == 2) { m.rows = shape[0]; m.cols = shape[1]; }
  else { m.rows = shape[0]; m.cols = t.numel() / (shape[0] ? shape[0] : 1); }
  if (t.dtype == DType::I8) m.scale = int8_scale(name, m.rows);
  return m;
}

std::vector<float> ModelFolder::to_f32(const std::string& name, const std::vector<int64_t>& shape) {
  Mat m = mat(name, shape);
  std::vector<float> out(size_t(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) kernels::row_f32(m, r, out.data() + r * m.cols);
  return out;
}

void ModelFolder::check_all_used(const std::vector<std::string>& ignored_prefixes) const {
  std::vector<std::string> extra;
  for (const auto& kv : by_name_) {
    if (used_.count(kv.first)) continue;
    bool ignored = false;
    for (const auto& p : ignored_prefixes)
      if (kv.first.rfind(p, 0) == 0) ignored = true;
    if (!ignored) extra.push_back(kv.first);
  }
  if (!extra.empty()) {
    std::string msg = dir_ + ": unexpected tensor(s) not used by the model: ";
    for (size_t i = 0; i < extra.size() && i < 5; ++i) msg += (i ? ", '" : "'") + extra[i] + "'";
    if (extra.size() > 5) msg += " and " + std::to_string(extra.size() - 5) + " more";
    throw ModelFolderError(msg);
  }
}

void ModelFolder::check_finite() const {
  // Non-finite = all exponent bits set, in each format's own layout.
  for (const auto& kv : by_name_) {
    const TensorInfo& t = *kv.second;
    const int64_t n = t.numel();
    int64_t bad = -1;
    if (t.dtype == DType::F32) {
      const uint32_t* p = reinterpret_cast<const uint32_t*>(t.data);
      for (int64_t i = 0; i < n && bad < 0; ++i) {
        uint32_t w;
        std::memcpy(&w, p + i, 4);
        if ((w & 0x7f800000u) == 0x7f800000u) bad = i;
      }
    } else if (t.dtype == DType::F16 || t.dtype == DType::BF16) {
      const uint16_t mask = t.dtype == DType::F16 ? 0x7c00 : 0x7f80;
      const uint16_t* p = reinterpret_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < n && bad < 0; ++i) {
        uint16_t w;
        std::memcpy(&w, p + i, 2);
        if ((w & mask) == mask) bad = i;
      }
    }
    if (bad >= 0)
      throw ModelFolderError(dir_ + ": tensor '" + t.name + "' holds NaN or infinity (element " + std::to_string(bad) + ")");
  }
}

std::vector<std::string> ModelFolder::names() const {
  std::vector<std::string> out;
  for (const auto& kv : by_name_) out.push_back(kv.first);
  return out;
}

}  // namespace strata
