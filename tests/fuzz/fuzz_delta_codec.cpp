// The delta codec (DESIGN §1 xor + zstd): any bytes, expanded so that zero
// runs of every length occur around them (the shape of an XOR delta), go
// through the XOR match finder, one-shot and streamed in pieces, and come
// back exactly, one-shot and streamed; and the raw input, read as a stored
// delta payload, either decodes to exactly the size it is read at or is a
// decode failure, never more bytes than asked. The same bytes encode as an
// `xor-sparse` run list (in pieces) that applies back exactly, with and
// without a dense copy; and the raw input, read as a run list, applies or
// is a decode failure, never a crash or a read past the tensor.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "runtime/core/delta_codec.hpp"

namespace dc = stitch::delta;

namespace {

std::vector<std::byte> expand(const uint8_t* data, size_t size) {
  std::vector<std::byte> x;
  for (size_t i = 0; i < size && x.size() < (size_t{1} << 16); ++i) {
    const uint8_t b = data[i];
    if (b >= 0xc0)
      x.insert(x.end(), static_cast<size_t>(b - 0xc0) * 37 + 1, std::byte{0});
    else
      x.push_back(static_cast<std::byte>(b));
  }
  return x;
}

dc::compressed_input from(std::span<const std::byte> bytes, size_t piece) {
  return
    [bytes, piece, at = size_t{0}](std::span<std::byte> into) mutable -> stitch::result<size_t> {
      const size_t n = std::min({into.size(), piece, bytes.size() - at});
      std::memcpy(into.data(), bytes.data() + at, n);
      at += n;
      return n;
    };
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto x = expand(data, size);
  auto one_shot = dc::compress(x, 1);
  if (!one_shot)
    std::abort();
  auto back = dc::decompress(*one_shot, x.size());
  if (!back || *back != x)
    std::abort();
  const size_t piece = size > 0 ? 1 + data[0] * 61 : 1;
  auto c = dc::stream_compressor::start(x.size(), 1);
  if (!c)
    std::abort();
  std::vector<std::byte> streamed;
  for (size_t at = 0; at < x.size(); at += piece)
    if (!c->update(std::span{x}.subspan(at, std::min(piece, x.size() - at)), streamed))
      std::abort();
  if (!c->finish(streamed))
    std::abort();
  auto d = dc::stream_decompressor::start(x.size(), from(streamed, piece), 97);
  if (!d)
    std::abort();
  std::vector<std::byte> out(x.size());
  if (!d->read(out) || !d->finish() || out != x)
    std::abort();
  // The same bytes as a run list, encoded in pieces, applied in others.
  std::vector<std::byte> runs(dc::sparse_encode_bound(piece));
  std::vector<std::byte> list;
  for (size_t at = 0; at < x.size(); at += piece) {
    auto part = std::span{x}.subspan(at, std::min(piece, x.size() - at));
    const size_t n = dc::sparse_encode(part, runs);
    if (n > dc::sparse_encode_bound(part.size()))
      std::abort();
    list.insert(list.end(), runs.begin(), runs.begin() + static_cast<ptrdiff_t>(n));
  }
  std::vector<std::byte> base(x.size(), std::byte{0});
  std::vector<std::byte> dense(x.size());
  dc::sparse_applier applier{x.size(), from(list, 101), 80};
  const size_t step = 1 + piece / 3;
  for (size_t at = 0; at < x.size(); at += step) {
    const size_t n = std::min(step, x.size() - at);
    if (!applier.apply(std::span{base}.subspan(at, n), std::span{dense}.subspan(at, n)))
      std::abort();
  }
  if (!applier.finish() || base != x || dense != x)
    std::abort();
  // The raw input as a payload someone stored.
  const auto raw = std::as_bytes(std::span{data, size});
  const uint64_t claimed = size > 1 ? uint64_t{data[1]} * 257 : 0;
  if (auto r = dc::decompress(raw, claimed); r && r->size() != claimed)
    std::abort();
  if (auto s = dc::stream_decompressor::start(claimed, from(raw, 333)); s) {
    std::vector<std::byte> into(static_cast<size_t>(claimed));
    if (s->read(into))
      (void) s->finish();
  }
  std::vector<std::byte> tensor(static_cast<size_t>(claimed));
  dc::sparse_applier hostile{claimed, from(raw, 7), 80};
  if (hostile.apply(tensor))
    (void) hostile.finish();
  return 0;
}
