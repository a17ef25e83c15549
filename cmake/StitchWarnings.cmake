# Warnings on for every target of ours; errors when STITCH_WERROR is on.
function(stitch_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wnon-virtual-dtor>
    # GCC 12 reports spurious -Wrestrict, -Wstringop-overflow and -Warray-bounds on std::string
    # concatenation at -O3 (GCC bugs 105329, 105651).
    $<$<AND:$<CXX_COMPILER_ID:GNU>,$<COMPILE_LANGUAGE:CXX>>:-Wshadow=local -Wno-restrict -Wno-stringop-overflow -Wno-array-bounds>
    $<$<AND:$<CXX_COMPILER_ID:Clang>,$<COMPILE_LANGUAGE:CXX>>:-Wshadow-uncaptured-local>
    $<$<AND:$<BOOL:${STITCH_WERROR}>,$<COMPILE_LANGUAGE:CXX>>:-Werror>)
endfunction()

if(STITCH_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
