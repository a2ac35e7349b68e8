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

# Install locations. The configuration lives in /etc for the usual prefixes (/usr, /usr/local) so that the unit,
# tmpfiles.d and the docs agree; other prefixes (a staging tree) keep it under the prefix.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr" OR CMAKE_INSTALL_PREFIX STREQUAL "/usr/local")
  set(_kestrel_sysconfdir_default "/etc")
else()
  set(_kestrel_sysconfdir_default "${CMAKE_INSTALL_FULL_SYSCONFDIR}")
endif()
set(KESTREL_SYSCONFDIR "${_kestrel_sysconfdir_default}" CACHE PATH "Folder that holds kestrel/kestreld.toml")
set(KESTREL_SYSTEMD_UNITDIR "${CMAKE_INSTALL_PREFIX}/lib/systemd/system" CACHE PATH "systemd system unit folder")
set(KESTREL_SYSUSERSDIR "${CMAKE_INSTALL_PREFIX}/lib/sysusers.d" CACHE PATH "sysusers.d folder")
set(KESTREL_TMPFILESDIR "${CMAKE_INSTALL_PREFIX}/lib/tmpfiles.d" CACHE PATH "tmpfiles.d folder")

set(KESTREL_INSTALL_FULL_BINDIR "${CMAKE_INSTALL_FULL_BINDIR}")
set(KESTREL_INSTALL_FULL_SYSCONFDIR "${KESTREL_SYSCONFDIR}")
set(KESTREL_DOC_DIR "${CMAKE_INSTALL_FULL_DOCDIR}")
configure_file(${PROJECT_SOURCE_DIR}/systemd/kestreld.service.in ${PROJECT_BINARY_DIR}/systemd/kestreld.service @ONLY)

install(TARGETS kestreld RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_BINARY_DIR}/systemd/kestreld.service DESTINATION ${KESTREL_SYSTEMD_UNITDIR})
install(FILES ${PROJECT_SOURCE_DIR}/systemd/kestrel.sysusers.conf DESTINATION ${KESTREL_SYSUSERSDIR}
        RENAME kestrel.conf)
install(FILES ${PROJECT_SOURCE_DIR}/systemd/kestrel.tmpfiles.conf DESTINATION ${KESTREL_TMPFILESDIR}
        RENAME kestrel.conf)
install(FILES ${PROJECT_SOURCE_DIR}/systemd/kestreld.toml.example DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${PROJECT_SOURCE_DIR}/docs/operations.md DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)
# The live configuration: the example, but never over a file the administrator already has (DESTDIR honoured).
install(CODE "
  set(_dest \"\$ENV{DESTDIR}${KESTREL_SYSCONFDIR}/kestrel/kestreld.toml\")
  if(EXISTS \"\${_dest}\")
    message(STATUS \"Keeping existing: \${_dest}\")
  else()
    file(INSTALL DESTINATION \"${KESTREL_SYSCONFDIR}/kestrel\" TYPE FILE
         FILES \"${PROJECT_SOURCE_DIR}/systemd/kestreld.toml.example\" RENAME kestreld.toml)
  endif()
")
