#include "rlx/rollout/paged_kv_cache.hpp"

#include <algorithm>

#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/cuda/reference.hpp"
#if RLX_WITH_CUDA
#include "cuda/ops.hpp"
#endif

namespace rlx {

PagedKVCache::PagedKVCache(const ModelConfig& cfg, int32_t num_blocks, int32_t block_size, at::ScalarType dtype,
                           at::Device device, Layout layout)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      kv_heads_(cfg.num_kv_heads),
      layers_(cfg.num_layers),
      head_dim_(cfg.head_dim),
      options_(at::TensorOptions().dtype(dtype).device(device)),
      head_major_(layout == Layout::head_major || (layout == Layout::for_device && device.is_cuda())) {
  RLX_CHECK(num_blocks >= 1 && block_size >= 1, "PagedKVCache: num_blocks ({}) and block_size ({}) must be >= 1",
            num_blocks, block_size);
  allocate();
#if RLX_WITH_CUDA
  // A decode batch holds at most one sequence a block: enough for any step of this cache.
  if (device.is_cuda())
    merge_counters_ = at::zeros({static_cast<int64_t>(cuda::decode_attention_counters(
                                    num_blocks, static_cast<int>(cfg.num_heads), static_cast<int>(cfg.num_kv_heads)))},
                                at::TensorOptions().dtype(at::kInt).device(device));
#endif
}

void PagedKVCache::allocate() {
  const int64_t nb = num_blocks_, bs = block_size_;
  for (int64_t l = 0; l < layers_; ++l) {
    // Zero-filled: padded context positions read block 0, which must never hold NaN.
    const auto shape = head_major_ ? std::vector<int64_t>{nb, kv_heads_, bs, head_dim_}
                                   : std::vector<int64_t>{nb, bs, kv_heads_, head_dim_};
    keys_.push_back(at::zeros(shape, options_));
    values_.push_back(at::zeros(shape, options_));
  }
}

void PagedKVCache::release() {
  keys_ = {};
  values_ = {};
}

void PagedKVCache::restore() {
  if (released()) allocate();
}

int64_t PagedKVCache::block_bytes(const ModelConfig& cfg, int32_t block_size, at::ScalarType dtype) {
  return 2 * cfg.num_layers * int64_t{block_size} * cfg.num_kv_heads * cfg.head_dim *
         static_cast<int64_t>(c10::elementSize(dtype));
}

void PagedKVCache::plan(std::span<const Entry> entries) {
  RLX_ASSERT(!entries.empty(), "PagedKVCache::plan: no sequences");
  const auto device = keys_.front().device();
  const int64_t S = static_cast<int64_t>(entries.size()), bs = block_size_;
  int64_t packed = 0, max_new = 0, max_ctx = 0, max_blocks = 0, total_ctx = 0;
  for (const auto& e : entries) {
    RLX_ASSERT(e.new_tokens >= 1 && e.cached >= 0, "PagedKVCache::plan: bad entry");
    const int64_t ctx = e.cached + e.new_tokens;
    RLX_ASSERT(static_cast<int64_t>(e.blocks.size()) * bs >= ctx, "PagedKVCache::plan: {} blocks for {} tokens",
               e.blocks.size(), ctx);
    packed += e.new_tokens;
    total_ctx += ctx;
    max_new = std::max(max_new, e.new_tokens);
    max_ctx = std::max(max_ctx, ctx);
    max_blocks = std::max(max_blocks, (ctx + bs - 1) / bs);
  }
  // Host-side index vectors: O(packed + seqs * max_blocks).
  std::vector<int64_t> positions, write_slot, new_tokens, ctx_len, table(static_cast<size_t>(S * max_blocks), 0);
  positions.reserve(static_cast<size_t>(packed));
  write_slot.reserve(static_cast<size_t>(packed));
  for (const auto& e : entries) {
    for (int64_t t = 0; t < e.new_tokens; ++t) {
      const int64_t pos = e.cached + t;
      positions.push_back(pos);
      write_slot.push_back(e.blocks[static_cast<size_t>(pos / bs)] * bs + pos % bs);
    }
    const int64_t ctx = e.cached + e.new_tokens;
    for (int64_t b = 0; b < (ctx + bs - 1) / bs; ++b)
      table[ctx_len.size() * static_cast<size_t>(max_blocks) + static_cast<size_t>(b)] = e.blocks[static_cast<size_t>(b)];
    new_tokens.push_back(e.new_tokens);
    ctx_len.push_back(ctx);
  }
  auto longs = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(device, /*non_blocking=*/false);
  };
  packed_ = packed;
  seqs_ = S;
  max_new_ = max_new;
  max_ctx_ = max_ctx;
  static_step_ = false;
  positions_ = longs(positions).view({1, packed});
  const auto slots = longs(write_slot);
  write_slots_ = head_major_ ? slots : at::Tensor();
  write_rows_ = pool_rows(slots);
  tables_ = context_lens_ = ctx_rows_ = q_index_ = out_index_ = allowed_ = at::Tensor();
  varlen_ = VarlenSeqs();
#if RLX_WITH_CUDA
  // Decode steps on a GPU read the pool in place (the decode attention kernel): int32 block
  // tables and context lengths.
  if (device.is_cuda() && max_new == 1 && head_major_ &&
      cuda::decode_attention_supported(keys_.front(), keys_.front())) {
    auto ints = [&](const std::vector<int64_t>& v) {
      return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(at::kInt).to(device, /*non_blocking=*/false);
    };
    tables_ = ints(table).view({S, max_blocks});
    context_lens_ = ints(ctx_len);
    return;
  }
#endif
  if (head_major_) {
    // Varlen attention (flash on a GPU): the context gathered ragged, sequence after
    // sequence, no padding and no mask.
    std::vector<int64_t> ctx_slot;
    ctx_slot.reserve(static_cast<size_t>(total_ctx));
    for (const auto& e : entries)
      for (int64_t pos = 0; pos < e.cached + e.new_tokens; ++pos)
        ctx_slot.push_back(e.blocks[static_cast<size_t>(pos / bs)] * bs + pos % bs);
    ctx_rows_ = pool_rows(longs(ctx_slot));
    varlen_ = varlen_seqs(new_tokens, ctx_len, device);
    return;
  }
  // Token-major (CPU): every sequence's context padded to the longest, one batched
  // attention under a mask. Context slots and the mask are expanded on the device from the
  // small tables.
  std::vector<int64_t> q_index(static_cast<size_t>(S * max_new), 0), out_index, query_pos(static_cast<size_t>(S * max_new), -1);
  out_index.reserve(static_cast<size_t>(packed));
  for (int64_t s = 0, p = 0; s < S; ++s) {
    const auto& e = entries[static_cast<size_t>(s)];
    for (int64_t t = 0; t < e.new_tokens; ++t, ++p) {
      q_index[static_cast<size_t>(s * max_new + t)] = p;
      query_pos[static_cast<size_t>(s * max_new + t)] = e.cached + t;
      out_index.push_back(s * max_new + t);
    }
  }
  q_index_ = longs(q_index);
  out_index_ = longs(out_index);
  auto lopts = at::TensorOptions().dtype(at::kLong).device(device);
  auto c = at::arange(max_ctx, lopts);                                                   // [C]
  auto blocks = longs(table).view({S, max_blocks}).index_select(1, c.div(bs, "floor"));  // [S, C]
  auto in_ctx = c.unsqueeze(0) < longs(ctx_len).unsqueeze(1);                             // [S, C]
  // Past a sequence's end: slot 0 of block 0, which must never hold NaN (the pools start zeroed).
  ctx_rows_ = pool_rows(at::where(in_ctx, blocks * bs + c.remainder(bs).unsqueeze(0), at::zeros_like(blocks)).reshape({-1}));
  auto qpos = longs(query_pos).view({S, max_new, 1});
  // A query sees the context up to its own position; a padding query (qpos -1) sees slot 0 only.
  allowed_ = (c.view({1, 1, max_ctx}) <= qpos) | ((qpos < 0) & (c.view({1, 1, max_ctx}) == 0));
}

at::Tensor PagedKVCache::pool_rows(const at::Tensor& slots) const {
  // Rows of a pool viewed as a matrix of rows: head-major, [block * kv_head * block_size,
  // head_dim], one row per (token, head), (block * Hkv + h) * bs + offset; token-major,
  // [block * block_size, kv_head * head_dim], one row per token, its slot.
  if (!head_major_) return slots;
  const int64_t bs = block_size_;
  auto heads = at::arange(kv_heads_, slots.options()) * bs;  // [Hkv]
  return ((slots.div(bs, "floor") * (kv_heads_ * bs) + slots.remainder(bs)).unsqueeze(-1) + heads).reshape({-1});
}

namespace {
// Byte offsets of a static plan's parts for S rows of tables W blocks wide: positions [S], slots
// [S] and write rows [S * Hkv] (int64), context lengths [S] and tables [S * W] (int32). Packed
// for the step's rows and context bucket, so a step stages only what it uses; the buffers are
// sized for the largest (max_seqs, max_blocks), and a CUDA graph of one (rows, bucket) sees the
// same offsets at every replay.
struct StaticLayout {
  int64_t positions, slots, write_rows, lens, tables, bytes;
  StaticLayout(int64_t seqs, int64_t kv_heads, int64_t width) {
    positions = 0;
    slots = positions + seqs * 8;
    write_rows = slots + seqs * 8;
    lens = write_rows + seqs * kv_heads * 8;
    tables = lens + seqs * 4;
    bytes = tables + seqs * width * 4;
  }
};
at::Tensor bytes_as(const at::Tensor& bytes, int64_t offset, int64_t count, at::ScalarType t) {
  return bytes.narrow(0, offset, count * static_cast<int64_t>(c10::elementSize(t))).view(t);
}
}  // namespace

void PagedKVCache::enable_static(int64_t max_seqs, int64_t max_blocks, BlockId pad_block) {
  RLX_CHECK(head_major_, "PagedKVCache::enable_static needs the head-major layout");
  RLX_CHECK(max_seqs >= 1 && max_blocks >= 1 && pad_block >= 0 && pad_block < num_blocks_,
            "PagedKVCache::enable_static: max_seqs {}, max_blocks {}, pad block {} of {}", max_seqs, max_blocks,
            pad_block, num_blocks_);
  const auto device = keys_.front().device();
  const StaticLayout l(max_seqs, kv_heads_, max_blocks);
  static_bytes_ = at::zeros({l.bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  static_host_ = at::zeros({l.bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(device.is_cuda()));
  static_max_seqs_ = max_seqs;
  static_max_blocks_ = max_blocks;
  pad_block_ = pad_block;
}

void PagedKVCache::plan_static(std::span<const Entry> entries, int64_t rows, int64_t max_context) {
  RLX_ASSERT(static_enabled() && !entries.empty() && static_cast<int64_t>(entries.size()) <= rows &&
                 rows <= static_max_seqs_,
             "PagedKVCache::plan_static: {} entries in {} rows of {}", entries.size(), rows, static_max_seqs_);
  const int64_t bs = block_size_;
  if (max_context <= 0) max_context = static_max_blocks_ * bs;
  RLX_ASSERT(max_context <= static_max_blocks_ * bs, "PagedKVCache::plan_static: context bound {} above {}",
             max_context, static_max_blocks_ * bs);
  const int64_t mb = (max_context + bs - 1) / bs;  // the tables' width: the context bucket's blocks
  const StaticLayout l(rows, kv_heads_, mb);
  auto* host = static_host_.data_ptr<uint8_t>();
  auto* positions = reinterpret_cast<int64_t*>(host + l.positions);
  auto* slots = reinterpret_cast<int64_t*>(host + l.slots);
  auto* write_rows = reinterpret_cast<int64_t*>(host + l.write_rows);
  auto* tables = reinterpret_cast<int32_t*>(host + l.tables);
  auto* lens = reinterpret_cast<int32_t*>(host + l.lens);
  for (int64_t s = 0; s < rows; ++s) {
    const bool real = s < static_cast<int64_t>(entries.size());
    const Entry* e = real ? &entries[static_cast<size_t>(s)] : nullptr;
    RLX_ASSERT(!real || (e->new_tokens == 1 && e->cached + 1 <= max_context),
               "PagedKVCache::plan_static: entry {} has {} new tokens after {}", s, real ? e->new_tokens : 0,
               real ? e->cached : 0);
    const int64_t pos = real ? e->cached : 0;
    const int64_t block = real ? e->blocks[static_cast<size_t>(pos / bs)] : pad_block_;
    positions[s] = pos;
    slots[s] = block * bs + pos % bs;
    for (int64_t h = 0; h < kv_heads_; ++h) write_rows[s * kv_heads_ + h] = (block * kv_heads_ + h) * bs + pos % bs;
    const int64_t used = real ? pos / bs + 1 : 1;
    for (int64_t b = 0; b < mb; ++b)
      tables[s * mb + b] = b < used ? (real ? e->blocks[static_cast<size_t>(b)] : pad_block_) : pad_block_;
    lens[s] = static_cast<int32_t>(pos + 1);
  }
  static_staged_bytes_ = l.bytes;
  static_bytes_.narrow(0, 0, l.bytes).copy_(static_host_.narrow(0, 0, l.bytes), /*non_blocking=*/true);
  packed_ = seqs_ = rows;
  max_new_ = 1;
  max_ctx_ = max_context;
  positions_ = bytes_as(static_bytes_, l.positions, rows, at::kLong).view({1, rows});
  write_rows_ = bytes_as(static_bytes_, l.write_rows, rows * kv_heads_, at::kLong);
  write_slots_ = bytes_as(static_bytes_, l.slots, rows, at::kLong);
  tables_ = bytes_as(static_bytes_, l.tables, rows * mb, at::kInt).view({rows, mb});
  context_lens_ = bytes_as(static_bytes_, l.lens, rows, at::kInt);
  static_step_ = true;
  varlen_ = VarlenSeqs();
}

void PagedKVCache::copy_blocks(std::span<const std::pair<BlockId, BlockId>> src_dst) {
  if (src_dst.empty()) return;
  std::vector<int64_t> src, dst;
  for (auto [s, d] : src_dst) {
    RLX_ASSERT(s >= 0 && s < num_blocks_ && d >= 0 && d < num_blocks_ && s != d, "copy_blocks: bad pair {} -> {}", s, d);
    src.push_back(s);
    dst.push_back(d);
  }
  const auto device = keys_.front().device();
  auto src_t = at::tensor(src, at::TensorOptions().dtype(at::kLong)).to(device);
  auto dst_t = at::tensor(dst, at::TensorOptions().dtype(at::kLong)).to(device);
  for (auto* pools : {&keys_, &values_})
    for (auto& pool : *pools) {
      auto blocks = pool.view({num_blocks_, -1});
      blocks.index_copy_(0, dst_t, blocks.index_select(0, src_t));
    }
}

at::Tensor PagedKVCache::begin(const ForwardInput& in) {
  RLX_CHECK(in.tokens.size(0) == 1 && in.tokens.size(1) == packed_,
            "PagedKVCache: the step was planned for [1, {}] tokens, got {}", packed_, in.tokens.sizes());
  return positions_;
}

at::Tensor PagedKVCache::attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                double scale) {
  auto& kp = keys_.at(static_cast<size_t>(layer));
  auto& vp = values_.at(static_cast<size_t>(layer));
  const int64_t Hkv = k.size(2), D = k.size(3);
  const int64_t row = head_major_ ? D : Hkv * D;  // k and v are [1, packed, Hkv, D]: the same rows
  auto kr = kp.view({-1, row}), vr = vp.view({-1, row});
  kr.index_copy_(0, write_rows_, k.reshape({-1, row}).to(kp.scalar_type()));
  vr.index_copy_(0, write_rows_, v.reshape({-1, row}).to(vp.scalar_type()));
  return attend_stored(layer, q, scale);
}

at::Tensor PagedKVCache::attend_rotating(int64_t layer, const at::Tensor& qkv, const at::Tensor& inv_freq,
                                         int64_t q_heads, double scale, [[maybe_unused]] const QkNorm& norm) {
#if RLX_WITH_CUDA
  auto& kp = keys_.at(static_cast<size_t>(layer));
  auto& vp = values_.at(static_cast<size_t>(layer));
  if (!head_major_ || !write_slots_.defined() || !cuda::decode_attention_supported(qkv, kp)) return {};
  auto q = cuda::rope_append(qkv.reshape({packed_, -1}), positions_.view({-1}), write_slots_, inv_freq, kp, vp, q_heads,
                             norm.q_weight, norm.k_weight, norm.eps);
  return attend_stored(layer, q.view({1, packed_, q_heads, kp.size(3)}), scale);
#else
  return {};
#endif
}

at::Tensor PagedKVCache::attend_stored(int64_t layer, const at::Tensor& q, double scale) {
  auto& kp = keys_.at(static_cast<size_t>(layer));
  auto& vp = values_.at(static_cast<size_t>(layer));
  const int64_t Hq = q.size(2), Hkv = kv_heads_, D = q.size(3);
  const int64_t row = head_major_ ? D : Hkv * D;
  auto kr = kp.view({-1, row}), vr = vp.view({-1, row});
#if RLX_WITH_CUDA
  if (tables_.defined() && cuda::decode_attention_supported(q, kp))
    return cuda::decode_attention_on_device(q.reshape({packed_, Hq, D}), kp, vp, tables_, context_lens_, max_ctx_,
                                            scale, merge_counters_)
        .view({1, packed_, Hq, D});
#endif
  if (static_step_) {
    // The kernel's CPU twin (fp32): what lets the static plan be tested without a GPU.
    RLX_CHECK(kp.is_cpu() && kp.scalar_type() == at::kFloat,
              "PagedKVCache: a static decode step on {} {} has no decode attention kernel", kp.device().str(),
              c10::toString(kp.scalar_type()));
    auto qc = q.reshape({packed_, Hq, D}).to(at::kFloat).contiguous();
    auto out = at::empty_like(qc);
    cuda::reference::decode_attention(
        qc.data_ptr<float>(), kp.data_ptr<float>(), vp.data_ptr<float>(), tables_.data_ptr<int32_t>(),
        context_lens_.data_ptr<int32_t>(), out.data_ptr<float>(),
        {static_cast<int>(packed_), static_cast<int>(Hq), static_cast<int>(Hkv), static_cast<int>(D), block_size_,
         static_cast<int>(tables_.size(1)), static_cast<float>(scale)});
    return out.to(q.scalar_type()).view({1, packed_, Hq, D});
  }
  if (varlen_.defined()) {
    const int64_t total = varlen_.total_k();
    return varlen_attention(q.reshape({packed_, Hq, D}), kr.index_select(0, ctx_rows_).view({total, Hkv, D}).to(q.scalar_type()),
                            vr.index_select(0, ctx_rows_).view({total, Hkv, D}).to(q.scalar_type()), varlen_, scale)
        .view({1, packed_, Hq, D});
  }
  auto kc = kr.index_select(0, ctx_rows_).view({seqs_, max_ctx_, Hkv, D});
  auto vc = vr.index_select(0, ctx_rows_).view({seqs_, max_ctx_, Hkv, D});
  auto qs = q.reshape({packed_, Hq, D}).index_select(0, q_index_).view({seqs_, max_new_, Hq, D});
  auto out = attention(qs, kc.to(q.scalar_type()), vc.to(q.scalar_type()), allowed_, scale);
  return out.reshape({seqs_ * max_new_, Hq, D}).index_select(0, out_index_).view({1, packed_, Hq, D});
}

}  // namespace rlx
