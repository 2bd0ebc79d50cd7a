// Tokenizers: byte-level BPE loaded from a Hugging Face tokenizer.json (GPT-2,
// Qwen2/3 and Llama-3 styles: NFC normalizer, regex Split and ByteLevel
// pre-tokenizers, merges, added and special tokens, template post-processor),
// and a character tokenizer for toy tasks.
//
// Encoding is a pure function of the bytes: any byte string, valid UTF-8 or not,
// encodes without error and decodes back to exactly the same bytes (invalid
// bytes become their own byte tokens). Token ids are what the model consumes;
// the rest of rlx never re-tokenizes decoded text.
//
//   auto tok = rlx::load_tokenizer("Qwen3/tokenizer.json");
//   std::vector<rlx::TokenId> ids = tok->encode("Hello, world");
//   std::string back = tok->decode(ids);          // "Hello, world"
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rlx {

using TokenId = int32_t;

struct EncodeOptions {
  bool add_special_tokens = false;  // apply the post-processor template (e.g. Llama-3's BOS)
  bool parse_special = true;        // recognise added/special tokens written in the text
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options = {}) const = 0;
  // Bytes of the tokens, concatenated; `skip_special` drops special tokens. Throws for ids
  // outside the vocabulary.
  virtual std::string decode(std::span<const TokenId> ids, bool skip_special = false) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(TokenId id) const = 0;
  virtual bool is_special(TokenId id) const = 0;
  // Common special tokens when the tokenizer has them.
  std::optional<TokenId> bos_id, eos_id, pad_id;
};

// Reads a tokenizer file: an HF tokenizer.json (BPE model) or an rlx char tokenizer
// ({"type": "char", ...}). Throws rlx::Error naming the file and the unsupported or
// malformed part.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& file);
std::unique_ptr<Tokenizer> tokenizer_from_json(std::string_view json_text, std::string_view source);

// One token per Unicode character of `alphabet` (UTF-8), after the special tokens.
// Characters outside the alphabet encode to <unk> when it exists, else to nothing
// being possible: encode throws naming the character and its byte offset.
class CharTokenizer final : public Tokenizer {
 public:
  CharTokenizer(std::string_view alphabet, std::vector<std::string> special_tokens = {"<pad>", "<bos>", "<eos>", "<unk>"});
  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options = {}) const override;
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  std::string id_to_token(TokenId id) const override;
  bool is_special(TokenId id) const override { return id >= 0 && id < static_cast<TokenId>(specials_.size()); }
  // {"type": "char", "alphabet": ..., "special_tokens": [...]}
  std::string to_json() const;
  void save(const std::filesystem::path& file) const;

 private:
  std::vector<std::string> specials_;
  std::vector<std::string> tokens_;  // specials, then one UTF-8 character each
  std::unordered_map<std::string, TokenId> ids_;
  std::optional<TokenId> unk_;
};

// A 256-character alphabet covering every byte is not valid UTF-8; the default toy
// alphabet: digits, ASCII letters, space, newline and common punctuation.
std::string default_char_alphabet();

namespace text {
// Length of the valid UTF-8 sequence starting at s[i], or 0 if the byte there
// does not start one (overlong forms, surrogates and > U+10FFFF are invalid).
size_t utf8_sequence_length(std::string_view s, size_t i);
bool is_valid_utf8(std::string_view s);
// Why `s` cannot end a sample (empty, over 1024 bytes, not valid UTF-8), or "" when it can.
inline std::string stop_string_problem(std::string_view s) {
  if (s.empty()) return "is empty";
  if (s.size() > 1024) return "is " + std::to_string(s.size()) + " bytes; at most 1024";
  return is_valid_utf8(s) ? "" : "is not valid UTF-8";
}
// NFC normalisation of valid UTF-8 runs; invalid bytes are kept as they are.
std::string nfc(std::string_view s);
}  // namespace text

}  // namespace rlx
