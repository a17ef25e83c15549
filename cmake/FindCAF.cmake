# Finds the C++ Actor Framework (Debian's libcaf-dev 0.17.x ships no CMake config).
# Provides CAF::core, CAF::io and CAF::openssl (when present) and CAF_VERSION.
find_path(CAF_INCLUDE_DIR NAMES caf/config.hpp)
find_library(CAF_CORE_LIBRARY NAMES caf_core)
find_library(CAF_IO_LIBRARY NAMES caf_io)
find_library(CAF_OPENSSL_LIBRARY NAMES caf_openssl)

if(CAF_INCLUDE_DIR AND EXISTS ${CAF_INCLUDE_DIR}/caf/config.hpp)
  file(STRINGS ${CAF_INCLUDE_DIR}/caf/config.hpp caf_version_line REGEX "^#define CAF_VERSION [0-9]+")
  if(caf_version_line MATCHES "CAF_VERSION ([0-9]+)")
    math(EXPR caf_major "${CMAKE_MATCH_1} / 10000")
    math(EXPR caf_minor "(${CMAKE_MATCH_1} / 100) % 100")
    math(EXPR caf_patch "${CMAKE_MATCH_1} % 100")
    set(CAF_VERSION "${caf_major}.${caf_minor}.${caf_patch}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY
  VERSION_VAR CAF_VERSION)

if(CAF_FOUND)
  find_package(Threads REQUIRED)
  if(NOT TARGET CAF::core)
    add_library(CAF::core UNKNOWN IMPORTED)
    set_target_properties(CAF::core PROPERTIES
      IMPORTED_LOCATION ${CAF_CORE_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR}
      INTERFACE_LINK_LIBRARIES Threads::Threads)
  endif()
  if(NOT TARGET CAF::io)
    add_library(CAF::io UNKNOWN IMPORTED)
    set_target_properties(CAF::io PROPERTIES
      IMPORTED_LOCATION ${CAF_IO_LIBRARY}
      INTERFACE_LINK_LIBRARIES CAF::core)
  endif()
  if(CAF_OPENSSL_LIBRARY AND NOT TARGET CAF::openssl)
    add_library(CAF::openssl UNKNOWN IMPORTED)
    set_target_properties(CAF::openssl PROPERTIES
      IMPORTED_LOCATION ${CAF_OPENSSL_LIBRARY}
      INTERFACE_LINK_LIBRARIES CAF::io)
  endif()
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY CAF_OPENSSL_LIBRARY)
