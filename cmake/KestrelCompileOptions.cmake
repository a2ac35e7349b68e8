# Warning, sanitizer and CPU flags shared by every Kestrel target (added as an INTERFACE library).
# Not used: -Wnull-dereference. With GCC 12 at -O3 it fires inside GoogleTest's and libstdc++'s headers on correct
# code (a dozen false reports per test file), so it cannot be an error there; ASan/UBSan builds catch the real ones.
add_library(kestrel_compile_options INTERFACE)
add_library(kestrel::compile_options ALIAS kestrel_compile_options)

target_compile_options(kestrel_compile_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Wunused
                            -Woverloaded-virtual -Wimplicit-fallthrough>)
if(KESTREL_WERROR)
  target_compile_options(kestrel_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
                                                           $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
endif()
# GCC 12 at -O3 (Release) reports -Wrestrict on `"literal" + std::to_string(n)` inside libstdc++ (GCC PR 105329, fixed
# in 13): off for that compiler, for C++ and for the host side of .cu files.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(kestrel_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>
                                                           $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wno-restrict>)
endif()
if(KESTREL_NATIVE)
  target_compile_options(kestrel_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()

if(KESTREL_SANITIZE)
  if(NOT KESTREL_SANITIZE MATCHES "^(address|undefined|thread)$")
    message(FATAL_ERROR "KESTREL_SANITIZE must be address, undefined or thread (got '${KESTREL_SANITIZE}')")
  endif()
  set(_san -fsanitize=${KESTREL_SANITIZE} -fno-omit-frame-pointer)
  if(KESTREL_SANITIZE STREQUAL "undefined")
    list(APPEND _san -fno-sanitize-recover=all)
  endif()
  target_compile_options(kestrel_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_san}>)
  # GCC 12 with a sanitizer and optimization (the asan preset's -O1) reports -Wmaybe-uninitialized inside libstdc++'s
  # <regex> (std::function members of its NFA states) on correct code; the sanitizer itself checks such reads.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(kestrel_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>)
    # GCC 12's -Wtsan flags the std::atomic_thread_fence in Boost.Asio's std_fenced_block (the HTTP server): TSan
    # does not model fences. Asio's handler hand-offs also go through mutexes and atomics TSan sees, so the fence is
    # left to it.
    if(KESTREL_SANITIZE STREQUAL "thread")
      target_compile_options(kestrel_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-tsan>)
    endif()
  endif()
  target_link_options(kestrel_compile_options INTERFACE ${_san})
endif()
