#include "runtime/store/store_uri.hpp"

#include "runtime/store/rocksdb_store.hpp"
#include "runtime/store/s3_store.hpp"

namespace stitch::store {

result<std::unique_ptr<store_backend>> open_store(std::string_view uri) {
  constexpr std::string_view rocksdb_scheme = "rocksdb:";
  if (uri.starts_with(rocksdb_scheme) && uri.size() > rocksdb_scheme.size())
    return open_rocksdb_store(std::string{uri.substr(rocksdb_scheme.size())});
  if (uri.starts_with("s3://"))
    return open_s3_store(uri, s3_options{transport::s3_config::from_environment()});
  return make_error(errc::invalid_argument, "store uri '" + std::string{uri}
                                              + "' is neither rocksdb:PATH nor s3://bucket/prefix");
}

} // namespace stitch::store
