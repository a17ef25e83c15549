// S3's XML responses (ListObjectsV2 pages, error bodies, multipart answers):
// hostile or broken XML is refused with a message, never crashes or
// expands, and what parses satisfies the page's own rules.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "transport/s3_xml.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view xml(reinterpret_cast<const char*>(data), size);
  using namespace stitch::transport;
  auto page = parse_list_objects_v2(xml);
  if (page) {
    if (page->truncated && page->next_continuation_token.empty())
      std::abort();
    if (page->objects.size() + page->common_prefixes.size() > max_s3_list_entries)
      std::abort();
    for (const auto& o : page->objects)
      if (o.key.empty())
        std::abort();
    for (const auto& p : page->common_prefixes)
      if (p.empty())
        std::abort();
  } else if (page.error().message.empty()) {
    std::abort();
  }
  auto err = parse_s3_error(xml);
  if (err.code.size() + err.message.size() > 2 * size + 2)
    std::abort();
  if (auto id = find_xml_text(xml, {"InitiateMultipartUploadResult", "UploadId"}))
    if (id->size() > size)
      std::abort();
  // Escaped text has no markup left in it.
  auto escaped = xml_escape(xml);
  if (escaped.find_first_of("<>\"'") != escaped.npos)
    std::abort();
  return 0;
}
