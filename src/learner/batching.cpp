#include "rlx/learner/batching.hpp"

#include <algorithm>
#include <map>
#include <numeric>

#include "rlx/core/device_copy.hpp"
#include "rlx/core/error.hpp"

namespace rlx {

namespace {

// What a row holds: sequences alone (prefix 0), or several after the `prefix` tokens they share.
struct Unit {
  int64_t prefix = 0;
  std::vector<size_t> members;
  int64_t length = 0;  // tokens in the row
};

struct Row {
  std::vector<Unit> units;
  int64_t fill = 0;
};

// How many leading tokens of a sequence another could share: those whose next token is not
// trained (the prompt but its last token, which predicts the first trained one), and never
// the whole sequence.
int64_t shareable(const Sequence& s) {
  const auto L = static_cast<int64_t>(s.tokens.size());
  int64_t first_trained = L;
  for (int64_t i = 1; i < L; ++i)
    if (s.loss_mask[static_cast<size_t>(i)] != 0) {
      first_trained = i;
      break;
    }
  return first_trained - 1;
}

// Sequences in units: with sharing, those whose shareable tokens and the token after them
// are equal form a family (split where it would not fit a row); units in order of their
// first sequence.
std::vector<Unit> units_of(const std::vector<Sequence>& seqs, const PackOptions& o) {
  std::vector<Unit> units;
  std::map<std::vector<int64_t>, size_t> family;  // key -> index in units
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto L = static_cast<int64_t>(seqs[i].tokens.size());
    const int64_t S = o.pack && o.share_prefix ? shareable(seqs[i]) : 0;
    if (S < 1) {
      units.push_back({0, {i}, L});
      continue;
    }
    std::vector<int64_t> key(seqs[i].tokens.begin(), seqs[i].tokens.begin() + S + 1);
    auto [it, fresh] = family.try_emplace(std::move(key), units.size());
    if (fresh) units.push_back({S, {}, S});
    auto& u = units[it->second];
    u.members.push_back(i);
    u.length += L - S;
  }
  std::vector<Unit> out;
  for (auto& u : units) {
    if (u.prefix == 0 || u.length <= o.row_tokens) {
      out.push_back(std::move(u));
      continue;
    }
    // Too long for one row: chunks that fit, longest members first, each with its own copy.
    std::stable_sort(u.members.begin(), u.members.end(),
                     [&](size_t a, size_t b) { return seqs[a].tokens.size() > seqs[b].tokens.size(); });
    Unit chunk{u.prefix, {}, u.prefix};
    for (size_t m : u.members) {
      const auto own = static_cast<int64_t>(seqs[m].tokens.size()) - u.prefix;
      if (!chunk.members.empty() && chunk.length + own > o.row_tokens) {
        out.push_back(std::move(chunk));
        chunk = {u.prefix, {}, u.prefix};
      }
      chunk.members.push_back(m);
      chunk.length += own;
    }
    out.push_back(std::move(chunk));
  }
  for (auto& u : out)
    if (u.prefix > 0 && u.members.size() == 1) u = {0, u.members, static_cast<int64_t>(seqs[u.members[0]].tokens.size())};
  return out;
}

// The routing dimensions of the sequences' recorded routing (0, 0: none carries any).
std::pair<uint16_t, uint16_t> routing_shape(const std::vector<Sequence>& seqs) {
  for (const auto& s : seqs)
    if (!s.routing.empty()) return {s.routing_layers, s.routing_top_k};
  return {0, 0};
}

// Token i's recorded routing row of sequence s into `row` (S x k values), where `row` has
// none yet.
void fill_routing(int16_t* row, const Sequence& s, int64_t i, size_t width) {
  if (s.routing.empty() || row[0] >= 0) return;
  std::copy_n(s.routing.data() + static_cast<size_t>(i) * width, width, row);
}

MicroBatch build(const std::vector<Sequence>& seqs, const std::vector<Row>& rows,
                 const std::vector<std::string>& value_names) {
  int64_t T = 1;
  bool any_shared = false;
  const auto [layers, top_k] = routing_shape(seqs);
  for (const auto& r : rows) {
    T = std::max(T, r.fill);
    for (const auto& u : r.units) any_shared = any_shared || u.prefix > 0;
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  MicroBatch mb;
  auto i64 = at::TensorOptions().dtype(at::kLong);
  mb.tokens = at::zeros({R, T}, i64);
  mb.segments = at::zeros({R, T}, i64);
  mb.targets = at::zeros({R, T}, i64);
  mb.sequence = at::full({R, T}, -1, i64);
  mb.positions = at::arange(T, i64).expand({R, T}).contiguous();  // padding: its column
  if (any_shared) mb.prefix = at::zeros({R, T}, i64);
  mb.loss_mask = at::zeros({R, T}, at::kFloat);
  for (const auto& name : value_names) mb.values[name] = at::zeros({R, T}, at::kFloat);
  auto tok = mb.tokens.accessor<int64_t, 2>(), seg = mb.segments.accessor<int64_t, 2>(),
       tgt = mb.targets.accessor<int64_t, 2>(), sq = mb.sequence.accessor<int64_t, 2>(),
       pos_of = mb.positions.accessor<int64_t, 2>();
  auto msk = mb.loss_mask.accessor<float, 2>();
  int64_t* pre = any_shared ? mb.prefix.data_ptr<int64_t>() : nullptr;
  const size_t width = static_cast<size_t>(layers) * top_k;
  if (width > 0) mb.routing = at::full({R, T, layers, top_k}, -1, at::kShort);
  int16_t* routing = width > 0 ? mb.routing.data_ptr<int16_t>() : nullptr;
  const auto routing_at = [&](int64_t r, int64_t c) { return routing + static_cast<size_t>(r * T + c) * width; };
  for (int64_t r = 0; r < R; ++r) {
    int64_t col = 0, segment = 0;
    for (const auto& u : rows[static_cast<size_t>(r)].units) {
      int64_t shared_segment = 0;
      if (u.prefix > 0) {
        // The prompt once: its targets are the prompt's own next tokens, none trained.
        const auto& first = seqs[u.members.front()];
        shared_segment = ++segment;
        for (int64_t i = 0; i < u.prefix; ++i) {
          RLX_ASSERT(first.loss_mask[static_cast<size_t>(i + 1)] == 0, "packing: a shared prefix holds a trained token");
          tok[r][col + i] = first.tokens[static_cast<size_t>(i)];
          tgt[r][col + i] = first.tokens[static_cast<size_t>(i + 1)];
          seg[r][col + i] = shared_segment;
          pos_of[r][col + i] = i;
          if (routing)  // one prompt, once: the first member that recorded the token
            for (size_t m : u.members) fill_routing(routing_at(r, col + i), seqs[m], i, width);
        }
        mb.shared.push_back({r, col, u.prefix, {}});
        for (size_t m : u.members) mb.shared.back().members.push_back(static_cast<int64_t>(m));
        mb.shared_tokens += u.prefix * static_cast<int64_t>(u.members.size() - 1);
        col += u.prefix;
      }
      for (size_t si : u.members) {
        const auto& s = seqs[si];
        ++segment;
        mb.sequences.push_back(static_cast<int64_t>(si));
        const int64_t L = static_cast<int64_t>(s.tokens.size());
        for (int64_t i = u.prefix, c = col; i < L; ++i, ++c) {
          tok[r][c] = s.tokens[static_cast<size_t>(i)];
          seg[r][c] = segment;
          sq[r][c] = static_cast<int64_t>(si);
          pos_of[r][c] = i;
          if (routing) fill_routing(routing_at(r, c), s, i, width);
          if (shared_segment) pre[r * T + c] = shared_segment;
          if (i + 1 < L) {
            tgt[r][c] = s.tokens[static_cast<size_t>(i + 1)];
            const bool trained = s.loss_mask[static_cast<size_t>(i + 1)] != 0;
            msk[r][c] = trained ? 1.0f : 0.0f;
            mb.loss_tokens += trained;
            for (const auto& [name, vals] : s.values)
              mb.values[name].accessor<float, 2>()[r][c] = vals[static_cast<size_t>(i + 1)];
          }
        }
        col += L - u.prefix;
      }
    }
  }
  return mb;
}

}  // namespace

ForwardInput forward_input(const MicroBatch& mb) {
  return {.tokens = mb.tokens, .positions = mb.positions, .segments = mb.segments, .prefix = mb.prefix, .routing = mb.routing};
}

at::Tensor loss_positions(const MicroBatch& mb, at::Device device) {
  const auto mask = mb.loss_mask.reshape({-1});
  auto at = mask.nonzero().reshape({-1});
  // None (an empty micro-batch): the whole head, so that its backward runs as on the other ranks.
  if (at.numel() == mask.numel() || at.numel() == 0) return {};
  return to_device_async(at, device);
}

std::vector<MicroBatch> pack_micro_batches(const std::vector<Sequence>& seqs, const PackOptions& o) {
  RLX_CHECK(o.row_tokens >= 1 && o.micro_batch_tokens >= o.row_tokens,
            "packing: micro_batch_tokens ({}) must be >= row_tokens ({}) >= 1", o.micro_batch_tokens, o.row_tokens);
  std::vector<std::string> value_names;
  const auto [layers, top_k] = routing_shape(seqs);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    RLX_CHECK(!s.tokens.empty(), "packing: sequence {} is empty", i);
    RLX_CHECK(static_cast<int64_t>(s.tokens.size()) <= o.row_tokens,
              "packing: sequence {} has {} tokens, more than row_tokens {}", i, s.tokens.size(), o.row_tokens);
    RLX_CHECK(s.loss_mask.size() == s.tokens.size(), "packing: sequence {} has {} tokens but {} loss-mask entries", i,
              s.tokens.size(), s.loss_mask.size());
    for (const auto& [name, vals] : s.values)
      RLX_CHECK(vals.size() == s.tokens.size(), "packing: sequence {} value {:?} has {} entries for {} tokens", i,
                name, vals.size(), s.tokens.size());
    if (i == 0) {
      for (const auto& kv : s.values) value_names.push_back(kv.first);
    } else {
      RLX_CHECK(s.values.size() == value_names.size(), "packing: sequence {} has different per-token values", i);
    }
    if (s.routing.empty()) continue;
    RLX_CHECK(s.routing_layers == layers && s.routing_top_k == top_k && layers * top_k > 0,
              "packing: sequence {} has routing of {} sparse layers x top {}, another has {} x {}", i, s.routing_layers,
              s.routing_top_k, layers, top_k);
    RLX_CHECK(s.routing.size() == s.tokens.size() * layers * top_k,
              "packing: sequence {} has {} routing values for {} tokens x {} sparse layers x top {}", i, s.routing.size(),
              s.tokens.size(), layers, top_k);
  }
  auto units = units_of(seqs, o);
  if (o.pack)
    std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.length > b.length; });
  // A row holds up to the longest unit's length (at most row_tokens): attention is dense
  // over a row, so a row costs its length squared, and rows longer than the longest unit
  // only make short sequences pay for each other (15x slower SFT on 40-token examples with
  // 2048-token rows).
  int64_t longest = 0;
  for (const auto& u : units) longest = std::max(longest, u.length);
  const int64_t capacity = std::min(o.row_tokens, longest);
  std::vector<Row> rows;
  for (auto& u : units) {
    Row* target = nullptr;
    if (o.pack)
      for (auto& r : rows)
        if (r.fill + u.length <= capacity) {
          target = &r;
          break;
        }
    if (!target) target = &rows.emplace_back();
    target->fill += u.length;
    target->units.push_back(std::move(u));
  }
  std::vector<MicroBatch> out;
  std::vector<Row> current;
  int64_t widest = 0;
  for (auto& r : rows) {
    const int64_t T = std::max(widest, r.fill);
    if (!current.empty() && T * static_cast<int64_t>(current.size() + 1) > o.micro_batch_tokens) {
      out.push_back(build(seqs, current, value_names));
      current.clear();
      widest = 0;
    }
    current.push_back(r);
    widest = std::max(widest, r.fill);
  }
  if (!current.empty()) out.push_back(build(seqs, current, value_names));
  return out;
}

MicroBatch empty_micro_batch() {
  Sequence s;
  s.tokens = {0};
  s.loss_mask = {0};
  auto mbs = pack_micro_batches({s}, {.micro_batch_tokens = 1, .row_tokens = 1});
  return std::move(mbs.front());
}

std::vector<uint32_t> assign_ranks(const std::vector<int64_t>& group_tokens, uint32_t num_ranks) {
  RLX_CHECK(num_ranks >= 1, "assign_ranks: num_ranks must be at least 1");
  std::vector<size_t> order(group_tokens.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return group_tokens[a] > group_tokens[b]; });
  std::vector<int64_t> load(num_ranks, 0);
  std::vector<uint32_t> rank(group_tokens.size(), 0);
  for (size_t i : order) {
    const auto r = static_cast<uint32_t>(std::min_element(load.begin(), load.end()) - load.begin());
    rank[i] = r;
    load[r] += group_tokens[i];
  }
  return rank;
}


}  // namespace rlx
