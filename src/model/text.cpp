// UTF-8 helpers, NFC and the character tokenizer.
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "rlx/core/error.hpp"
#include "rlx/model/tokenizer.hpp"

namespace rlx {

namespace text {

size_t utf8_sequence_length(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F;
  else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F;
  else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string nfc(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* norm = icu::Normalizer2::getNFCInstance(status);
  RLX_ASSERT(U_SUCCESS(status), "ICU NFC unavailable: {}", u_errorName(status));
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    // Normalise the maximal valid run; copy invalid bytes through untouched.
    size_t j = i;
    while (j < s.size()) {
      size_t n = utf8_sequence_length(s, j);
      if (n == 0) break;
      j += n;
    }
    if (j > i) {
      std::string run;
      icu::StringByteSink<std::string> sink(&run);
      status = U_ZERO_ERROR;
      norm->normalizeUTF8(0, icu::StringPiece(s.data() + i, static_cast<int32_t>(j - i)), sink, nullptr, status);
      RLX_ASSERT(U_SUCCESS(status), "NFC failed on valid UTF-8: {}", u_errorName(status));
      out += run;
    }
    if (j < s.size()) out += s[j++];
    i = j;
  }
  return out;
}

}  // namespace text

std::string default_char_alphabet() {
  return "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ \n+-*/=()<>.,:;?!'\"_#%&[]{}|^~@$\\`";
}

CharTokenizer::CharTokenizer(std::string_view alphabet, std::vector<std::string> special_tokens)
    : specials_(std::move(special_tokens)) {
  for (const auto& s : specials_) {
    RLX_CHECK(!s.empty() && ids_.emplace(s, static_cast<TokenId>(tokens_.size())).second,
              "char tokenizer: special token '{}' is empty or repeated", s);
    tokens_.push_back(s);
    if (s == "<unk>") unk_ = static_cast<TokenId>(tokens_.size() - 1);
    if (s == "<bos>") bos_id = static_cast<TokenId>(tokens_.size() - 1);
    if (s == "<eos>") eos_id = static_cast<TokenId>(tokens_.size() - 1);
    if (s == "<pad>") pad_id = static_cast<TokenId>(tokens_.size() - 1);
  }
  for (size_t i = 0; i < alphabet.size();) {
    size_t n = text::utf8_sequence_length(alphabet, i);
    RLX_CHECK(n > 0, "char tokenizer: alphabet is not valid UTF-8 at byte {}", i);
    std::string ch(alphabet.substr(i, n));
    RLX_CHECK(ids_.emplace(ch, static_cast<TokenId>(tokens_.size())).second,
              "char tokenizer: character '{}' repeated in the alphabet (byte {})", ch, i);
    tokens_.push_back(ch);
    i += n;
  }
}

std::vector<TokenId> CharTokenizer::encode(std::string_view s, const EncodeOptions& options) const {
  std::vector<TokenId> out;
  if (options.add_special_tokens && bos_id) out.push_back(*bos_id);
  for (size_t i = 0; i < s.size();) {
    if (options.parse_special) {
      bool matched = false;
      for (size_t k = 0; k < specials_.size() && !matched; ++k)
        if (s.substr(i, specials_[k].size()) == specials_[k]) {
          out.push_back(static_cast<TokenId>(k));
          i += specials_[k].size();
          matched = true;
        }
      if (matched) continue;
    }
    size_t n = text::utf8_sequence_length(s, i);
    auto id = n ? token_to_id(s.substr(i, n)) : std::nullopt;
    if (id && !is_special(*id)) {
      out.push_back(*id);
    } else {
      RLX_CHECK(unk_.has_value(), "char tokenizer: byte {} ('{}') is not in the alphabet and there is no <unk>", i,
                n ? std::string(s.substr(i, n)) : fmt::format("\\x{:02x}", static_cast<unsigned char>(s[i])));
      out.push_back(*unk_);
    }
    i += n ? n : 1;
  }
  return out;
}

std::string CharTokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string out;
  for (TokenId id : ids) {
    RLX_CHECK(id >= 0 && id < vocab_size(), "decode: token id {} outside the vocabulary [0, {})", id, vocab_size());
    if (skip_special && is_special(id)) continue;
    out += tokens_[static_cast<size_t>(id)];
  }
  return out;
}

std::optional<TokenId> CharTokenizer::token_to_id(std::string_view token) const {
  auto it = ids_.find(std::string(token));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::string CharTokenizer::id_to_token(TokenId id) const {
  RLX_CHECK(id >= 0 && id < vocab_size(), "token id {} outside the vocabulary [0, {})", id, vocab_size());
  return tokens_[static_cast<size_t>(id)];
}

std::string CharTokenizer::to_json() const {
  std::string alphabet;
  for (size_t i = specials_.size(); i < tokens_.size(); ++i) alphabet += tokens_[i];
  return nlohmann::json{{"type", "char"}, {"alphabet", alphabet}, {"special_tokens", specials_}}.dump(2);
}

void CharTokenizer::save(const std::filesystem::path& file) const {
  std::ofstream out(file);
  out << to_json() << "\n";
  RLX_CHECK(out.good(), "cannot write {}", file.string());
}

}  // namespace rlx
