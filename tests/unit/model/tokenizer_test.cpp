#include "rlx/model/tokenizer.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

#include "../helpers.hpp"
#include "rlx/core/rng.hpp"
#include "test_paths.hpp"

using Catch::Matchers::Contains;
using nlohmann::json;

namespace {
const std::filesystem::path kFixtures = rlx::test_paths::kFixtureDir;

std::unique_ptr<rlx::Tokenizer> fixture_tokenizer(const std::string& name) {
  auto path = kFixtures / name / "tokenizer.json";
  if (!std::filesystem::exists(path))
    FAIL("missing " << path << ": run scripts/make_tokenizer_fixtures.sh " << kFixtures.string()
                    << " (scripts/test.sh does this)");
  return rlx::load_tokenizer(path);
}

// GPT-2 byte-level BPE over a toy vocabulary: 256 byte tokens, then merges.
json toy_bpe(const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges = false) {
  json vocab = json::object();
  // Build GPT-2's byte -> character table the same way the format defines it.
  int n = 0, id = 0;
  std::vector<std::string> chars(256);
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
    std::string u;
    if (cp < 0x80) u += static_cast<char>(cp);
    else u += static_cast<char>(0xC0 | (cp >> 6)), u += static_cast<char>(0x80 | (cp & 0x3F));
    chars[static_cast<size_t>(b)] = u;
    vocab[u] = id++;
  }
  json m = json::array();
  for (auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    m.push_back(a + " " + b);
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}, {"ignore_merges", ignore_merges}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens", json::array({{{"id", id}, {"content", "<|end|>"}, {"special", true}}})}};
}
}  // namespace

TEST_CASE("tokenizer: BPE applies merges by rank, leftmost first", "[tokenizer]") {
  // Merges: "a b" (rank 0), "ab c" (1), "b c" (2). "abc" -> ab + c -> abc; "bc" -> bc.
  auto j = toy_bpe({{"a", "b"}, {"ab", "c"}, {"b", "c"}});
  auto tok = rlx::tokenizer_from_json(j.dump(), "toy");
  const auto abc = *tok->token_to_id("abc"), bc = *tok->token_to_id("bc"), a = *tok->token_to_id("a");
  CHECK(tok->encode("abc") == std::vector<rlx::TokenId>{abc});
  CHECK(tok->encode("bc") == std::vector<rlx::TokenId>{bc});
  // "abcbc": no space so one piece; ab(0) first, then abc(1), then bc(2).
  CHECK(tok->encode("abcbc") == std::vector<rlx::TokenId>{abc, bc});
  // "aab": (a,b) at position 1 merges; the leading a stays.
  CHECK(tok->encode("aab") == std::vector<rlx::TokenId>{a, *tok->token_to_id("ab")});
  // Special tokens split the text and are recognised unless told not to.
  auto end = *tok->token_to_id("<|end|>");
  CHECK(tok->encode("abc<|end|>bc") == std::vector<rlx::TokenId>{abc, end, bc});
  CHECK(tok->encode("<|end|>", {.parse_special = false}).size() == 7);
  CHECK(tok->is_special(end));
  CHECK(tok->decode(std::vector<rlx::TokenId>{abc, end, bc}) == "abc<|end|>bc");
  CHECK(tok->decode(std::vector<rlx::TokenId>{abc, end, bc}, /*skip_special=*/true) == "abcbc");
  CHECK_THROWS_WITH(tok->decode(std::vector<rlx::TokenId>{-1}), Contains("outside the vocabulary"));
}

TEST_CASE("tokenizer: ignore_merges takes whole-word vocabulary hits (Llama-3)", "[tokenizer]") {
  // "abc" is in the vocab only through merges a+b, ab+c; with a rank order that would
  // otherwise produce a + bc. ignore_merges finds "abc" directly.
  auto j = toy_bpe({{"b", "c"}, {"a", "b"}, {"ab", "c"}}, /*ignore_merges=*/true);
  auto tok = rlx::tokenizer_from_json(j.dump(), "toy");
  CHECK(tok->encode("abc") == std::vector<rlx::TokenId>{*tok->token_to_id("abc")});
  j["model"]["ignore_merges"] = false;
  auto plain = rlx::tokenizer_from_json(j.dump(), "toy");
  CHECK(plain->encode("abc") == std::vector<rlx::TokenId>{*plain->token_to_id("a"), *plain->token_to_id("bc")});
}

TEST_CASE("tokenizer: unsupported or malformed tokenizer.json is named", "[tokenizer]") {
  auto j = toy_bpe({});
  auto bad = j;
  bad["pre_tokenizer"] = {{"type", "Metaspace"}};
  CHECK_THROWS_WITH(rlx::tokenizer_from_json(bad.dump(), "t.json"), Contains("t.json: pre_tokenizer type 'Metaspace'"));
  bad = j;
  bad["model"]["type"] = "WordPiece";
  CHECK_THROWS_WITH(rlx::tokenizer_from_json(bad.dump(), "t.json"), Contains("model type 'WordPiece'"));
  bad = j;
  bad["model"]["merges"] = json::array({"x y"});
  CHECK_THROWS_WITH(rlx::tokenizer_from_json(bad.dump(), "t.json"), Contains("merge 0 ('x' + 'y')"));
  bad = j;
  bad["model"]["vocab"].erase("A");
  CHECK_THROWS_WITH(rlx::tokenizer_from_json(bad.dump(), "t.json"), Contains("byte 0x41"));
  bad = j;
  bad["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}};
  CHECK_THROWS_WITH(rlx::tokenizer_from_json(bad.dump(), "t.json"), Contains("cannot compile pre-tokenizer regex"));
  CHECK_THROWS_WITH(rlx::tokenizer_from_json("{oops", "t.json"), Contains("t.json: invalid JSON"));
  CHECK_THROWS_WITH(rlx::load_tokenizer("/nonexistent/tokenizer.json"), Contains("cannot read tokenizer file"));
}

TEST_CASE("tokenizer: char tokenizer", "[tokenizer]") {
  rlx::CharTokenizer tok("0123456789+=é");
  CHECK(tok.vocab_size() == 4 + 13);
  auto ids = tok.encode("12+3=é");
  CHECK(ids.size() == 6);
  CHECK(tok.decode(ids) == "12+3=é");
  CHECK(tok.encode("1?").back() == *tok.token_to_id("<unk>"));
  CHECK(tok.encode("<eos>1") == std::vector<rlx::TokenId>{*tok.eos_id, *tok.token_to_id("1")});
  CHECK(tok.encode("1", {.add_special_tokens = true}).front() == *tok.bos_id);
  CHECK(tok.decode(tok.encode("<bos>1<eos>"), true) == "1");
  rlx::CharTokenizer strict("ab", {"<pad>"});
  CHECK_THROWS_WITH(strict.encode("abc"), Contains("byte 2 ('c') is not in the alphabet"));
  CHECK_THROWS_WITH(rlx::CharTokenizer("aa"), Contains("repeated"));
  auto back = rlx::tokenizer_from_json(tok.to_json(), "char.json");
  CHECK(back->encode("12+3=é") == ids);
}

TEST_CASE("tokenizer: parity with GPT-2 and Qwen3 reference implementations", "[tokenizer][parity]") {
  for (const std::string name : {"gpt2", "qwen3"}) {
    auto tok = fixture_tokenizer(name);
    std::ifstream in(kFixtures / name / "cases.jsonl");
    int n = 0, mismatches = 0;
    std::string line;
    while (std::getline(in, line)) {
      auto c = json::parse(line);
      const std::string text = c["text"];
      auto expected = c["ids"].get<std::vector<rlx::TokenId>>();
      auto got = tok->encode(text);
      if (got != expected) {
        ++mismatches;
        UNSCOPED_INFO(name << " mismatch on " << json(text).dump() << "\n expected " << json(expected).dump() << "\n got      "
                           << json(got).dump());
      }
      // Valid UTF-8 in NFC (the corpus is) decodes back to the same bytes.
      CHECK(tok->decode(got) == text);
      ++n;
    }
    INFO(name << ": " << n << " cases");
    CHECK(n >= 300);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("tokenizer: arbitrary bytes round-trip exactly, invalid UTF-8 included", "[tokenizer][parity]") {
  auto gpt2 = fixture_tokenizer("gpt2");
  auto qwen = fixture_tokenizer("qwen3");
  rlx::RngStream rng(77);
  const std::vector<std::string> seeds = {"héllo", "\xff\xfe", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                          "\xc0\xaf", "  \n\t", "中文", "😀", "<|endoftext|>", "abc"};
  for (int i = 0; i < 500; ++i) {
    std::string s;
    const int parts = static_cast<int>(rng.uniform_int(1, 8));
    for (int p = 0; p < parts; ++p) {
      if (rng.uniform() < 0.5) s += seeds[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(seeds.size()) - 1))];
      else
        for (int k = rng.uniform_int(1, 6); k > 0; --k) s += static_cast<char>(rng.uniform_int(0, 255));
    }
    INFO(json::binary_t(std::vector<uint8_t>(s.begin(), s.end())).size() << " bytes, case " << i);
    // GPT-2 has no normalizer: exact. Qwen normalises valid runs to NFC: exact up to NFC.
    CHECK(gpt2->decode(gpt2->encode(s)) == s);
    CHECK(qwen->decode(qwen->encode(s)) == rlx::text::nfc(s));
  }
  // NFC: a decomposed é encodes like the composed one with Qwen, not with GPT-2.
  CHECK(qwen->encode("e\xcc\x81") == qwen->encode("\xc3\xa9"));
  CHECK(gpt2->encode("e\xcc\x81") != gpt2->encode("\xc3\xa9"));
  // Special roles from tokenizer_config.json are not there for these fixtures; ids come from the vocab.
  CHECK(qwen->token_to_id("<|im_end|>").has_value());
  CHECK(qwen->is_special(*qwen->token_to_id("<|im_end|>")));
}

TEST_CASE("tokenizer: UTF-8 validation", "[tokenizer]") {
  using rlx::text::utf8_sequence_length;
  CHECK(utf8_sequence_length("a", 0) == 1);
  CHECK(utf8_sequence_length("\xc3\xa9", 0) == 2);
  CHECK(utf8_sequence_length("\xe4\xb8\xad", 0) == 3);
  CHECK(utf8_sequence_length("\xf0\x9f\x98\x80", 0) == 4);
  CHECK(utf8_sequence_length("\xc0\xaf", 0) == 0);          // overlong
  CHECK(utf8_sequence_length("\xed\xa0\x80", 0) == 0);      // surrogate
  CHECK(utf8_sequence_length("\xf4\x90\x80\x80", 0) == 0);  // > U+10FFFF
  CHECK(utf8_sequence_length("\xe4\xb8", 0) == 0);          // truncated
  CHECK(utf8_sequence_length("\x80", 0) == 0);              // stray continuation
  CHECK(rlx::text::nfc("e\xcc\x81\xff") == "\xc3\xa9\xff");
}
