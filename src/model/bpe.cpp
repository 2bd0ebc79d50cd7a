// Byte-level BPE from HF tokenizer.json, and tokenizer file loading.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "rlx/core/error.hpp"
#include "rlx/model/tokenizer.hpp"

namespace rlx {

using nlohmann::json;

namespace {

// GPT-2's pre-tokenization pattern (what ByteLevel with use_regex=true splits by).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A compiled PCRE2 pattern over UTF-8 that tolerates invalid UTF-8 in the subject
// (invalid bytes are never part of a match).
class Regex {
 public:
  Regex(const std::string& pattern, std::string_view source) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(fmt::format("{}: cannot compile pre-tokenizer regex at offset {}: {}", source, offset,
                              reinterpret_cast<char*>(msg)));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches, left to right, as [begin, end) byte ranges.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0;
    while (pos <= s.size()) {
      int rc = jit_ ? pcre2_jit_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, 0, md, nullptr)
                    : pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, 0, md, nullptr);
      if (rc < 0) break;  // no match (or a resource limit: the rest stays one piece)
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: step over one character
        pos = e + 1;
        while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      out.emplace_back(b, e);
      pos = e;
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

enum class SplitBehavior { isolated, removed, merged_with_previous, merged_with_next };

struct PreTokenizer {
  enum class Kind { split, byte_level } kind;
  std::shared_ptr<Regex> regex;  // split, or byte_level with use_regex
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;
};

// GPT-2's reversible byte <-> printable character table.
struct ByteTable {
  std::array<std::string, 256> to_char;        // UTF-8 of the stand-in character for each byte
  std::unordered_map<uint32_t, uint8_t> to_byte;  // stand-in code point -> byte
  ByteTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      std::string u;
      if (cp < 0x80) u += static_cast<char>(cp);
      else u += static_cast<char>(0xC0 | (cp >> 6)), u += static_cast<char>(0x80 | (cp & 0x3F));
      to_char[static_cast<size_t>(b)] = u;
      to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

struct AddedToken {
  std::string content;
  TokenId id;
  bool special, lstrip, rstrip;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const json& j, std::string_view source) { load(j, source); }

  std::vector<TokenId> encode(std::string_view s, const EncodeOptions& options) const override {
    std::vector<TokenId> out;
    if (options.add_special_tokens) out.insert(out.end(), prefix_.begin(), prefix_.end());
    size_t pos = 0;
    while (pos < s.size()) {
      // The next added token at or after pos (leftmost, then longest).
      size_t best = std::string_view::npos, best_len = 0;
      const AddedToken* hit = nullptr;
      if (options.parse_special) {
        for (const auto& a : added_) {
          size_t f = s.find(a.content, pos);
          if (f == std::string_view::npos) continue;
          if (f < best || (f == best && a.content.size() > best_len)) best = f, best_len = a.content.size(), hit = &a;
        }
      }
      size_t seg_end = hit ? best : s.size();
      size_t next = hit ? best + best_len : s.size();
      if (hit && hit->lstrip)
        while (seg_end > pos && std::isspace(static_cast<unsigned char>(s[seg_end - 1]))) --seg_end;
      if (hit && hit->rstrip)
        while (next < s.size() && std::isspace(static_cast<unsigned char>(s[next]))) ++next;
      if (seg_end > pos) encode_segment(s.substr(pos, seg_end - pos), out);
      if (hit) out.push_back(hit->id);
      pos = next;
    }
    if (options.add_special_tokens) out.insert(out.end(), suffix_.begin(), suffix_.end());
    return out;
  }

  std::string decode(std::span<const TokenId> ids, bool skip_special) const override {
    std::string out;
    const auto& table = byte_table();
    for (TokenId id : ids) {
      RLX_CHECK(id >= 0 && id < vocab_size(), "decode: token id {} outside the vocabulary [0, {})", id, vocab_size());
      const std::string& tok = id_to_tok_[static_cast<size_t>(id)];
      if (added_ids_.count(id)) {
        if (!(skip_special && special_ids_.count(id))) out += tok;
        continue;
      }
      for (size_t i = 0; i < tok.size();) {
        size_t n = text::utf8_sequence_length(tok, i);
        uint32_t cp = 0;
        if (n == 1) cp = static_cast<unsigned char>(tok[i]);
        else if (n == 2) cp = ((static_cast<unsigned char>(tok[i]) & 0x1F) << 6) | (static_cast<unsigned char>(tok[i + 1]) & 0x3F);
        auto it = n ? table.to_byte.find(cp) : table.to_byte.end();
        if (n && n <= 2 && it != table.to_byte.end()) {
          out += static_cast<char>(it->second);
          i += n;
        } else {  // not a byte stand-in: keep the text as it is
          size_t len = n ? n : 1;
          out.append(tok, i, len);
          i += len;
        }
      }
    }
    return out;
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_tok_.size()); }
  std::optional<TokenId> token_to_id(std::string_view token) const override {
    auto it = vocab_.find(std::string(token));
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }
  std::string id_to_token(TokenId id) const override {
    RLX_CHECK(id >= 0 && id < vocab_size(), "token id {} outside the vocabulary [0, {})", id, vocab_size());
    return id_to_tok_[static_cast<size_t>(id)];
  }
  bool is_special(TokenId id) const override { return special_ids_.count(id) > 0; }

 private:
  void load(const json& j, std::string_view source);
  void add_pre_tokenizer(const json& p, std::string_view source);
  void encode_segment(std::string_view segment, std::vector<TokenId>& out) const;
  void bpe(std::string_view piece, std::vector<TokenId>& out) const;

  std::unordered_map<std::string, TokenId> vocab_;
  std::vector<std::string> id_to_tok_;
  std::unordered_map<uint64_t, std::pair<int32_t, TokenId>> merges_;  // (left << 32 | right) -> (rank, merged)
  std::array<TokenId, 256> byte_ids_{};
  std::vector<AddedToken> added_;
  std::unordered_map<TokenId, bool> added_ids_, special_ids_;
  std::vector<PreTokenizer> pre_;
  bool nfc_ = false;
  bool ignore_merges_ = false;
  std::vector<TokenId> prefix_, suffix_;  // post-processor template around a single sequence

  static constexpr size_t kCacheEntries = 1 << 16, kCacheMaxPiece = 128;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache_;
};

void BpeTokenizer::add_pre_tokenizer(const json& p, std::string_view source) {
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& q : p.at("pretokenizers")) add_pre_tokenizer(q, source);
  } else if (type == "Split") {
    PreTokenizer t{PreTokenizer::Kind::split};
    const auto& pat = p.at("pattern");
    std::string regex;
    if (pat.contains("Regex")) {
      regex = pat["Regex"].get<std::string>();
    } else {
      // A literal string: escape it for PCRE2.
      for (char c : pat.at("String").get<std::string>()) {
        if (std::string_view(R"(\^$.|?*+()[]{})").find(c) != std::string_view::npos) regex += '\\';
        regex += c;
      }
    }
    t.regex = std::make_shared<Regex>(regex, source);
    const std::string b = p.value("behavior", "Isolated");
    if (b == "Isolated") t.behavior = SplitBehavior::isolated;
    else if (b == "Removed") t.behavior = SplitBehavior::removed;
    else if (b == "MergedWithPrevious") t.behavior = SplitBehavior::merged_with_previous;
    else if (b == "MergedWithNext") t.behavior = SplitBehavior::merged_with_next;
    else throw Error(fmt::format("{}: Split behavior '{}' is not supported", source, b));
    t.invert = p.value("invert", false);
    pre_.push_back(std::move(t));
  } else if (type == "ByteLevel") {
    PreTokenizer t{PreTokenizer::Kind::byte_level};
    t.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) t.regex = std::make_shared<Regex>(kGpt2Pattern, source);
    pre_.push_back(std::move(t));
  } else {
    throw Error(fmt::format("{}: pre_tokenizer type '{}' is not supported (Sequence, Split, ByteLevel)", source, type));
  }
}

void BpeTokenizer::load(const json& j, std::string_view source) {
  const json& model = j.at("model");
  RLX_CHECK(model.value("type", "") == "BPE", "{}: model type '{}' is not supported (BPE)", source,
            model.value("type", ""));
  RLX_CHECK(!model.value("byte_fallback", false), "{}: byte_fallback BPE (SentencePiece style) is not supported", source);
  ignore_merges_ = model.value("ignore_merges", false);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    RLX_CHECK(!model.contains(k) || model[k].is_null() || model[k].get<std::string>().empty(),
              "{}: model.{} is not supported", source, k);

  const json& vocab = model.at("vocab");
  RLX_CHECK(vocab.is_object(), "{}: model.vocab is not an object", source);
  int64_t max_id = -1;
  for (auto& [tok, id] : vocab.items()) {
    RLX_CHECK(id.is_number_unsigned() && id.get<uint64_t>() < (1u << 30), "{}: vocab id of '{}' is not a valid id", source, tok);
    max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  }
  const json added = j.value("added_tokens", json::array());
  for (const auto& a : added) max_id = std::max<int64_t>(max_id, a.at("id").get<int64_t>());
  id_to_tok_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (auto& [tok, id] : vocab.items()) {
    vocab_[tok] = id.get<TokenId>();
    id_to_tok_[id.get<size_t>()] = tok;
  }
  const auto& table = byte_table();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(table.to_char[static_cast<size_t>(b)]);
    RLX_CHECK(it != vocab_.end(), "{}: vocab lacks the byte-level token for byte 0x{:02x}; not a byte-level BPE", source, b);
    byte_ids_[static_cast<size_t>(b)] = it->second;
  }

  const json& merges = model.at("merges");
  RLX_CHECK(merges.is_array(), "{}: model.merges is not a list", source);
  int32_t rank = 0;
  for (const auto& m : merges) {
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      auto sp = s.find(' ', 1);
      RLX_CHECK(sp != std::string::npos, "{}: merge {} '{}' is not 'left right'", source, rank, s);
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else {
      RLX_CHECK(m.is_array() && m.size() == 2, "{}: merge {} is not a pair", source, rank);
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    }
    auto l = vocab_.find(left), r = vocab_.find(right), merged = vocab_.find(left + right);
    RLX_CHECK(l != vocab_.end() && r != vocab_.end() && merged != vocab_.end(),
              "{}: merge {} ('{}' + '{}') uses or makes a token missing from the vocab", source, rank, left, right);
    uint64_t key = (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
    merges_.emplace(key, std::make_pair(rank, merged->second));  // the first (best) rank wins
    ++rank;
  }

  for (const auto& a : added) {
    AddedToken t{a.at("content").get<std::string>(), a.at("id").get<TokenId>(), a.value("special", false),
                 a.value("lstrip", false), a.value("rstrip", false)};
    RLX_CHECK(!t.content.empty(), "{}: added token {} has empty content", source, t.id);
    id_to_tok_[static_cast<size_t>(t.id)] = t.content;
    vocab_[t.content] = t.id;
    added_ids_[t.id] = true;
    if (t.special) special_ids_[t.id] = true;
    added_.push_back(std::move(t));
  }

  const json norm = j.value("normalizer", json());
  auto add_normalizer = [&](const json& n, auto& self) -> void {
    if (n.is_null()) return;
    const std::string type = n.value("type", "");
    if (type == "NFC") nfc_ = true;
    else if (type == "Sequence")
      for (const auto& m : n.at("normalizers")) self(m, self);
    else throw Error(fmt::format("{}: normalizer type '{}' is not supported (NFC, Sequence)", source, type));
  };
  add_normalizer(norm, add_normalizer);

  const json pre = j.value("pre_tokenizer", json());
  if (!pre.is_null()) add_pre_tokenizer(pre, source);
  bool has_byte_level = false;
  for (const auto& p : pre_) has_byte_level |= p.kind == PreTokenizer::Kind::byte_level;
  RLX_CHECK(has_byte_level, "{}: only byte-level BPE is supported (no ByteLevel pre-tokenizer found)", source);

  const json dec = j.value("decoder", json());
  RLX_CHECK(dec.is_null() || dec.value("type", "") == "ByteLevel", "{}: decoder type '{}' is not supported (ByteLevel)",
            source, dec.is_null() ? "" : dec.value("type", ""));

  const json post = j.value("post_processor", json());
  auto add_post = [&](const json& p, auto& self) -> void {
    if (p.is_null()) return;
    const std::string type = p.value("type", "");
    if (type == "ByteLevel") return;  // offsets only
    if (type == "Sequence") {
      for (const auto& q : p.at("processors")) self(q, self);
      return;
    }
    RLX_CHECK(type == "TemplateProcessing", "{}: post_processor type '{}' is not supported", source, type);
    bool after = false;
    for (const auto& piece : p.at("single")) {
      if (piece.contains("Sequence")) {
        after = true;
        continue;
      }
      const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      const json& st = p.at("special_tokens").at(name);
      for (const auto& id : st.at("ids")) (after ? suffix_ : prefix_).push_back(id.get<TokenId>());
    }
  };
  add_post(post, add_post);
}

void BpeTokenizer::encode_segment(std::string_view segment, std::vector<TokenId>& out) const {
  std::string normalized = nfc_ ? text::nfc(segment) : std::string(segment);
  // Pieces as owned strings: ByteLevel's prefix space can add bytes.
  std::vector<std::string> pieces{normalized};
  for (const auto& p : pre_) {
    std::vector<std::string> next;
    for (auto& piece : pieces) {
      if (p.kind == PreTokenizer::Kind::byte_level) {
        if (p.add_prefix_space && !piece.empty() && piece[0] != ' ') piece.insert(piece.begin(), ' ');
        if (!p.regex) {
          next.push_back(std::move(piece));
          continue;
        }
      }
      auto matches = p.regex->find_all(piece);
      // Each match and each gap between matches is a part; `keep` marks matches.
      std::vector<std::pair<std::string, bool>> parts;
      size_t at = 0;
      for (auto [b, e] : matches) {
        if (b > at) parts.emplace_back(piece.substr(at, b - at), false);
        parts.emplace_back(piece.substr(b, e - b), true);
        at = e;
      }
      if (at < piece.size()) parts.emplace_back(piece.substr(at), false);
      const bool inv = p.kind == PreTokenizer::Kind::split && p.invert;
      const SplitBehavior behavior = p.kind == PreTokenizer::Kind::split ? p.behavior : SplitBehavior::isolated;
      std::string pending;  // merged_with_next carries a delimiter forward
      for (size_t k = 0; k < parts.size(); ++k) {
        auto& [text, is_match] = parts[k];
        const bool delimiter = is_match != inv;
        switch (behavior) {
          case SplitBehavior::isolated: next.push_back(std::move(text)); break;
          case SplitBehavior::removed:
            if (!delimiter) next.push_back(std::move(text));
            break;
          case SplitBehavior::merged_with_previous:
            if (delimiter && !next.empty() && k > 0) next.back() += text;
            else next.push_back(std::move(text));
            break;
          case SplitBehavior::merged_with_next:
            if (delimiter) pending += text;
            else next.push_back(pending + text), pending.clear();
            break;
        }
      }
      if (!pending.empty()) next.push_back(std::move(pending));
    }
    pieces = std::move(next);
  }
  for (const auto& piece : pieces)
    if (!piece.empty()) bpe(piece, out);
}

void BpeTokenizer::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  const bool cacheable = piece.size() <= kCacheMaxPiece;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(std::string(piece));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<TokenId> result;
  bool whole = false;
  if (ignore_merges_) {
    std::string mapped;
    for (unsigned char b : piece) mapped += byte_table().to_char[b];
    auto it = vocab_.find(mapped);
    if (it != vocab_.end()) result.push_back(it->second), whole = true;
  }
  if (!whole) {
    // Symbols in a linked list; a heap of candidate merges ordered by (rank, position).
    struct Sym {
      TokenId id;
      int prev, next;
    };
    std::vector<Sym> sym(piece.size());
    for (size_t i = 0; i < piece.size(); ++i)
      sym[i] = {byte_ids_[static_cast<unsigned char>(piece[i])], static_cast<int>(i) - 1,
                i + 1 < piece.size() ? static_cast<int>(i + 1) : -1};
    using Cand = std::tuple<int32_t, int, TokenId, TokenId>;  // rank, left position, left id, right id
    std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
    auto consider = [&](int left) {
      if (left < 0 || sym[static_cast<size_t>(left)].next < 0) return;
      TokenId a = sym[static_cast<size_t>(left)].id, b = sym[static_cast<size_t>(sym[static_cast<size_t>(left)].next)].id;
      auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
      if (it != merges_.end()) heap.emplace(it->second.first, left, a, b);
    };
    for (size_t i = 0; i + 1 < piece.size(); ++i) consider(static_cast<int>(i));
    std::vector<bool> dead(piece.size(), false);
    while (!heap.empty()) {
      auto [rank, left, a, b] = heap.top();
      heap.pop();
      auto& s = sym[static_cast<size_t>(left)];
      if (dead[static_cast<size_t>(left)] || s.id != a || s.next < 0 || sym[static_cast<size_t>(s.next)].id != b) continue;
      const int right = s.next;
      s.id = merges_.at((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b)).second;
      dead[static_cast<size_t>(right)] = true;
      s.next = sym[static_cast<size_t>(right)].next;
      if (s.next >= 0) sym[static_cast<size_t>(s.next)].prev = left;
      consider(s.prev);
      consider(left);
    }
    for (int i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) result.push_back(sym[static_cast<size_t>(i)].id);
  }
  out.insert(out.end(), result.begin(), result.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kCacheEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::move(result));
  }
}

// bos/eos/pad from a tokenizer_config.json beside the tokenizer, when there is one.
void read_special_roles(Tokenizer& tok, const std::filesystem::path& config_file) {
  std::ifstream in(config_file);
  if (!in) return;
  json c;
  try {
    c = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: invalid JSON: {}", config_file.string(), e.what()));
  }
  auto role = [&](const char* key) -> std::optional<TokenId> {
    if (!c.contains(key) || c[key].is_null()) return std::nullopt;
    const json& v = c[key];
    std::string content = v.is_string() ? v.get<std::string>() : v.value("content", "");
    return tok.token_to_id(content);
  };
  if (auto id = role("bos_token")) tok.bos_id = id;
  if (auto id = role("eos_token")) tok.eos_id = id;
  if (auto id = role("pad_token")) tok.pad_id = id;
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_json(std::string_view json_text, std::string_view source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: invalid JSON: {}", source, e.what()));
  }
  RLX_CHECK(j.is_object(), "{}: a tokenizer file is a JSON object", source);
  try {
    if (j.value("type", "") == "char") {
      std::vector<std::string> specials = j.value("special_tokens", std::vector<std::string>{"<pad>", "<bos>", "<eos>", "<unk>"});
      return std::make_unique<CharTokenizer>(j.at("alphabet").get<std::string>(), specials);
    }
    RLX_CHECK(j.contains("model"), "{}: neither an HF tokenizer.json (no 'model') nor an rlx char tokenizer", source);
    return std::make_unique<BpeTokenizer>(j, source);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: malformed tokenizer: {}", source, e.what()));
  }
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  RLX_CHECK(in.good(), "cannot read tokenizer file {}", file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  auto tok = tokenizer_from_json(ss.str(), file.string());
  read_special_roles(*tok, file.parent_path() / "tokenizer_config.json");
  return tok;
}

}  // namespace rlx
