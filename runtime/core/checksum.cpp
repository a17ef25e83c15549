#include "runtime/core/checksum.hpp"

#include <algorithm>
#include <vector>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
// Picks the widest SIMD (AVX2/AVX-512) the CPU has at run time; the plain
// entry points of a distribution build only assume SSE2.
#include <xxh_x86dispatch.h>
#endif

namespace stitch {

void sequential_for::run(size_t n, const std::function<void(size_t)>& fn) {
  for (size_t i = 0; i < n; ++i)
    fn(i);
}

} // namespace stitch

namespace stitch::checksum {

namespace {

void store_le64(unsigned char* p, uint64_t value) noexcept {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<unsigned char>(value >> (8 * i));
}

} // namespace

uint64_t chunk_digest(std::span<const std::byte> chunk) noexcept {
  return XXH3_64bits(chunk.data(), chunk.size());
}

uint64_t combine(std::span<const uint64_t> digests) noexcept {
  std::vector<unsigned char> words(digests.size() * 8);
  for (size_t i = 0; i < digests.size(); ++i)
    store_le64(words.data() + 8 * i, digests[i]);
  return XXH3_64bits(words.data(), words.size());
}

uint64_t tree_checksum(std::span<const std::byte> bytes) noexcept {
  XXH3_state_t digests;
  XXH3_64bits_reset(&digests);
  for (size_t offset = 0; offset < bytes.size(); offset += chunk_size) {
    unsigned char word[8];
    store_le64(word,
               chunk_digest(bytes.subspan(offset, std::min(chunk_size, bytes.size() - offset))));
    XXH3_64bits_update(&digests, word, sizeof word);
  }
  return XXH3_64bits_digest(&digests);
}

uint64_t tree_checksum(std::span<const std::byte> bytes, parallel_for& runner) {
  std::vector<uint64_t> digests(chunk_count(bytes.size()));
  runner.run(digests.size(), [&](size_t i) {
    size_t offset = i * chunk_size;
    digests[i] = chunk_digest(bytes.subspan(offset, std::min(chunk_size, bytes.size() - offset)));
  });
  return combine(digests);
}

/// The chunk being hashed and the running hash of the finished chunks'
/// digests; both are xxh3 streaming states, so no chunk is ever buffered.
struct tree_hasher::states {
  XXH3_state_t chunk;
  XXH3_state_t digests;

  states() noexcept { reset(); }
  void reset() noexcept {
    XXH3_64bits_reset(&chunk);
    XXH3_64bits_reset(&digests);
  }
};

tree_hasher::tree_hasher() : states_(std::make_unique<states>()) {}
tree_hasher::~tree_hasher() = default;
tree_hasher::tree_hasher(tree_hasher&&) noexcept = default;
tree_hasher& tree_hasher::operator=(tree_hasher&&) noexcept = default;

void tree_hasher::finish_chunk(uint64_t digest_value) noexcept {
  unsigned char word[8];
  store_le64(word, digest_value);
  XXH3_64bits_update(&states_->digests, word, sizeof word);
}

void tree_hasher::update(std::span<const std::byte> bytes) noexcept {
  size_ += bytes.size();
  while (!bytes.empty()) {
    if (in_chunk_ == 0 && bytes.size() >= chunk_size) {
      // A whole chunk in hand: the one-shot hash is faster than streaming.
      finish_chunk(chunk_digest(bytes.first(chunk_size)));
      bytes = bytes.subspan(chunk_size);
      continue;
    }
    size_t take = std::min(bytes.size(), chunk_size - in_chunk_);
    XXH3_64bits_update(&states_->chunk, bytes.data(), take);
    in_chunk_ += take;
    bytes = bytes.subspan(take);
    if (in_chunk_ == chunk_size) {
      finish_chunk(XXH3_64bits_digest(&states_->chunk));
      XXH3_64bits_reset(&states_->chunk);
      in_chunk_ = 0;
    }
  }
}

uint64_t tree_hasher::digest() const noexcept {
  if (in_chunk_ == 0)
    return XXH3_64bits_digest(&states_->digests);
  // Close the partial chunk on a copy so the stream can go on.
  XXH3_state_t copy;
  XXH3_copyState(&copy, &states_->digests);
  unsigned char word[8];
  store_le64(word, XXH3_64bits_digest(&states_->chunk));
  XXH3_64bits_update(&copy, word, sizeof word);
  return XXH3_64bits_digest(&copy);
}

void tree_hasher::reset() noexcept {
  states_->reset();
  in_chunk_ = 0;
  size_ = 0;
}

std::string to_hex(uint64_t digest) {
  constexpr char hex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i) {
    out[static_cast<size_t>(i)] = hex[digest & 0xf];
    digest >>= 4;
  }
  return out;
}

result<uint64_t> parse_hex(std::string_view text) {
  if (text.size() != 16)
    return make_error(errc::invalid_argument, "checksum must be 16 lowercase hex digits, got "
                                                + std::to_string(text.size()) + " characters");
  uint64_t value = 0;
  for (char c : text) {
    unsigned digit = 0;
    if (c >= '0' && c <= '9')
      digit = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      digit = static_cast<unsigned>(c - 'a' + 10);
    else
      return make_error(errc::invalid_argument,
                        "checksum must be 16 lowercase hex digits: " + std::string{text});
    value = (value << 4) | digit;
  }
  return value;
}

} // namespace stitch::checksum
