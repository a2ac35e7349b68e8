# kestreld: the daemon executable (daemon/main.cpp) and its installation: the binary, the systemd unit, the
# sysusers.d and tmpfiles.d entries, the example configuration (installed as <sysconfdir>/kestrel/kestreld.toml
# unless one exists) and docs/operations.md. Included by daemon/CMakeLists.txt when main.cpp exists.
if(NOT (TARGET kestrel::server AND TARGET kestrel::shm_server AND TARGET kestrel::engine AND TARGET kestrel::ops
        AND TARGET kestrel::http))
  message(STATUS "kestreld: not built yet (needs kestrel::engine, kestrel::server, kestrel::shm_server, kestrel::http, "
                 "kestrel::ops)")
  return()
endif()

add_executable(kestreld ${CMAKE_CURRENT_LIST_DIR}/main.cpp)
target_link_libraries(kestreld PRIVATE kestrel::ops kestrel::engine kestrel::server kestrel::shm_server
                                       kestrel::http kestrel_mkmodel spdlog::spdlog)
target_compile_definitions(kestreld PRIVATE KESTREL_VERSION="${PROJECT_VERSION}")

# Install locations. Relative folders are under the install prefix, which is known only when `cmake --install` runs
# (`--prefix X` or DESTDIR), so everything prefix-dependent — the unit's ExecStart, the configuration folder — is
# worked out then, in install(CODE). The configuration lives in /etc for the usual prefixes (/usr, /usr/local) so that
# the unit, tmpfiles.d and the docs agree; any other prefix (a staging tree) keeps it in <prefix>/etc.
set(KESTREL_SYSCONFDIR "" CACHE STRING
    "Folder that holds kestrel/kestreld.toml; empty: /etc for the prefixes /usr and /usr/local, <prefix>/etc otherwise")
set(KESTREL_SYSTEMD_UNITDIR "lib/systemd/system" CACHE STRING "systemd system unit folder (relative: under the prefix)")
set(KESTREL_SYSUSERSDIR "lib/sysusers.d" CACHE STRING "sysusers.d folder (relative: under the prefix)")
set(KESTREL_TMPFILESDIR "lib/tmpfiles.d" CACHE STRING "tmpfiles.d folder (relative: under the prefix)")
# Build folders configured when these defaults were absolute paths fixed at configure time still hold those values,
# which `cmake --install --prefix X` would ignore: they go back to the prefix-relative defaults.
foreach(old_default IN ITEMS "KESTREL_SYSTEMD_UNITDIR=lib/systemd/system" "KESTREL_SYSUSERSDIR=lib/sysusers.d"
                             "KESTREL_TMPFILESDIR=lib/tmpfiles.d")
  string(REPLACE "=" ";" pair "${old_default}")
  list(GET pair 0 var)
  list(GET pair 1 dir)
  if("${${var}}" STREQUAL "${CMAKE_INSTALL_PREFIX}/${dir}")
    set(${var} "${dir}" CACHE STRING "" FORCE)
  endif()
endforeach()
if(KESTREL_SYSCONFDIR STREQUAL "/etc" OR KESTREL_SYSCONFDIR STREQUAL "${CMAKE_INSTALL_FULL_SYSCONFDIR}")
  set(KESTREL_SYSCONFDIR "" CACHE STRING "" FORCE)
endif()

install(TARGETS kestreld RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/systemd/kestrel.sysusers.conf DESTINATION ${KESTREL_SYSUSERSDIR}
        RENAME kestrel.conf)
install(FILES ${PROJECT_SOURCE_DIR}/systemd/kestrel.tmpfiles.conf DESTINATION ${KESTREL_TMPFILESDIR}
        RENAME kestrel.conf)
install(FILES ${PROJECT_SOURCE_DIR}/systemd/kestreld.toml.example DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${PROJECT_SOURCE_DIR}/docs/operations.md ${PROJECT_SOURCE_DIR}/docs/http.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)
# At install time: the folders under the prefix in force, the unit made from its template with them, and the live
# configuration (the example, never over a file the administrator already has; DESTDIR honoured).
install(CODE "
  function(kestrel_under_prefix out dir)
    if(IS_ABSOLUTE \"\${dir}\")
      set(\${out} \"\${dir}\" PARENT_SCOPE)
    else()
      set(\${out} \"\${CMAKE_INSTALL_PREFIX}/\${dir}\" PARENT_SCOPE)
    endif()
  endfunction()
  set(KESTREL_INSTALL_FULL_SYSCONFDIR \"${KESTREL_SYSCONFDIR}\")
  if(KESTREL_INSTALL_FULL_SYSCONFDIR STREQUAL \"\")
    if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\" OR CMAKE_INSTALL_PREFIX STREQUAL \"/usr/local\")
      set(KESTREL_INSTALL_FULL_SYSCONFDIR /etc)
    else()
      set(KESTREL_INSTALL_FULL_SYSCONFDIR \"\${CMAKE_INSTALL_PREFIX}/etc\")
    endif()
  endif()
  kestrel_under_prefix(KESTREL_INSTALL_FULL_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  kestrel_under_prefix(KESTREL_DOC_DIR \"${CMAKE_INSTALL_DOCDIR}\")
  kestrel_under_prefix(KESTREL_INSTALL_FULL_UNITDIR \"${KESTREL_SYSTEMD_UNITDIR}\")
  configure_file(\"${PROJECT_SOURCE_DIR}/systemd/kestreld.service.in\"
                 \"${PROJECT_BINARY_DIR}/systemd/kestreld.service\" @ONLY)
  file(INSTALL DESTINATION \"\${KESTREL_INSTALL_FULL_UNITDIR}\" TYPE FILE
       FILES \"${PROJECT_BINARY_DIR}/systemd/kestreld.service\")
  set(_dest \"\$ENV{DESTDIR}\${KESTREL_INSTALL_FULL_SYSCONFDIR}/kestrel/kestreld.toml\")
  if(EXISTS \"\${_dest}\")
    message(STATUS \"Keeping existing: \${_dest}\")
  else()
    file(INSTALL DESTINATION \"\${KESTREL_INSTALL_FULL_SYSCONFDIR}/kestrel\" TYPE FILE
         FILES \"${PROJECT_SOURCE_DIR}/systemd/kestreld.toml.example\" RENAME kestreld.toml)
  endif()
")
